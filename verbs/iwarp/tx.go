package iwarp

import (
	"fmt"

	"github.com/rdmafs/rdmafs/verbs"
)

// The transmit side. One sender at a time owns it (QP.txBusy): a poster
// that finds the send queue idle transmits its work request itself, from
// its own goroutine, with a non-blocking write; otherwise, and to finish a
// write the socket did not take at once, the tx goroutine transmits the
// queue in batches. Either way work requests go out in posting order.

// txGroup is a run of consecutive send queue entries being transmitted.
type txGroup struct {
	first, end uint64 // sequence numbers [first, end)
}

// directOKLocked reports whether a poster may transmit the entry it just
// pushed itself: nothing ahead of it, nobody transmitting, and for a
// Read an ORD credit.
func (q *QP) directOKLocked(wr *verbs.SendWR) bool {
	return q.w.raw != nil && !q.txBusy && !q.txFlush && q.err == nil &&
		q.sqNextSeq-q.sqHeadSeq == uint64(q.sq.len()-1) &&
		(wr.Opcode != verbs.OpRDMARead || q.reads < q.ord) &&
		fpdus(wr, q.maxULPDU) <= maxBatch
}

// fpdus is how many FPDUs the work request takes.
func fpdus(wr *verbs.SendWR, maxULPDU int) int {
	switch wr.Opcode {
	case verbs.OpRDMARead:
		return 1
	case verbs.OpRDMAWrite:
		return max(1, (int(verbs.SGLLen(wr.SGL))+maxULPDU-taggedHdrLen-1)/(maxULPDU-taggedHdrLen))
	default:
		return max(1, (int(verbs.SGLLen(wr.SGL))+maxULPDU-untaggedHdrLen-1)/(maxULPDU-untaggedHdrLen))
	}
}

// claimLocked marks the next unsent entry as transmitted (its Read
// context queued) and returns it.
func (q *QP) claimLocked() *sqEntry {
	seq := q.sqNextSeq
	e := q.sq.at(int(seq - q.sqHeadSeq))
	if e.wr.Opcode == verbs.OpRDMARead {
		q.reads++
		if r := int32(q.reads); r > q.maxReads.Load() {
			q.maxReads.Store(r)
		}
		q.orq.push(readCtx{seq: seq, sinkSTag: e.wr.SGL[0].MR.STag(), sinkTO: e.wr.SGL[0].Offset, size: e.wr.Length})
	}
	q.sqNextSeq++
	return e
}

// postDirect transmits entry e (sequence number seq), which the caller
// claimed (txBusy), from the posting goroutine; the caller holds the
// writer's lock. What the socket does not take at once is left to the tx
// goroutine, which completes the entry.
func (q *QP) postDirect(e *sqEntry, seq uint64) {
	err := q.w.startLocked()
	if err == nil {
		err = q.transmit(e)
	}
	if err == nil {
		err = q.w.tryFlushLocked()
	}
	rest := q.w.pending()
	// A Read Request that came meanwhile (resp.go, parkRead).
	respKick, respErr := q.endPostingLocked(err == nil)
	q.w.mu.Unlock()
	if err != nil {
		q.txFailed(e.wr.Opcode.String(), err)
	} else {
		q.startKick()
		q.afterRespond(respKick, respErr)
	}
	q.mu.Lock()
	q.txBusy = false
	switch {
	case err != nil:
	case rest:
		q.txFlush, q.txPend = true, txGroup{seq, seq + 1}
		q.handoffs.Add(1)
	default:
		q.completeLocked(txGroup{seq, seq + 1})
	}
	if q.txFlush || q.err != nil || q.sqNextSeq-q.sqHeadSeq != uint64(q.sq.len()) {
		q.cond.Broadcast()
	}
	q.mu.Unlock()
}

// txFailed breaks the queue pair after a failed write of what.
func (q *QP) txFailed(what string, err error) {
	if q.setErr(fmt.Errorf("iwarp: send %s: %w: %w", what, verbs.ErrConnectionLost, err)) {
		_ = q.conn.Close()
	}
}

// startKick starts kickLoop after the first transmission (active side).
// The transmit side's owner calls it.
func (q *QP) startKick() {
	if q.kick && !q.kickStarted {
		q.kickStarted = true
		q.wg.Add(1)
		go q.kickLoop()
	}
}

// completeLocked completes the entries of g that are not Reads (those
// complete when their response is in).
func (q *QP) completeLocked(g txGroup) {
	for seq := max(g.first, q.sqHeadSeq); seq < g.end; seq++ {
		e := q.sq.at(int(seq - q.sqHeadSeq))
		if e.done || e.wr.Opcode == verbs.OpRDMARead {
			continue
		}
		e.done, e.status = true, verbs.StatusSuccess
	}
	q.releaseLocked()
}

