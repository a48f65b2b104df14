package iwarp

import (
	"errors"
	"fmt"

	"github.com/rdmafs/rdmafs/verbs"
)

// txLoop transmits send queue work requests in posting order.
func (q *QP) txLoop() {
	defer q.wg.Done()
	for {
		q.mu.Lock()
		for q.err == nil && q.sqNextSeq-q.sqHeadSeq == uint64(q.sq.len()) {
			q.cond.Wait()
		}
		if q.err == nil && q.sq.at(int(q.sqNextSeq-q.sqHeadSeq)).wr.Opcode == verbs.OpRDMARead {
			// RFC 5040 s5.2 / RFC 6581: never more Read Requests
			// outstanding than the negotiated ORD.
			for q.err == nil && q.reads >= q.ord {
				q.cond.Wait()
			}
		}
		if q.err != nil {
			q.txExited = true
			q.flushSendLocked()
			q.mu.Unlock()
			return
		}
		seq := q.sqNextSeq
		e := *q.sq.at(int(seq - q.sqHeadSeq))
		wr := &e.wr
		var sinkSTag uint32
		if wr.Opcode == verbs.OpRDMARead {
			q.reads++
			if r := int32(q.reads); r > q.maxReads.Load() {
				q.maxReads.Store(r)
			}
			sinkSTag = wr.SGL[0].MR.STag()
			q.orq.push(readCtx{seq: seq, sinkSTag: sinkSTag, sinkTO: wr.SGL[0].Offset, size: wr.Length})
		}
		q.sqNextSeq++
		q.mu.Unlock()

		n, err := q.transmit(&e, sinkSTag)
		if err != nil {
			if q.setErr(fmt.Errorf("iwarp: send %v: %w: %w", wr.Opcode, verbs.ErrConnectionLost, err)) {
				_ = q.conn.Close()
			}
			continue
		}
		if q.kick && !q.kickStarted {
			q.kickStarted = true
			q.wg.Add(1)
			go q.kickLoop()
		}
		if wr.Opcode != verbs.OpRDMARead {
			q.completeSend(seq, verbs.StatusSuccess, n)
		}
	}
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
// segment fits one MPA ULPDU) and writes them. It returns the bytes sent.
// sinkSTag is the local STag of an RDMA Read's sink.
func (q *QP) transmit(e *sqEntry, sinkSTag uint32) (uint32, error) {
	wr := &e.wr
	if wr.Opcode == verbs.OpRDMARead {
		// RFC 5040 s4.4: untagged QN 1, one segment, 28-byte payload.
		hl := putUntagged(q.txHdr[:], true, opReadReq, 0, qnReadReq, q.readMSN, 0)
		q.readMSN++
		rr := readRequest{sinkSTag: sinkSTag, sinkTO: wr.SGL[0].Offset, size: wr.Length,
			srcSTag: wr.RemoteSTag, srcTO: wr.RemoteOffset}
		rr.put(q.txHdr[hl:])
		return 0, q.w.write(q.txHdr[:hl+readReqLen])
	}
	total := int(verbs.SGLLen(wr.SGL))
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
		if err := q.w.write(q.txHdr[:hl], q.txPieces...); err != nil {
			return 0, err
		}
		off += k
		if last {
			return uint32(total), nil
		}
	}
}

// respLoop serves inbound RDMA Read Requests with Read Responses.
func (q *QP) respLoop() {
	defer q.wg.Done()
	for {
		select {
		case <-q.done:
			return
		case rr := <-q.irq:
			err := q.serveRead(rr)
			var f *rxFault
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
	maxPayload := q.maxULPDU - taggedHdrLen
	off := 0
	for {
		k := min(len(src)-off, maxPayload)
		last := off+k == len(src)
		if last {
			// Free the IRD slot before the peer can see the end
			// of the response and issue its next request.
			q.irqCount.Add(-1)
		}
		putTagged(hb[:], last, opReadResp, rr.sinkSTag, rr.sinkTO+uint64(off))
		q.w.mu.Lock()
		if !q.respStop.ioStart() {
			q.w.mu.Unlock()
			// Between two segments: the stream is intact, so the
			// peer learns why its read ends (RFC 5040 s7).
			return readFault(rr, RDMAPCodeInvalidSTag, fmt.Errorf("inbound RDMA Read: STag %#08x invalidated during the response: %w", rr.srcSTag, verbs.ErrInvalidSTag))
		}
		err := q.w.writeLocked(hb[:], [][]byte{src[off : off+k]})
		stopped := q.respStop.ioEnd()
		q.w.mu.Unlock()
		if err != nil {
			if stopped {
				return fmt.Errorf("STag %#08x invalidated while its Read Response was sent: %w", rr.srcSTag, err)
			}
			return err
		}
		off += k
		if last {
			return nil
		}
	}
}

// readFault is the Terminate for an inbound RDMA Read that cannot be
// served: a remote protection error with the offending Read Request
// header (RFC 5040 s7, R flag).
func readFault(rr readRequest, code byte, cause error) *rxFault {
	var rb [readReqLen]byte
	rr.put(rb[:])
	return &rxFault{t: Terminate{Layer: LayerRDMAP, EType: RDMAPEtypeRemoteProtection, Code: code, ReadRequest: rb[:]}, cause: cause}
}
