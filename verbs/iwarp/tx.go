package iwarp

import (
	"errors"
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
	q.w.mu.Unlock()
	if err != nil {
		q.txFailed(e.wr.Opcode.String(), err)
	} else {
		q.startKick()
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

// respLoop serves inbound RDMA Read Requests with Read Responses.
func (q *QP) respLoop() {
	defer q.wg.Done()
	var f *rxFault // outside the loop: errors.As moves it to the heap
	for {
		select {
		case <-q.done:
			return
		case <-q.respKick:
			q.w.mu.Lock()
			err := q.w.startLocked() // the rest of an inline response
			q.w.mu.Unlock()
			if err != nil {
				q.txFailed("Read Response", err)
				return
			}
		case rr := <-q.irq:
			err := q.serveRead(rr)
			switch {
			case err == nil:
			case errors.As(err, &f):
				q.terminate(f.t, f.cause)
				return
			default:
				if q.setErr(fmt.Errorf("iwarp: send Read Response: %w: %w", verbs.ErrConnectionLost, err)) {
					_ = q.conn.Close()
				}
				return
			}
		}
	}
}

// serveRead sends the Read Response for rr (RFC 5040 s5.2): tagged
// segments to the requester's sink STag.
func (q *QP) serveRead(rr readRequest) error {
	// A zero-length Read names no memory and is not checked (Linux siw
	// sends one with a dummy STag as ready-to-receive in peer-to-peer
	// mode).
	if rr.size == 0 {
		q.irqCount.Add(-1)
		var hb [taggedHdrLen]byte
		putTagged(hb[:], true, opReadResp, rr.sinkSTag, rr.sinkTO)
		return q.w.write(hb[:])
	}
	// The region stays busy until the response is out: an invalidation
	// waits for it, and stops it if the peer does not take it
	// (stopper), so nothing is read after the invalidation returns
	// (RFC 8166 s8.1.3).
	q.respStop.prepare()
	src, mr, err := q.pd.BeginAccess(rr.srcSTag, verbs.AccessRemoteRead, rr.srcTO, uint64(rr.size), &q.respStop)
	if err != nil {
		q.irqCount.Add(-1)
		code := byte(RDMAPCodeInvalidSTag)
		switch {
		case errors.Is(err, verbs.ErrBounds):
			code = RDMAPCodeBaseBounds
		case errors.Is(err, verbs.ErrAccess):
			code = RDMAPCodeAccessRights
		}
		return readFault(rr, code, fmt.Errorf("inbound RDMA Read: %w", err))
	}
	defer mr.EndAccess(&q.respStop, 0, 0)
	if q.onServe != nil {
		q.onServe()
	}
	var hb [taggedHdrLen]byte
	var piece [1][]byte
	maxPayload := q.maxULPDU - taggedHdrLen
	off := 0
	for {
		q.w.mu.Lock()
		// What a poster's write left goes first, outside the
		// access: a stop must only interrupt this response.
		if err := q.w.startLocked(); err != nil {
			q.w.mu.Unlock()
			return err
		}
		if !q.respStop.ioStart() {
			q.w.mu.Unlock()
			// Between two batches: the stream is intact, so the
			// peer learns why its read ends (RFC 5040 s7).
			return readFault(rr, RDMAPCodeInvalidSTag, fmt.Errorf("inbound RDMA Read: STag %#08x invalidated during the response: %w", rr.srcSTag, verbs.ErrInvalidSTag))
		}
		// Up to respBatchBytes per system call, so that Sends
		// interleave with a long response.
		last := false
		for range respSegs(maxPayload) {
			k := min(len(src)-off, maxPayload)
			last = off+k == len(src)
			if last {
				// Free the IRD slot before the peer can see the
				// end of the response and issue its next request.
				q.irqCount.Add(-1)
			}
			putTagged(hb[:], last, opReadResp, rr.sinkSTag, rr.sinkTO+uint64(off))
			piece[0] = src[off : off+k]
			_ = q.w.addLocked(hb[:], piece[:]) // the batch is not full: no write
			off += k
			if last {
				break
			}
		}
		err := q.w.flushLocked()
		stopped := q.respStop.ioEnd()
		q.w.mu.Unlock()
		if err != nil {
			if stopped {
				return fmt.Errorf("STag %#08x invalidated while its Read Response was sent: %w", rr.srcSTag, err)
			}
			return err
		}
		if last {
			return nil
		}
	}
}

// respondInline sends the Read Response of a zero-length Read Request
// (RFC 5040 s5.2: one tagged segment without data; a requester's fence,
// or Linux siw's ready-to-receive) from the receiving goroutine, saving
// the hand-off to the responder goroutine. The caller has counted rr in
// irqCount and no other read is queued or being answered (responses go
// in request order). It reports false, leaving rr to the responder, when
// the writer is busy or holds the rest of an earlier write. The write
// does not wait: the receiving goroutine must keep reading, or two peers
// whose sockets are full would wait for each other; the responder
// goroutine writes what the socket does not take.
func (q *QP) respondInline(rr readRequest) bool {
	if q.w.raw == nil || !q.w.mu.TryLock() {
		return false
	}
	if q.w.pending() || q.w.sealed {
		q.w.mu.Unlock()
		return false
	}
	var hb [taggedHdrLen]byte
	putTagged(hb[:], true, opReadResp, rr.sinkSTag, rr.sinkTO)
	// As in serveRead: the IRD slot is free before the peer can see
	// the response and send its next request.
	q.irqCount.Add(-1)
	err := q.w.startLocked()
	if err == nil {
		err = q.w.addLocked(hb[:], nil)
	}
	if err == nil {
		err = q.w.tryFlushLocked()
	}
	rest := q.w.pending()
	q.w.mu.Unlock()
	switch {
	case err != nil:
		q.txFailed("Read Response", err)
	case rest:
		select {
		case q.respKick <- struct{}{}:
		default: // a kick is pending already
		}
	}
	return true
}

// respBatchBytes is how much of a Read Response goes out per system
// call: a whole 1 MiB response (an NFS WRITE's Read chunk, RFC 8166
// s3.4.5) in one. The batch points into the region, so its size costs
// no memory; a Send posted meanwhile waits for at most one batch.
const respBatchBytes = 1 << 20

// respSegs is how many Read Response segments of at most maxPayload
// bytes a batch holds: respBatchBytes' worth, within the writer's batch.
func respSegs(maxPayload int) int {
	return min(maxBatch, (respBatchBytes+maxPayload-1)/maxPayload)
}

// readFault is the Terminate for an inbound RDMA Read that cannot be
// served: a remote protection error with the offending Read Request
// header (RFC 5040 s7, R flag).
func readFault(rr readRequest, code byte, cause error) *rxFault {
	var rb [readReqLen]byte
	rr.put(rb[:])
	return &rxFault{t: Terminate{Layer: LayerRDMAP, EType: RDMAPEtypeRemoteProtection, Code: code, ReadRequest: rb[:]}, cause: cause}
}
