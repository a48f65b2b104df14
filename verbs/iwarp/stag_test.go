package iwarp

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rdmafs/rdmafs/verbs"
)

func TestMemoryRegionLifecycle(t *testing.T) {
	pd := NewProtectionDomain()
	buf := make([]byte, 100)
	mr, err := pd.RegisterMemory(buf, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	local, _ := pd.RegisterMemory(make([]byte, 10), verbs.AccessLocalWrite)
	if pd.LiveRemoteRegions() != 1 {
		t.Fatalf("live %d", pd.LiveRemoteRegions())
	}
	s1 := mr.STag()
	if b, err := TableOf(pd).Resolve(s1, verbs.AccessRemoteRead, 10, 90); err != nil || len(b) != 90 || cap(b) != 90 {
		t.Fatalf("resolve: %d %v", len(b), err)
	}
	for _, tc := range []struct {
		stag   uint32
		need   verbs.Access
		off, n uint64
		want   error
	}{
		{s1, verbs.AccessRemoteWrite, 0, 1, verbs.ErrAccess},
		{s1, verbs.AccessRemoteRead, 10, 91, verbs.ErrBounds},
		{s1, verbs.AccessRemoteRead, 101, 0, verbs.ErrBounds},
		{s1, verbs.AccessRemoteRead, 1 << 63, 1 << 63, verbs.ErrBounds},
		{s1 ^ 1, verbs.AccessRemoteRead, 0, 1, verbs.ErrInvalidSTag},
		{0, verbs.AccessRemoteRead, 0, 0, verbs.ErrInvalidSTag},
	} {
		if _, err := TableOf(pd).Resolve(tc.stag, tc.need, tc.off, tc.n); !errors.Is(err, tc.want) {
			t.Errorf("resolve %#x %v [%d,+%d): %v, want %v", tc.stag, tc.need, tc.off, tc.n, err, tc.want)
		}
	}
	if err := link.InvalidateRemote(pd, local.STag()); !errors.Is(err, verbs.ErrAccess) {
		t.Fatalf("remote invalidation of a local-only region: %v", err)
	}
	if err := mr.Invalidate(); err != nil || mr.Valid() || pd.LiveRemoteRegions() != 0 {
		t.Fatalf("invalidate: %v", err)
	}
	if _, err := TableOf(pd).Resolve(s1, verbs.AccessRemoteRead, 0, 1); !errors.Is(err, verbs.ErrInvalidSTag) {
		t.Fatalf("invalidated region resolves: %v", err)
	}
	// Every registration gets an STag never seen before: the key turns
	// over 255 times on the index, then the region moves to a fresh
	// index (RFC 8166 s8.1.2), and an old STag stays dead.
	seen := map[uint32]bool{s1: true}
	for i := range 600 {
		s, err := mr.Reregister(verbs.AccessRemoteWrite)
		if err != nil || pd.LiveRemoteRegions() != 1 {
			t.Fatalf("reregister: %#x %v", s, err)
		}
		if seen[s] {
			t.Fatalf("registration %d reused STag %#x", i, s)
		}
		if (s>>8 == s1>>8) != (i < 255) {
			t.Fatalf("registration %d: STag %#x, first %#x: the index must change once its keys are used up", i, s, s1)
		}
		seen[s] = true
		if _, err := TableOf(pd).Resolve(s1, verbs.AccessRemoteWrite, 0, 1); !errors.Is(err, verbs.ErrInvalidSTag) {
			t.Fatalf("first STag %#x resolves after registration %d (%#x): %v", s1, i, s, err)
		}
	}
	if n := len(TableOf(pd).regions); n != 2 {
		t.Fatalf("%d indexes in use for 2 regions", n)
	}
	if err := link.InvalidateRemote(pd, mr.STag()); err != nil || pd.LiveRemoteRegions() != 0 {
		t.Fatalf("remote invalidate: %v", err)
	}
	if err := link.InvalidateRemote(pd, mr.STag()); !errors.Is(err, verbs.ErrInvalidSTag) {
		t.Fatalf("second remote invalidate: %v", err)
	}
	if err := mr.Deregister(); err != nil {
		t.Fatal(err)
	}
	if _, err := mr.Reregister(verbs.AccessRemoteRead); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("reregister after deregister: %v", err)
	}
}

