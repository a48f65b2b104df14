package iwarp

import (
	"time"
)

// Linux siw (drivers/infiniband/sw/siw/siw_cm.c, siw_accept) sends the MPA
// Reply before it hands the socket's data-ready callback from connection
// management to the queue pair. An FPDU that arrives in between is left
// in the socket unread until the next segment arrives; a lone first Send
// (an RPC call waiting for its reply) then hangs. Seen against knfsd in
// the qemu guest on about a third of connections.
//
// The active side therefore "kicks" a peer that stays silent after our
// first transmission: it sends zero-length RDMA Writes, which carry no
// data and need no valid STag (RFC 6581 s4 uses the same message as a
// ready-to-receive indication; siw does not check STags of zero-length
// Writes), with exponential backoff, until the first inbound FPDU or
// kickAttempts kicks.
const (
	kickFirst    = 20 * time.Millisecond
	kickAttempts = 8
	// kickSTag is what Linux siw puts in its zero-length RTR Write; no
	// region of ours has it (index 0 is never allocated).
	kickSTag = 1
)

// kickLoop runs on the active side from the first transmission on.
func (q *QP) kickLoop() {
	defer q.wg.Done()
	delay := kickFirst
	t := time.NewTimer(delay)
	defer t.Stop()
	for range kickAttempts {
		select {
		case <-q.done:
			return
		case <-t.C:
		}
		if q.rxSeen.Load() {
			return
		}
		var hb [taggedHdrLen]byte
		putTagged(hb[:], true, opWrite, kickSTag, 0)
		if err := q.w.write(hb[:]); err != nil {
			return
		}
		q.kicks.Add(1)
		delay *= 2
		t.Reset(delay)
	}
}
