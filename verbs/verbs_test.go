package verbs

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestMemoryRegionLifecycle(t *testing.T) {
	pd := NewProtectionDomain()
	buf := make([]byte, 100)
	mr, err := pd.RegisterMemory(buf, AccessLocalWrite|AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	local, _ := pd.RegisterMemory(make([]byte, 10), AccessLocalWrite)
	if pd.LiveRemoteRegions() != 1 {
		t.Fatalf("live %d", pd.LiveRemoteRegions())
	}
	s1 := mr.STag()
	if b, err := pd.Resolve(s1, AccessRemoteRead, 10, 90); err != nil || len(b) != 90 || cap(b) != 90 {
		t.Fatalf("resolve: %d %v", len(b), err)
	}
	for _, tc := range []struct {
		stag   uint32
		need   Access
		off, n uint64
		want   error
	}{
		{s1, AccessRemoteWrite, 0, 1, ErrAccess},
		{s1, AccessRemoteRead, 10, 91, ErrBounds},
		{s1, AccessRemoteRead, 101, 0, ErrBounds},
		{s1, AccessRemoteRead, 1 << 63, 1 << 63, ErrBounds},
		{s1 ^ 1, AccessRemoteRead, 0, 1, ErrInvalidSTag},
		{0, AccessRemoteRead, 0, 0, ErrInvalidSTag},
	} {
		if _, err := pd.Resolve(tc.stag, tc.need, tc.off, tc.n); !errors.Is(err, tc.want) {
			t.Errorf("resolve %#x %v [%d,+%d): %v, want %v", tc.stag, tc.need, tc.off, tc.n, err, tc.want)
		}
	}
	if err := pd.InvalidateRemote(local.STag()); !errors.Is(err, ErrAccess) {
		t.Fatalf("remote invalidation of a local-only region: %v", err)
	}
	if err := mr.Invalidate(); err != nil || mr.Valid() || pd.LiveRemoteRegions() != 0 {
		t.Fatalf("invalidate: %v", err)
	}
	if _, err := pd.Resolve(s1, AccessRemoteRead, 0, 1); !errors.Is(err, ErrInvalidSTag) {
		t.Fatalf("invalidated region resolves: %v", err)
	}
	seen := map[uint32]bool{s1: true}
	for range 300 {
		s, err := mr.Reregister(AccessRemoteWrite)
		if err != nil || s>>8 != s1>>8 || pd.LiveRemoteRegions() != 1 {
			t.Fatalf("reregister: %#x %v", s, err)
		}
		if len(seen) < 256 && seen[s] {
			t.Fatalf("key reused early: %#x", s)
		}
		seen[s] = true
	}
	if err := pd.InvalidateRemote(mr.STag()); err != nil || pd.LiveRemoteRegions() != 0 {
		t.Fatalf("remote invalidate: %v", err)
	}
	if err := pd.InvalidateRemote(mr.STag()); !errors.Is(err, ErrInvalidSTag) {
		t.Fatalf("second remote invalidate: %v", err)
	}
	if err := mr.Deregister(); err != nil {
		t.Fatal(err)
	}
	if _, err := mr.Reregister(AccessRemoteRead); !errors.Is(err, ErrClosed) {
		t.Fatalf("reregister after deregister: %v", err)
	}
}

func TestCompletionQueue(t *testing.T) {
	cq := NewCompletionQueue()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 1000
	go func() {
		for i := range n {
			cq.Push(Completion{WRID: uint64(i)})
		}
	}()
	out := make([]Completion, 7)
	next := uint64(0)
	for next < n {
		k, err := cq.Poll(ctx, out)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range out[:k] {
			if c.WRID != next {
				t.Fatalf("got %d want %d", c.WRID, next)
			}
			next++
		}
	}
	short, cancel2 := context.WithCancel(ctx)
	cancel2()
	if _, err := cq.Poll(short, out); !errors.Is(err, context.Canceled) {
		t.Fatalf("poll on empty queue with canceled ctx: %v", err)
	}
	if allocs := testing.AllocsPerRun(100, func() {
		cq.Push(Completion{WRID: 1})
		cq.TryPoll(out)
	}); allocs != 0 {
		t.Fatalf("%v allocations per push+poll", allocs)
	}
}

func TestStrings(t *testing.T) {
	if (AccessLocalWrite|AccessRemoteWrite).String() != "LW|RW" || Access(0).String() != "none" {
		t.Fatal("Access.String")
	}
	if OpRecvWithInvalidate.String() != "RecvWithInvalidate" || Opcode(99).String() != "Opcode(99)" {
		t.Fatal("Opcode.String")
	}
	if StatusFlushed.String() != "Flushed" || Status(99).String() != "Status(99)" {
		t.Fatal("Status.String")
	}
}
