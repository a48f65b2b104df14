package verbs

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestCompletionQueue(t *testing.T) {
	cq := NewSoftCQ()
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
