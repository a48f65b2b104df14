package rpcrdma

import (
	"context"
	"fmt"
	"time"

	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
)

// Registration work requests on the requester's send queue.
//
// A call's exposures are made and ended with work requests on the
// connection's send queue (verbs.OpFastRegister, OpLocalInvalidate), as
// Linux xprtrdma's frwr_ops.c does:
//
//   - map: frwr_map builds an IB_WR_REG_MR that frwr_send posts ahead of
//     the Send that offers the memory, unsignaled, so the map side never
//     waits: the send queue puts the registration in effect before the
//     Send goes out (verbs.OpFastRegister: posted before a Send, it is in
//     effect when the Send's peer sees the Send), and one that fails
//     shows as an error completion, which breaks the queue pair. Our
//     fast-registers complete like any request (verbs has no unsignaled
//     ones): their completions are reaped and dropped with the Sends'
//     (reapSendsLocked), and an error one fails the connection, so the
//     call fails with it.
//   - unmap: frwr_unmap_sync posts the LOCAL_INVs of a call chained and
//     waits for the last one's completion. Here the call waits for every
//     one of its invalidations' completions, by work request ID: the
//     rdma-core provider completes emulated ones as they finish, not in
//     posting order (verbs/ibverbs/regwr.go). Only a completion says no
//     placement runs any more and the memory may be reused (RFC 8166
//     s8.1).
//
// Registration work request IDs have regWRBit set, apart from the Sends'
// sequence numbers (conn.nextWR).
const regWRBit = 1 << 63

// statusPending is the status of a registration not completed yet.
const statusPending verbs.Status = 0xff

// regWaiter is a caller waiting for the completions of its registration
// work requests (a call's local invalidations). It belongs to the pooled
// req (frwr.inv), so that waiting allocates nothing in the steady state.
type regWaiter struct {
	wrids   []uint64
	status  []verbs.Status // by request; statusPending until it completes
	errs    []error        // by request: its post failed
	pending int
	done    chan struct{} // capacity 1: pending reached 0
}

// regSlot is where a registration work request's completion goes.
type regSlot struct {
	w *regWaiter
	i int
}

// reset readies w for n requests.
func (w *regWaiter) reset(n int) {
	if w.done == nil {
		w.done = make(chan struct{}, 1)
	}
	select {
	case <-w.done: // a token left by an earlier wait
	default:
	}
	clear(w.errs)
	w.wrids, w.status, w.errs, w.pending = w.wrids[:0], w.status[:0], w.errs[:0], 0
	for range n {
		w.wrids = append(w.wrids, 0)
		w.status = append(w.status, statusPending)
		w.errs = append(w.errs, nil)
	}
}

// completeLocked records the completion of request i. Called with c.mu
// held.
func (w *regWaiter) completeLocked(i int, st verbs.Status) {
	if w.status[i] != statusPending {
		return
	}
	w.status[i] = st
	w.pending--
	if w.pending == 0 {
		select {
		case w.done <- struct{}{}:
		default:
		}
	}
}

// completedLocked takes one send queue completion: a Send's buffer goes
// back, a registration's completion goes to its waiter (one nobody waits
// for, a fast-register's, is dropped), and an error completion means the
// queue pair broke. Called with c.mu held.
func (c *conn) completedLocked(w verbs.Completion) {
	if s, ok := c.sends[w.WRID]; ok {
		delete(c.sends, w.WRID)
		c.complete(s)
	} else if slot, ok := c.regs[w.WRID]; ok {
		delete(c.regs, w.WRID)
		slot.w.completeLocked(slot.i, w.Status)
		c.reaperIdleLocked()
	}
	if w.Status != verbs.StatusSuccess && c.err == nil {
		// The queue pair has broken: a fast-register that failed (its
		// call's Send went out after it, or flushed), or any other
		// request. The connection takes no reply from now on, so a
		// call whose memory was not registered fails instead of
		// delivering one; the queue pair is closed by another
		// goroutine (teardown takes mu).
		err := fmt.Errorf("%w: %v completion %v (%v)", oncrpc.ErrConnection, w.Opcode, w.Status, c.qp.Err())
		if pending, first := c.markFailedLocked(err); first {
			go c.teardown(err, pending)
		}
	}
}

