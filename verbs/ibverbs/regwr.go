//go:build cgo && linux && !noibverbs

package ibverbs

import (
	"context"
	"fmt"

	"github.com/rdmafs/rdmafs/verbs"
)

// Registration work requests (verbs.OpFastRegister, OpBindWindow,
// OpLocalInvalidate) are emulated with the provider's synchronous
// registration, carried out when they are posted: a fast-register
// re-registers the region on the device (ibv_reg_mr of exactly its
// bytes), or, in a domain of memory windows, prepares the window's bind
// and posts it on this queue pair ahead of anything posted after it (the
// device's send queue order then puts it in effect before a later Send
// goes out). A local invalidation invalidates the key at once and
// completes once the provider's accesses in progress ended (a window's
// local invalidation work request completed).
//
// Their completions go to the send CQ when they are done, not in send
// queue order with the device's own: a consumer that needs a
// registration's completion before another's waits for it by its WRID.
// Posting IBV_WR_REG_MR / IBV_WR_LOCAL_INV / IBV_WR_BIND_MW where the
// device has them is left to do.
func (q *queuePair) postRegistration(wr verbs.SendWR) error {
	if err := verbs.CheckRegistration(&wr, q.pd); err != nil {
		return fmt.Errorf("ibverbs: post: %w", err)
	}
	b := wr.Binding
	c := verbs.Completion{WRID: wr.WRID, Opcode: wr.Opcode}
	if q.Err() != nil {
		c.Status = verbs.StatusFlushed
		q.sendCQ.Push(c)
		return nil
	}
	if wr.Opcode == verbs.OpLocalInvalidate {
		if err := link.InvalidateNow(b.MR); err != nil {
			return fmt.Errorf("ibverbs: post %v: %w", wr.Opcode, err)
		}
		go q.completeAfter(c, func(ctx context.Context) error { return link.Quiesce(ctx, b.MR) })
		return nil
	}
	if _, err := b.MR.FastRegister(b.Target, b.Offset, b.Length, b.Access); err != nil {
		return fmt.Errorf("ibverbs: post %v: %w", wr.Opcode, err)
	}
	if q.h.window(b.MR) == nil {
		q.sendCQ.Push(c) // registered on the device by FastRegister
		return nil
	}
	done, err := q.postBinds([]*verbs.MemoryRegion{b.MR})
	if err != nil {
		return fmt.Errorf("ibverbs: post %v: %w", wr.Opcode, err)
	}
	go q.completeAfter(c, func(ctx context.Context) error { return waitBinds(ctx, done) })
	return nil
}

// completeAfter pushes c to the send CQ once wait returned, flushed if it
// failed; the queue pair breaking ends the wait.
func (q *queuePair) completeAfter(c verbs.Completion, wait func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-q.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := wait(ctx); err != nil {
		c.Status = verbs.StatusFlushed
	}
	q.sendCQ.Push(c)
}