// TestFastRegisterWindow: a fast-registration region exposes exactly the
// bytes FastRegister bound it to (RFC 8166 s8.1 relies on it), each
// binding gets a new STag that a stale one never matches, a bound region
// is not bound again before it is invalidated, and the region names no
// local memory for work requests.
func TestFastRegisterWindow(t *testing.T) {
	pd := NewProtectionDomain()
	parent, err := pd.RegisterMemory(make([]byte, 1000), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	fr, err := pd.AllocFastReg()
	if err != nil {
		t.Fatal(err)
	}
	unbound := fr.STag()
	if fr.Valid() || fr.Len() != 0 || pd.LiveRemoteRegions() != 0 {
		t.Fatalf("new fast-registration region: valid %v, %d bytes, %d live", fr.Valid(), fr.Len(), pd.LiveRemoteRegions())
	}
	if _, err := TableOf(pd).Resolve(unbound, 0, 0, 0); !errors.Is(err, verbs.ErrInvalidSTag) {
		t.Fatalf("unbound region resolves: %v", err)
	}
	const off, n = 100, 200
	rw := verbs.AccessRemoteRead | verbs.AccessRemoteWrite
	s1, err := fr.FastRegister(parent, off, n, rw)
	if err != nil {
		t.Fatal(err)
	}
	if s1 == unbound || s1>>8 != unbound>>8 || s1 != fr.STag() || !fr.Valid() || fr.Len() != n || fr.Offset() != off || pd.LiveRemoteRegions() != 1 {
		t.Fatalf("bound: STag %#x (unbound %#x), valid %v, %d bytes at %d, %d live", s1, unbound, fr.Valid(), fr.Len(), fr.Offset(), pd.LiveRemoteRegions())
	}
	// The window is the parent's memory, capacity included.
	b, err := TableOf(pd).Resolve(s1, verbs.AccessRemoteWrite, 0, n)
	if err != nil || len(b) != n || cap(b) != n {
		t.Fatalf("resolve the whole window: %d/%d bytes, %v", len(b), cap(b), err)
	}
	b[0], b[n-1] = 1, 2
	if p := parent.Bytes(); p[off-1] != 0 || p[off] != 1 || p[off+n-1] != 2 || p[off+n] != 0 {
		t.Fatalf("window does not map [%d, %d) of the parent: %v", off, off+n, p[off-1:off+n+1])
	}
	// One byte before or after the window is out of bounds, for Resolve
	// and for a provider's Begin alike; the parent's bytes around the
	// window are not reachable through the window's STag.
	for _, tc := range []struct{ off, n uint64 }{
		{0, n + 1},               // one byte past the end
		{n, 1},                   // the byte after the window
		{n - 1, 2},               // the last byte and the one after
		{1<<64 - 1, 1},           // the byte before the window (offset -1)
		{1<<64 - 1, 2},           // it and the first byte
		{n + 1, 0},               // an empty access beyond the end
		{1 << 63, 1<<63 + n - 1}, // wraps around
	} {
		if _, err := TableOf(pd).Resolve(s1, verbs.AccessRemoteWrite, tc.off, tc.n); !errors.Is(err, verbs.ErrBounds) {
			t.Errorf("resolve [%d,+%d): %v, want verbs.ErrBounds", tc.off, tc.n, err)
		}
		if _, mr, err := TableOf(pd).Begin(s1, verbs.AccessRemoteWrite, tc.off, tc.n); !errors.Is(err, verbs.ErrBounds) {
			if mr != nil {
				mr.End()
			}
			t.Errorf("begin [%d,+%d): %v, want verbs.ErrBounds", tc.off, tc.n, err)
		}
	}
	if b, mr, err := TableOf(pd).Begin(s1, verbs.AccessRemoteRead, n-1, 1); err != nil || mr.MR() != fr || len(b) != 1 || b[0] != 2 {
		t.Fatalf("begin the last byte: %v %v", b, err)
	} else {
		mr.End()
	}
	// The binding's rights, not the parent's, apply.
	if _, err := TableOf(pd).Resolve(s1, verbs.AccessLocalWrite, 0, 1); !errors.Is(err, verbs.ErrAccess) {
		t.Fatalf("local write through a remote-only window: %v", err)
	}
	if _, err := TableOf(pd).Resolve(parent.STag(), verbs.AccessRemoteRead, 0, 1); !errors.Is(err, verbs.ErrAccess) {
		t.Fatalf("remote read of the local-only parent: %v", err)
	}
	// A bound region is not bound again (FRWR: invalidate first).
	if _, err := fr.FastRegister(parent, 0, 10, rw); !errors.Is(err, verbs.ErrInvalidWR) {
		t.Fatalf("fast register of a bound region: %v", err)
	}
	if fr.STag() != s1 || !fr.Valid() || fr.Len() != n {
		t.Fatalf("refused rebinding changed the region: %#x %v %d", fr.STag(), fr.Valid(), fr.Len())
	}
	// A fast-registration region is no local key: work requests name
	// the registered region itself.
	for _, tc := range []struct {
		need verbs.Access
		off  uint64
		n    uint32
	}{{0, 0, 1}, {verbs.AccessLocalWrite, 0, 1}, {0, 0, 0}} {
		if _, err := link.Local(fr, tc.need, tc.off, tc.n); !errors.Is(err, verbs.ErrInvalidSTag) {
			t.Errorf("local SGE %v [%d,+%d) of a fast-registration region: %v", tc.need, tc.off, tc.n, err)
		}
	}
	if b, err := link.Local(parent, verbs.AccessLocalWrite, off, n); err != nil || len(b) != n || b[0] != 1 {
		t.Fatalf("local SGE of the parent: %v", err)
	}
	// Invalidate, then bind again: the stale STag stays dead.
	if err := fr.Invalidate(); err != nil || fr.Valid() || pd.LiveRemoteRegions() != 0 {
		t.Fatalf("invalidate: %v", err)
	}
	if _, err := TableOf(pd).Resolve(s1, verbs.AccessRemoteRead, 0, 1); !errors.Is(err, verbs.ErrInvalidSTag) {
		t.Fatalf("invalidated window resolves: %v", err)
	}
	if _, err := link.Local(fr, 0, 0, 1); !errors.Is(err, verbs.ErrInvalidSTag) {
		t.Fatalf("local SGE of an invalidated fast-registration region: %v", err)
	}
	s2, err := fr.FastRegister(parent, 0, 50, verbs.AccessRemoteRead)
	if err != nil || s2 == s1 || s2>>8 != s1>>8 || fr.Offset() != 0 || fr.Len() != 50 {
		t.Fatalf("rebind: %#x -> %#x, %v", s1, s2, err)
	}
	for _, need := range []verbs.Access{verbs.AccessRemoteRead, verbs.AccessRemoteWrite, 0} {
		if _, err := TableOf(pd).Resolve(s1, need, 0, 1); !errors.Is(err, verbs.ErrInvalidSTag) {
			t.Fatalf("stale STag %#x resolves after rebinding as %#x: %v", s1, s2, err)
		}
		if _, mr, err := TableOf(pd).Begin(s1, need, 0, 1); !errors.Is(err, verbs.ErrInvalidSTag) {
			if mr != nil {
				mr.End()
			}
			t.Fatalf("stale STag %#x begins after rebinding: %v", s1, err)
		}
	}
	if _, err := TableOf(pd).Resolve(s2, verbs.AccessRemoteRead, 0, 50); err != nil {
		t.Fatal(err)
	}
	if _, err := TableOf(pd).Resolve(s2, verbs.AccessRemoteRead, 50, 1); !errors.Is(err, verbs.ErrBounds) {
		t.Fatalf("rebound window leaks the old window's bytes: %v", err)
	}
	if _, err := TableOf(pd).Resolve(s2, verbs.AccessRemoteWrite, 0, 1); !errors.Is(err, verbs.ErrAccess) {
		t.Fatalf("rebound window keeps the old rights: %v", err)
	}
	// Remote invalidation (Send With Invalidate) unbinds it as well, and
	// no later binding reuses an STag, even once the index's 256 keys
	// are used up (RFC 8166 s8.1.2).
	if err := link.InvalidateRemote(pd, s2); err != nil || fr.Valid() {
		t.Fatalf("remote invalidate: %v", err)
	}
	seen := map[uint32]bool{s1: true, s2: true}
	for i := range 600 {
		s, err := fr.FastRegister(parent, uint64(i), 1, verbs.AccessRemoteWrite)
		if err != nil || seen[s] {
			t.Fatalf("binding %d: %#x (seen %v), %v", i, s, seen[s], err)
		}
		seen[s] = true
		if err := fr.Invalidate(); err != nil {
			t.Fatal(err)
		}
	}
	// Bad bindings.
	other, _ := NewProtectionDomain().RegisterMemory(make([]byte, 10), verbs.AccessLocalWrite)
	fr2, _ := pd.AllocFastReg()
	for _, tc := range []struct {
		name   string
		mr     *verbs.MemoryRegion
		target *verbs.MemoryRegion
		off    uint64
		n      int
		want   error
	}{
		{"empty", fr, parent, 0, 0, verbs.ErrBounds},
		{"negative", fr, parent, 0, -1, verbs.ErrBounds},
		{"past the end", fr, parent, 1, 1000, verbs.ErrBounds},
		{"offset past the end", fr, parent, 1001, 1, verbs.ErrBounds},
		{"huge offset", fr, parent, 1 << 63, 1, verbs.ErrBounds},
		{"target is a fast-registration region", fr, fr2, 0, 1, verbs.ErrInvalidSTag},
		{"target of another PD", fr, other, 0, 1, verbs.ErrInvalidWR},
		{"nil target", fr, nil, 0, 1, verbs.ErrInvalidWR},
		{"not a fast-registration region", parent, parent, 0, 1, verbs.ErrInvalidWR},
	} {
		if _, err := tc.mr.FastRegister(tc.target, tc.off, tc.n, rw); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if fr.Valid() || pd.LiveRemoteRegions() != 0 {
		t.Fatalf("a refused binding left the region valid")
	}
	if err := fr.Deregister(); err != nil {
		t.Fatal(err)
	}
	if _, err := fr.FastRegister(parent, 0, 1, rw); !errors.Is(err, verbs.ErrInvalidWR) {
		t.Fatalf("fast register after deregister: %v", err)
	}
	dead, _ := pd.RegisterMemory(make([]byte, 10), verbs.AccessLocalWrite)
	dead.Deregister()
	if _, err := fr2.FastRegister(dead, 0, 1, rw); !errors.Is(err, verbs.ErrInvalidSTag) {
		t.Fatalf("fast register onto a deregistered region: %v", err)
	}
}

// TestInvalidateWaitsForAccess: Invalidate does not return while a
// provider access (Begin .. End) is in progress, so nothing is placed
// after it returns; with a bounded context it gives up with the region
// already invalid. testing/synctest detects that Invalidate is blocked
// (no sleeps).
func TestInvalidateWaitsForAccess(t *testing.T) {
	for _, fast := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			pd := NewProtectionDomain()
			mr, err := pd.RegisterMemory(make([]byte, 64), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			target := mr
			if fast {
				if mr, err = pd.AllocFastReg(); err != nil {
					t.Fatal(err)
				}
				if _, err := mr.FastRegister(target, 8, 32, verbs.AccessRemoteWrite); err != nil {
					t.Fatal(err)
				}
			}
			stag, live := mr.STag(), pd.LiveRemoteRegions()
			b, acc, err := TableOf(pd).Begin(stag, verbs.AccessRemoteWrite, 4, 16)
			if err != nil || acc.MR() != mr || len(b) != 16 {
				t.Fatalf("begin: %v", err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
			err = mr.InvalidateContext(ctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("invalidate during an access: %v, want context.DeadlineExceeded", err)
			}
			// Already invalid: no new access starts.
			if mr.Valid() || pd.LiveRemoteRegions() != live-1 {
				t.Fatalf("region valid %v, %d live remote regions (%d before) after a timed-out invalidation", mr.Valid(), pd.LiveRemoteRegions(), live)
			}
			if _, _, err := TableOf(pd).Begin(stag, verbs.AccessRemoteWrite, 0, 1); !errors.Is(err, verbs.ErrInvalidSTag) {
				t.Fatalf("begin after invalidation: %v", err)
			}
			if fast {
				// Not rebound while the old binding is in use.
				if _, err := mr.FastRegister(target, 0, 8, verbs.AccessRemoteWrite); !errors.Is(err, verbs.ErrInvalidWR) {
					t.Fatalf("fast register during an access: %v", err)
				}
			}
			// A blocking Invalidate waits for End.
			done := make(chan error, 1)
			go func() { done <- mr.Invalidate() }()
			synctest.Wait() // Invalidate is durably blocked, or done
			select {
			case err := <-done:
				t.Fatalf("Invalidate returned %v while an access was in progress", err)
			default:
			}
			b[0] = 1 // the access may still write
			acc.End()
			if err := <-done; err != nil {
				t.Fatalf("invalidate after End: %v", err)
			}
			if err := mr.Invalidate(); err != nil {
				t.Fatalf("invalidate when idle: %v", err)
			}
			// Deregister waits the same way.
			if fast {
				s, err := mr.FastRegister(target, 0, 8, verbs.AccessRemoteWrite)
				if err != nil {
					t.Fatal(err)
				}
				stag = s
			} else if stag, err = mr.Reregister(verbs.AccessRemoteWrite); err != nil {
				t.Fatal(err)
			}
			_, acc, err = TableOf(pd).Begin(stag, verbs.AccessRemoteWrite, 0, 1)
			if err != nil {
				t.Fatal(err)
			}
			go func() { done <- mr.Deregister() }()
			synctest.Wait()
			select {
			case err := <-done:
				t.Fatalf("Deregister returned %v while an access was in progress", err)
			default:
			}
			acc.End()
			if err := <-done; err != nil {
				t.Fatalf("deregister after End: %v", err)
			}
		})
	}
}

// abortCounter is an Aborter that counts its calls (under the table's
// lock, where AbortAccess runs).
type abortCounter struct{ n int }

func (a *abortCounter) AbortAccess() { a.n++ }

// TestInvalidateAbortsAccess: invalidating a region (locally, remotely,
// by reregistering or deregistering it) stops the stoppable accesses in
// progress at once, and only those still in progress; a local
// invalidation then waits for them to end. testing/synctest detects that
// the invalidation is blocked (no sleeps).
func TestInvalidateAbortsAccess(t *testing.T) {
	for _, how := range []string{"invalidate", "remote", "reregister", "deregister"} {
		synctest.Test(t, func(t *testing.T) {
			pd := NewProtectionDomain()
			mr, err := pd.RegisterMemory(make([]byte, 64), verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
			if err != nil {
				t.Fatal(err)
			}
			var a, b, ended abortCounter
			var reg *Region
			for i, x := range []*abortCounter{&a, &b, &ended} {
				_, acc, err := TableOf(pd).BeginAccess(mr.STag(), verbs.AccessRemoteRead, uint64(8*i), 8, x)
				if err != nil || acc.MR() != mr {
					t.Fatal(err)
				}
				reg = acc
			}
			reg.EndAccess(&ended, 0, 0) // it ends before the invalidation
			done := make(chan error, 1)
			switch how {
			case "invalidate":
				go func() { done <- mr.Invalidate() }()
			case "remote":
				// A Send With Invalidate does not wait (RFC 5040
				// s5.3); the upper layer's own Invalidate does.
				done <- link.InvalidateRemote(pd, mr.STag())
			case "reregister":
				go func() { _, err := mr.Reregister(verbs.AccessRemoteRead); done <- err }()
			case "deregister":
				go func() { done <- mr.Deregister() }()
			}
			synctest.Wait()
			TableOf(pd).mu.Lock()
			na, nb, ne := a.n, b.n, ended.n
			TableOf(pd).mu.Unlock()
			if na != 1 || nb != 1 || ne != 0 {
				t.Fatalf("%s: aborts of the accesses in progress %d and %d, of the ended one %d; want 1, 1, 0", how, na, nb, ne)
			}
			if how != "remote" {
				select {
				case err := <-done:
					t.Fatalf("%s returned %v while accesses were in progress", how, err)
				default:
				}
			}
			reg.EndAccess(&a, 0, 0)
			reg.EndAccess(&b, 0, 0)
			if err := <-done; err != nil {
				t.Fatalf("%s: %v", how, err)
			}
			TableOf(pd).mu.Lock()
			left, busy := len(reg.aborters), reg.busy
			TableOf(pd).mu.Unlock()
			if left != 0 || busy != 0 {
				t.Fatalf("%d aborters, %d accesses left", left, busy)
			}
		})
	}
}

// TestPlaced: a region counts the bytes the peer placed from its start
// without a gap (RFC 8166 s3.4.6: only those are data), per binding; a
// domain with a registration hook (hardware) cannot know.
func TestPlaced(t *testing.T) {
	pd := NewProtectionDomain()
	parent, _ := pd.RegisterMemory(make([]byte, 1000), verbs.AccessLocalWrite)
	fr, _ := pd.AllocFastReg()
	stag, err := fr.FastRegister(parent, 100, 500, verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	place := func(off, n, placed uint64) {
		t.Helper()
		_, mr, err := TableOf(pd).BeginAccess(stag, verbs.AccessRemoteWrite, off, n, nil)
		if err != nil {
			t.Fatal(err)
		}
		mr.EndAccess(nil, off, placed)
	}
	for _, step := range []struct {
		off, n, placed uint64 // one placement: [off, +n), placed bytes of it
		want           uint64
	}{
		{0, 100, 100, 100},
		{200, 100, 100, 100}, // a gap: not counted
		{100, 50, 0, 100},    // a placement that did not complete
		{100, 50, 50, 150},
		{50, 150, 150, 200}, // overlapping
		{0, 10, 10, 200},    // rewriting the start
		{200, 300, 300, 500},
	} {
		place(step.off, step.n, step.placed)
		if got, ok := fr.Placed(); got != step.want || !ok {
			t.Fatalf("after [%d,+%d) placed %d: Placed %d %v, want %d", step.off, step.n, step.placed, got, ok, step.want)
		}
	}
	// It stays readable after the invalidation; a new binding starts
	// from 0.
	if err := fr.Invalidate(); err != nil {
		t.Fatal(err)
	}
	if got, _ := fr.Placed(); got != 500 {
		t.Fatalf("Placed after invalidation: %d", got)
	}
	if stag, err = fr.FastRegister(parent, 0, 10, verbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	if got, _ := fr.Placed(); got != 0 {
		t.Fatalf("Placed of a new binding: %d", got)
	}
	hpd := NewProtectionDomainWithHook(&reuseHook{used: map[uint32]bool{}, of: map[*verbs.MemoryRegion]uint32{}})
	hmr, _ := hpd.RegisterMemory(make([]byte, 10), verbs.AccessRemoteWrite)
	if _, ok := hmr.Placed(); ok {
		t.Fatal("a hardware domain claims to know what was placed")
	}
}

// TestPlaceExcludesInvalidate: Place checks the access like Begin, counts
// what it placed (Placed), and never overlaps an invalidation: a region's
// placements racing with its invalidation (run with -race) either land
// before Invalidate returns or fail with verbs.ErrInvalidSTag, so the region's
// memory, overwritten after Invalidate returns, keeps the new bytes.
func TestPlaceExcludesInvalidate(t *testing.T) {
	pd := NewProtectionDomain()
	buf := make([]byte, 64)
	mr, err := pd.RegisterMemory(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	fill := func(b byte) func([]byte) (uint64, error) {
		return func(dst []byte) (uint64, error) {
			for i := range dst {
				dst[i] = b
			}
			return uint64(len(dst)), nil
		}
	}
	if err := TableOf(pd).Place(mr.STag(), verbs.AccessRemoteRead, 0, 8, fill(1)); !errors.Is(err, verbs.ErrAccess) {
		t.Fatalf("place without the right: %v", err)
	}
	if err := TableOf(pd).Place(mr.STag(), verbs.AccessRemoteWrite, 60, 8, fill(1)); !errors.Is(err, verbs.ErrBounds) {
		t.Fatalf("place out of bounds: %v", err)
	}
	if err := TableOf(pd).Place(mr.STag(), verbs.AccessRemoteWrite, 0, 16, fill(1)); err != nil {
		t.Fatal(err)
	}
	if n, _ := mr.Placed(); n != 16 || buf[15] != 1 || buf[16] != 0 {
		t.Fatalf("placed %d, bytes %v", n, buf[:17])
	}
	// place's error is returned; what it reports placed still counts.
	boom := errors.New("boom")
	if err := TableOf(pd).Place(mr.STag(), verbs.AccessRemoteWrite, 16, 8, func([]byte) (uint64, error) { return 0, boom }); err != boom {
		t.Fatalf("place's error: %v", err)
	}
	if n, _ := mr.Placed(); n != 16 {
		t.Fatalf("placed %d after a failed placement", n)
	}

	stag := mr.STag()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var failed error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := TableOf(pd).Place(stag, verbs.AccessRemoteWrite, 0, 64, fill(2)); err != nil {
				failed = err
				return
			}
		}
	}()
	if err := mr.Deregister(); err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		buf[i] = 3 // races with any placement after Deregister returned
	}
	close(stop)
	wg.Wait()
	if failed != nil && !errors.Is(failed, verbs.ErrInvalidSTag) {
		t.Fatalf("placement after deregistration: %v, want verbs.ErrInvalidSTag", failed)
	}
	for i, b := range buf {
		if b != 3 {
			t.Fatalf("byte %d placed after Deregister returned", i)
		}
	}
}
