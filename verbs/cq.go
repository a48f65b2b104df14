package verbs

import (
	"context"
	"sync"
)

// SoftCQ is a CompletionQueue in memory, for software providers: Push
// never blocks (the queue grows); Poll blocks until a completion is there.
// Polling does not allocate.
type SoftCQ struct {
	mu     sync.Mutex
	ring   []Completion
	head   int
	n      int
	notify chan struct{} // capacity 1: "something was pushed"
}

var _ CompletionQueue = (*SoftCQ)(nil)

// NewSoftCQ returns an empty software completion queue.
func NewSoftCQ() *SoftCQ {
	return &SoftCQ{ring: make([]Completion, 64), notify: make(chan struct{}, 1)}
}

// Push appends a completion. It is for providers.
func (cq *SoftCQ) Push(c Completion) {
	cq.mu.Lock()
	if cq.n == len(cq.ring) {
		bigger := make([]Completion, 2*len(cq.ring))
		k := copy(bigger, cq.ring[cq.head:])
		copy(bigger[k:], cq.ring[:cq.head])
		cq.ring, cq.head = bigger, 0
	}
	cq.ring[(cq.head+cq.n)%len(cq.ring)] = c
	cq.n++
	cq.mu.Unlock()
	select {
	case cq.notify <- struct{}{}:
	default:
	}
}

// TryPoll moves up to len(out) completions into out without blocking and
// returns how many it moved.
func (cq *SoftCQ) TryPoll(out []Completion) int {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	k := 0
	for k < len(out) && cq.n > 0 {
		out[k] = cq.ring[cq.head]
		cq.head = (cq.head + 1) % len(cq.ring)
		cq.n--
		k++
	}
	if cq.n > 0 {
		// Leave the signal set for other pollers.
		select {
		case cq.notify <- struct{}{}:
		default:
		}
	}
	return k
}

// Poll waits until at least one completion is available (or ctx ends),
// then moves up to len(out) completions into out.
func (cq *SoftCQ) Poll(ctx context.Context, out []Completion) (int, error) {
	if len(out) == 0 {
		return 0, nil
	}
	for {
		if k := cq.TryPoll(out); k > 0 {
			return k, nil
		}
		select {
		case <-cq.notify:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// Len returns the number of completions waiting.
func (cq *SoftCQ) Len() int {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.n
}