// regWRID returns a fresh registration work request ID.
func (c *conn) regWRID() uint64 {
	return regWRBit | c.regWR.Add(1)
}

// postRegistrations posts the registration work requests wr(i) for i in
// [0, n), their completions going to w; a post that fails is w.errs[i]
// (the others are posted all the same). The connection's lock is not
// held while posting: a provider may register on its device then
// (verbs/ibverbs), which the connection's other calls must not wait for.
func (c *conn) postRegistrations(w *regWaiter, n int, wr func(i int, wrid uint64) verbs.SendWR) {
	w.reset(n)
	c.mu.Lock()
	if c.regs == nil {
		c.regs = make(map[uint64]regSlot)
	}
	for i := range n {
		id := c.regWRID()
		w.wrids[i] = id
		c.regs[id] = regSlot{w: w, i: i}
		w.pending++
	}
	c.startReaperLocked()
	c.mu.Unlock()
	for i := range n {
		err := c.qp.PostSend(wr(i, w.wrids[i]))
		if err == nil {
			continue
		}
		w.errs[i] = err
		c.mu.Lock()
		if _, ok := c.regs[w.wrids[i]]; ok {
			delete(c.regs, w.wrids[i])
			w.completeLocked(i, verbs.StatusFatalErr)
			c.reaperIdleLocked()
		}
		c.mu.Unlock()
	}
}

// awaitRegistrations waits up to limit for the completions of w's work
// requests; those that did not come by then are forgotten (their
// completions are dropped when they come) and keep statusPending.
func (c *conn) awaitRegistrations(w *regWaiter, limit time.Duration) {
	c.mu.Lock()
	done := w.pending == 0
	c.mu.Unlock()
	if !done {
		t := time.NewTimer(limit)
		select {
		case <-w.done:
		case <-t.C:
		}
		t.Stop()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, id := range w.wrids {
		if w.status[i] == statusPending {
			delete(c.regs, id)
		}
	}
	c.reaperIdleLocked()
}

// The registration reaper polls the send CQ while a caller waits for a
// registration's completion, and only then: no goroutine waits for Send
// completions otherwise (reapSendsLocked). A waiter never polls itself,
// so it may wait in the provider's receiving goroutine (unmapWritable
// from a receive handler): the completions it waits for do not depend on
// that goroutine (a local invalidation completes once the provider's
// accesses through the region ended and the requests posted before it
// completed; the requester posts only Sends and registrations, which the
// provider completes from its sending side).

// startReaperLocked starts the reaper unless it runs. Called with c.mu
// held.
func (c *conn) startReaperLocked() {
	if c.reaping {
		return
	}
	c.reaping = true
	ctx, cancel := context.WithCancel(context.Background())
	c.reapCancel = cancel
	go c.reapRegistrations(ctx)
}

// reaperIdleLocked stops the reaper's poll once nobody waits. Called with
// c.mu held.
func (c *conn) reaperIdleLocked() {
	if len(c.regs) == 0 && c.reapCancel != nil {
		c.reapCancel()
		c.reapCancel = nil
	}
}

// reapRegistrations polls the send CQ until no registration is waited
// for. It alone uses c.regBuf.
func (c *conn) reapRegistrations(ctx context.Context) {
	cq := c.qp.SendCQ()
	for {
		n, err := cq.Poll(ctx, c.regBuf[:])
		c.mu.Lock()
		for _, w := range c.regBuf[:n] {
			c.completedLocked(w)
		}
		if len(c.regs) == 0 {
			c.reaperIdleLocked()
			c.reaping = false
			c.mu.Unlock()
			return
		}
		if err != nil {
			// Stopped when nobody waited, and a waiter came since.
			ctx, c.reapCancel = context.WithCancel(context.Background())
		}
		c.mu.Unlock()
	}
}