// txLoop transmits send queue work requests in posting order, those no
// poster sent itself, in batches of up to maxBatch FPDUs per system call.
func (q *QP) txLoop() {
	defer q.wg.Done()
	for {
		q.mu.Lock()
		for q.txBusy || q.err == nil && !q.txFlush && !q.sendableLocked() {
			q.cond.Wait()
		}
		if q.err != nil {
			q.txExited = true
			q.flushSendLocked()
			q.mu.Unlock()
			return
		}
		q.txBusy = true
		pend := q.txPend
		flush := q.txFlush
		q.txFlush, q.txPend = false, txGroup{}
		// Claim a batch: consecutive entries up to maxBatch FPDUs
		// (at least one entry), Reads within ORD.
		g := txGroup{first: q.sqNextSeq, end: q.sqNextSeq}
		q.txBatch = q.txBatch[:0]
		nf := 0
		for q.sendableLocked() {
			e := q.sq.at(int(q.sqNextSeq - q.sqHeadSeq))
			k := fpdus(&e.wr, q.maxULPDU)
			if len(q.txBatch) > 0 && nf+k > maxBatch {
				break
			}
			nf += k
			q.txBatch = append(q.txBatch, *q.claimLocked())
			g.end++
		}
		q.mu.Unlock()

		var err error
		what := "the rest of a posted work request"
		q.w.mu.Lock()
		if flush {
			// Finish what a poster's write left.
			err = q.w.startLocked()
		}
		if err == nil && len(q.txBatch) > 0 {
			err = q.w.startLocked()
			for i := range q.txBatch {
				if err != nil {
					break
				}
				what = q.txBatch[i].wr.Opcode.String()
				err = q.transmit(&q.txBatch[i])
			}
			if err == nil {
				err = q.w.flushLocked()
			}
		}
		q.w.mu.Unlock()
		if err != nil {
			q.txFailed(what, err)
		} else if g.end > g.first {
			q.startKick()
		}
		clear(q.txBatch) // drop references to the caller's memory
		q.mu.Lock()
		q.txBusy = false
		if err == nil {
			if flush {
				q.completeLocked(pend)
			}
			q.completeLocked(g)
		}
		q.mu.Unlock()
	}
}

// sendableLocked reports whether an entry awaits transmission and may go
// now: RFC 5040 s5.2 / RFC 6581: never more Read Requests outstanding
// than the negotiated ORD.
func (q *QP) sendableLocked() bool {
	if q.sqNextSeq-q.sqHeadSeq == uint64(q.sq.len()) {
		return false
	}
	e := q.sq.at(int(q.sqNextSeq - q.sqHeadSeq))
	return e.wr.Opcode != verbs.OpRDMARead || q.reads < q.ord
}

// sglCursor walks a gather list.
type sglCursor struct {
	sgl [][]byte
	i   int
	off int
}

// take appends to dst the pieces covering the next n bytes.
func (c *sglCursor) take(dst [][]byte, n int) [][]byte {
	for n > 0 && c.i < len(c.sgl) {
		b := c.sgl[c.i][c.off:]
		if len(b) == 0 {
			c.i++
			c.off = 0
			continue
		}
		k := min(n, len(b))
		dst = append(dst, b[:k])
		c.off += k
		n -= k
	}
	return dst
}

// transmit segments one work request into FPDUs (RFC 5041 s5: each DDP
// segment fits one MPA ULPDU) and adds them to the writer's batch, which
// the caller started and writes. The caller owns the transmit side and
// holds the writer's lock.
func (q *QP) transmit(e *sqEntry) error {
	wr := &e.wr
	if wr.Opcode == verbs.OpRDMARead {
		// RFC 5040 s4.4: untagged QN 1, one segment, 28-byte payload.
		hl := putUntagged(q.txHdr[:], true, opReadReq, 0, qnReadReq, q.readMSN, 0)
		q.readMSN++
		rr := readRequest{sinkSTag: wr.SGL[0].MR.STag(), sinkTO: wr.SGL[0].Offset, size: wr.Length,
			srcSTag: wr.RemoteSTag, srcTO: wr.RemoteOffset}
		rr.put(q.txHdr[hl:])
		return q.w.addLocked(q.txHdr[:hl+readReqLen], nil)
	}
	total := int(e.byteLen)
	cur := sglCursor{sgl: e.pieces[:e.npieces]}
	var op byte
	var rsvd, msn uint32
	tagged := wr.Opcode == verbs.OpRDMAWrite
	hl := taggedHdrLen
	if !tagged {
		hl = untaggedHdrLen
		msn = q.sendMSN
		q.sendMSN++
	}
	switch {
	case tagged:
		op = opWrite
	case wr.Opcode == verbs.OpSendWithInvalidate:
		// RFC 5040 s4.3: the STag to invalidate rides in RsvdULP.
		op, rsvd = opSendInv, wr.InvalidateSTag
		if wr.Solicited {
			op = opSendSEInv
		}
	case wr.Solicited:
		op = opSendSE
	default:
		op = opSend
	}
	maxPayload := q.maxULPDU - hl
	off := 0
	for {
		k := min(total-off, maxPayload)
		last := off+k == total
		if tagged {
			putTagged(q.txHdr[:], last, op, wr.RemoteSTag, wr.RemoteOffset+uint64(off))
		} else {
			putUntagged(q.txHdr[:], last, op, rsvd, qnSend, msn, uint32(off))
		}
		q.txPieces = cur.take(q.txPieces[:0], k)
		if err := q.w.addLocked(q.txHdr[:hl], q.txPieces); err != nil {
			return err
		}
		off += k
		if last {
			return nil
		}
	}
}
