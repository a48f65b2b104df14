package iwarp

import (
	"fmt"

	"github.com/rdmafs/rdmafs/verbs"
)

// Receive completions in the receiving goroutine.
//
// A receive completion normally goes into the receive CQ, where a
// consumer's goroutine polls for it: the goroutine reading the socket
// wakes the poller, which wakes whoever waits for the message. With a
// receive handler (SetRecvHandler, verbs.RecvHandlerSetter) the goroutine
// that read the message hands the completion to the handler itself,
// saving one goroutine hand-off (a wake of another OS thread) per message.
//
// Handler calls are serialized: one goroutine at a time delivers, in
// completion order. A completion that comes while another goroutine is
// delivering (a receive posted and flushed from within the handler, or
// the next message while a slow handler runs elsewhere) is queued and
// delivered by that goroutine after the call in progress returns, so a
// handler may post work requests without deadlocking on itself.

// recvDelivery is the state of receive completion delivery, under hmu.
type recvDelivery struct {
	h     func(verbs.Completion)
	queue []verbs.Completion // waiting for the handler, in order
	busy  bool               // a goroutine is delivering queue
}

// SetRecvHandler makes the queue pair call h for each receive completion
// instead of queueing it in its receive CQ; nil goes back to queueing.
// Completions already in the receive CQ are handed to h first, in order,
// in the calling goroutine. The receive CQ must be the queue pair's own
// (ConnParams.RecvCQ nil): a shared one would hold other queue pairs'
// completions.
//
// The contract:
//   - h is called once per receive completion (flushes included), one
//     call at a time, in completion order. It runs in the provider's
//     receiving goroutine after the message is fully placed (and a
//     Send With Invalidate's STag invalidated), with no provider lock
//     held; completions that come during a call are delivered after it
//     by the goroutine making it. The completions found in the receive
//     CQ are delivered in SetRecvHandler's caller; the flush of a
//     receive posted after the queue pair broke in a goroutine of its
//     own, never in the posting one.
//   - h may post sends and receives and invalidate memory: nothing of
//     the queue pair is being placed while it runs, and a completion
//     produced within h is delivered after h returns. h must not call
//     Close (which waits for the receiving goroutine) and must not
//     block for long: no message is read while it runs.
//   - Close waits for the calls the receiving goroutine makes; after
//     SetRecvHandler(nil) returns no call of the old handler starts
//     (one in progress in another goroutine may still finish).
func (q *QP) SetRecvHandler(h func(verbs.Completion)) error {
	if !q.ownRCQ {
		return fmt.Errorf("iwarp: receive handler on a receive CQ shared with other queue pairs: %w", verbs.ErrInvalidWR)
	}
	q.hmu.Lock()
	q.rd.h = h
	if h == nil {
		q.requeueLocked()
		q.hmu.Unlock()
		return nil
	}
	// Under hmu, nothing is pushed meanwhile: every receive completion
	// goes through deliverRecv.
	var buf [16]verbs.Completion
	for {
		n := q.rcq.TryPoll(buf[:])
		if n == 0 {
			break
		}
		q.rd.queue = append(q.rd.queue, buf[:n]...)
	}
	if q.rd.busy || len(q.rd.queue) == 0 {
		q.hmu.Unlock()
		return nil
	}
	q.rd.busy = true
	q.deliverLocked()
	return nil
}

// deliverRecv hands a receive completion to the handler or queues it in
// the receive CQ. It is called with no lock of the queue pair held.
func (q *QP) deliverRecv(c verbs.Completion) {
	q.hmu.Lock()
	q.deliverRecvLocked(c)
}

// deliverRecvLocked is deliverRecv for completions in order, called with
// hmu held; it returns with hmu released. The exiting receive side takes
// hmu before mu to flush the posted receives, so that a receive posted
// after it (and flushed at once) completes after them.
func (q *QP) deliverRecvLocked(cs ...verbs.Completion) {
	if q.rd.h == nil {
		for _, c := range cs {
			q.rcq.Push(c)
		}
		q.hmu.Unlock()
		return
	}
	q.rd.queue = append(q.rd.queue, cs...)
	if q.rd.busy || len(q.rd.queue) == 0 {
		q.hmu.Unlock() // the goroutine delivering takes them
		return
	}
	q.rd.busy = true
	q.deliverLocked()
}

// flushPosted completes a receive posted after the receive side exited.
// A handler is not called in the posting goroutine, which may hold a lock
// the handler takes (a receive handler's own posts queue their flushes:
// rd.busy); a goroutine of its own delivers.
func (q *QP) flushPosted(c verbs.Completion) {
	q.hmu.Lock()
	if q.rd.h == nil || q.rd.busy {
		q.deliverRecvLocked(c)
		return
	}
	q.rd.queue = append(q.rd.queue, c)
	q.rd.busy = true
	q.hmu.Unlock()
	go func() {
		q.hmu.Lock()
		q.deliverLocked()
	}()
}

// deliverLocked calls the handler for the queued completions, without
// hmu held during each call, until none is left; it is called with hmu
// held and rd.busy set, and returns with hmu released.
func (q *QP) deliverLocked() {
	for len(q.rd.queue) > 0 && q.rd.h != nil {
		c, h := q.rd.queue[0], q.rd.h
		n := copy(q.rd.queue, q.rd.queue[1:])
		q.rd.queue = q.rd.queue[:n]
		q.hmu.Unlock()
		h(c)
		q.hmu.Lock()
	}
	q.requeueLocked()
	q.rd.busy = false
	q.hmu.Unlock()
}

// requeueLocked moves completions left undelivered (the handler was
// removed) into the receive CQ, in order.
func (q *QP) requeueLocked() {
	if q.rd.h != nil {
		return
	}
	for _, c := range q.rd.queue {
		q.rcq.Push(c)
	}
	q.rd.queue = q.rd.queue[:0]
}
