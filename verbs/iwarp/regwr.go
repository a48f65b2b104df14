package iwarp

import (
	"context"
	"fmt"

	"github.com/rdmafs/rdmafs/verbs"
)

// Registration work requests (verbs.OpFastRegister, OpBindWindow,
// OpLocalInvalidate) are carried out in the software STag table when they
// are posted: everything posted after one is transmitted after it took
// effect, and a Send's gather list was resolved when it was posted, so an
// invalidation cannot take memory from a Send posted before it (RFC 5040
// s5.1: an STag is usable from its registration until its invalidation).
// This provider has no memory windows: a bind is a fast registration.
//
// Their completions keep the send queue's order: each waits in regs until
// every work request posted before it completed, and holds back those
// posted after it until it completes itself (a local invalidation waits
// for the table's accesses in progress).

// pendingReg is the completion of a registration work request, due once
// every send queue entry before seq completed and the request is ready.
type pendingReg struct {
	seq   uint64 // the send queue entries before it: sqHeadSeq when it may go
	c     verbs.Completion
	ready bool
}

// postRegistration carries out a registration work request and queues
// its completion.
func (q *QP) postRegistration(wr verbs.SendWR) error {
	if err := verbs.CheckRegistration(&wr, q.pd.pd); err != nil {
		return fmt.Errorf("iwarp: post: %w", err)
	}
	b := wr.Binding
	q.mu.Lock()
	broken := q.err != nil
	q.mu.Unlock()
	c := verbs.Completion{WRID: wr.WRID, Opcode: wr.Opcode}
	switch {
	case broken:
		c.Status = verbs.StatusFlushed
	case wr.Opcode == verbs.OpLocalInvalidate:
		if err := link.InvalidateNow(b.MR); err != nil {
			return fmt.Errorf("iwarp: post %v: %w", wr.Opcode, err)
		}
		// The key is invalid now; the completion waits for the
		// accesses in progress (RFC 8166 s8.1).
		i := q.queueReg(c, false)
		go q.quiesceReg(b.MR, i)
		return nil
	default: // OpFastRegister, OpBindWindow
		if _, err := b.MR.FastRegister(b.Target, b.Offset, b.Length, b.Access); err != nil {
			return fmt.Errorf("iwarp: post %v: %w", wr.Opcode, err)
		}
	}
	q.queueReg(c, true)
	return nil
}

// queueReg queues a registration's completion behind the send queue
// entries posted so far and returns its sequence (its place among the
// registrations ever queued).
func (q *QP) queueReg(c verbs.Completion, ready bool) uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	id := q.regNext
	q.regNext++
	q.regs = append(q.regs, pendingReg{seq: q.sqHeadSeq + uint64(q.sq.len()), c: c, ready: ready})
	q.releaseLocked()
	return id
}

// quiesceReg waits for the accesses in progress to mr, ended by the
// queue pair breaking at the latest, then completes registration id.
func (q *QP) quiesceReg(mr *verbs.MemoryRegion, id uint64) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-q.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := link.Quiesce(ctx, mr)
	q.mu.Lock()
	defer q.mu.Unlock()
	r := &q.regs[id-q.regHead]
	r.ready = true
	if err != nil {
		r.c.Status = verbs.StatusFlushed
	}
	q.releaseLocked()
}

// releaseRegLocked delivers the registration completion at the head of
// regs if it is due (released); blocked reports one that is due but not
// ready, which holds back the send queue entries posted after it.
func (q *QP) releaseRegLocked() (released, blocked bool) {
	if len(q.regs) == 0 || q.regs[0].seq != q.sqHeadSeq {
		return false, false
	}
	if !q.regs[0].ready {
		return false, true
	}
	q.scq.Push(q.regs[0].c)
	q.regs[0] = pendingReg{}
	q.regs = q.regs[1:]
	q.regHead++
	return true, false
}
