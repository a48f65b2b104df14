package iwarp

import (
	"errors"
	"fmt"

	"github.com/rdmafs/rdmafs/verbs"
)

// The responder: Read Responses to inbound RDMA Read Requests (RFC 5040
// s5.2), sent in the order of the requests (RFC 5040 s5: a Read Response
// follows every earlier request's response).
//
// A request that arrives when no other is queued or being answered, and
// the writer is free, is answered by the receiving goroutine itself
// (respondInline) with non-blocking writes, saving the hand-off to the
// responder goroutine. The receiving goroutine never waits for the
// socket: two peers whose sockets are full would wait for each other.
// What the socket does not take goes to the responder goroutine (inline
// state, respKick), which writes the rest with blocking writes.
//
// Every response that reads registered memory holds an access to it
// (verbs.ProtectionDomain.BeginAccess) until its last byte is written,
// with a stopper that an invalidation uses to stop it (RFC 8166 s8.1.3).
// respStop is the responder goroutine's own responses'; inlStop is the
// inline response's, whichever goroutine writes it. The inline state is
// under the writer's lock.

// inlineResp is a Read Response that respondInline started and the
// responder goroutine finishes.
type inlineResp struct {
	active bool
	rr     readRequest
	src    []byte // the requested bytes of the region
	mr     *verbs.MemoryRegion
	off    int // bytes of src added to the writer
}

// respLoop serves inbound RDMA Read Requests with Read Responses.
func (q *QP) respLoop() {
	defer q.wg.Done()
	defer q.respExit()
	for {
		var err error
		select {
		case <-q.done:
			return
		case <-q.respKick:
			err = q.resumeInline()
		case rr := <-q.irq:
			// An inline response started before rr was queued:
			// it goes first.
			err = q.resumeInline()
			if err == nil {
				err = q.serveRead(rr)
			}
		}
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

// respExit ends an inline response the responder goroutine will not
// finish any more (the queue pair is broken), so that its region's
// invalidation does not wait, and keeps respondInline from starting one.
func (q *QP) respExit() {
	q.w.mu.Lock()
	defer q.w.mu.Unlock()
	q.respExited = true
	q.endInlineLocked()
}

// endInlineLocked ends the inline response's access. Its unwritten rest,
// if any, is dropped: the memory may not be read after the access ends.
func (q *QP) endInlineLocked() {
	if !q.inl.active {
		return
	}
	if q.w.pendStop == &q.inlStop {
		q.w.bufs, q.w.pendStop = nil, nil
	}
	q.inl.mr.EndAccess(&q.inlStop, 0, 0)
	q.inl = inlineResp{}
}

// serveRead sends the Read Response for rr (RFC 5040 s5.2): tagged
// segments to the requester's sink STag.
func (q *QP) serveRead(rr readRequest) error {
	// A zero-length Read names no memory and is not checked (Linux siw
	// sends one with a dummy STag as ready-to-receive in peer-to-peer
	// mode).
	if rr.size == 0 {
		var hb [taggedHdrLen]byte
		putTagged(hb[:], true, opReadResp, rr.sinkSTag, rr.sinkTO)
		q.w.mu.Lock()
		defer q.w.mu.Unlock()
		// Under the writer's lock: a request after rr, answered
		// inline, cannot go first.
		q.irqCount.Add(-1)
		return q.w.writeLocked(hb[:], nil)
	}
	// The region stays busy until the response is out: an invalidation
	// waits for it, and stops it if the peer does not take it
	// (stopper), so nothing is read after the invalidation returns
	// (RFC 8166 s8.1.3).
	q.respStop.prepare()
	src, mr, err := q.pd.BeginAccess(rr.srcSTag, verbs.AccessRemoteRead, rr.srcTO, uint64(rr.size), &q.respStop)
	if err != nil {
		// rr keeps its IRD slot: the stream ends with the Terminate,
		// and no later request is answered before it.
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
			return stoppedFault(rr)
		}
		var last bool
		off, last = q.addRespLocked(&rr, src, off)
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

// stoppedFault is the Terminate for a response an invalidation stopped
// between two batches: the stream is intact, so the peer learns why its
// read ends (RFC 5040 s7).
func stoppedFault(rr readRequest) *rxFault {
	return readFault(rr, RDMAPCodeInvalidSTag, fmt.Errorf("inbound RDMA Read: STag %#08x invalidated during the response: %w", rr.srcSTag, verbs.ErrInvalidSTag))
}

// respBatchBytes is how much of a Read Response goes out per system
// call. The batch points into the region, so its size costs no memory;
// a Send posted meanwhile waits for at most one batch. Measured on
// loopback with a 1 MiB response (an NFS WRITE's Read chunk, RFC 8166
// s3.4.5): 256 KiB beats both 128 KiB (more calls) and 512 KiB or
// 1 MiB (the peer starts reading later: less overlap of the two
// copies).
const respBatchBytes = 256 << 10

// respSegs is how many Read Response segments of at most maxPayload
// bytes a batch holds: respBatchBytes' worth, within the writer's batch.
func respSegs(maxPayload int) int {
	return min(maxBatch, (respBatchBytes+maxPayload-1)/maxPayload)
}

// addRespLocked adds the next batch of rr's response segments, src from
// off, to the writer's started batch; it returns the new offset and
// whether the last segment is in. The caller holds the writer's lock.
func (q *QP) addRespLocked(rr *readRequest, src []byte, off int) (int, bool) {
	var hb [taggedHdrLen]byte
	var piece [1][]byte
	maxPayload := q.maxULPDU - taggedHdrLen
	for range respSegs(maxPayload) {
		k := min(len(src)-off, maxPayload)
		last := off+k == len(src)
		if last {
			// Free the IRD slot before the peer can see the end of
			// the response and issue its next request.
			q.irqCount.Add(-1)
		}
		putTagged(hb[:], last, opReadResp, rr.sinkSTag, rr.sinkTO+uint64(off))
		piece[0] = src[off : off+k]
		_ = q.w.addLocked(hb[:], piece[:]) // the batch is not full: no write
		off += k
		if last {
			return off, true
		}
	}
	return off, false
}

// respondInline answers rr from the receiving goroutine (see the top of
// the file). The caller has counted rr in irqCount and no other read is
// queued or being answered. It reports false, leaving rr to the
// responder goroutine, when the writer is busy, holds the rest of an
// earlier write or an unfinished inline response, or the region cannot
// be read (the responder reports why). Test hooks (onServe) stall the
// responder goroutine: with one, every read goes there.
func (q *QP) respondInline(rr readRequest) bool {
	if q.w.raw == nil || q.onServe != nil || !q.w.mu.TryLock() {
		return false
	}
	if q.w.pending() || q.w.sealed || q.inl.active || q.respExited {
		q.w.mu.Unlock()
		return false
	}
	var src []byte
	var mr *verbs.MemoryRegion
	if rr.size > 0 {
		q.inlStop.prepare()
		var err error
		src, mr, err = q.pd.BeginAccess(rr.srcSTag, verbs.AccessRemoteRead, rr.srcTO, uint64(rr.size), &q.inlStop)
		if err != nil {
			q.w.mu.Unlock()
			return false
		}
	}
	err := q.w.startLocked() // nothing pending: it does not write
	off := 0
	for err == nil {
		if rr.size > 0 && !q.inlStop.ioStart() {
			break // stopped: the responder tells the peer
		}
		var last bool
		if rr.size == 0 {
			// RFC 5040 s5.2: one tagged segment without data (a
			// requester's fence, or Linux siw's ready-to-receive).
			var hb [taggedHdrLen]byte
			putTagged(hb[:], true, opReadResp, rr.sinkSTag, rr.sinkTO)
			// As in addRespLocked: the IRD slot is free before
			// the peer can see the response.
			q.irqCount.Add(-1)
			err = q.w.addLocked(hb[:], nil)
			last = true
		} else {
			off, last = q.addRespLocked(&rr, src, off)
		}
		if err == nil {
			err = q.w.tryFlushLocked()
		}
		if rr.size > 0 {
			q.inlStop.ioEnd()
		}
		if err != nil || q.w.pending() || last {
			break
		}
	}
	switch {
	case err != nil:
		q.w.bufs = nil // the stream is broken; the batch points into the region
		if mr != nil {
			mr.EndAccess(&q.inlStop, 0, 0)
		}
		q.w.mu.Unlock()
		q.txFailed("Read Response", err)
		return true
	case rr.size == 0 || off == len(src) && !q.w.pending():
		if mr != nil {
			mr.EndAccess(&q.inlStop, 0, 0)
		}
		rest := q.w.pending()
		q.w.mu.Unlock()
		if rest {
			q.kickResponder()
		}
		return true
	}
	// The socket is full, or an invalidation stopped the response: the
	// responder goroutine goes on. The access stays until it is done;
	// whoever writes the pending rest does so as part of the access.
	q.inl = inlineResp{active: true, rr: rr, src: src, mr: mr, off: off}
	if q.w.pending() {
		q.w.pendStop = &q.inlStop
	}
	q.w.mu.Unlock()
	q.respHandoffs.Add(1)
	q.kickResponder()
	return true
}

// kickResponder has the responder goroutine write what respondInline
// left.
func (q *QP) kickResponder() {
	select {
	case q.respKick <- struct{}{}:
	default: // a kick is pending already
	}
}

// resumeInline, run by the responder goroutine, writes what respondInline
// left: the rest of a write, and the rest of an inline response.
func (q *QP) resumeInline() error {
	q.w.mu.Lock()
	// The pending rest, as part of the inline response's access if it
	// is one of its segments (fpduWriter.pendStop).
	if err := q.w.startLocked(); err != nil {
		// errRestStopped: stopped inside a segment, the stream cannot
		// go on.
		q.endInlineLocked()
		q.w.mu.Unlock()
		return err
	}
	r := &q.inl
	for r.active {
		if r.off == len(r.src) {
			break // the last segment is out
		}
		if !q.inlStop.ioStart() {
			rr := r.rr
			q.endInlineLocked()
			q.w.mu.Unlock()
			return stoppedFault(rr)
		}
		var last bool
		r.off, last = q.addRespLocked(&r.rr, r.src, r.off)
		err := q.w.flushLocked()
		stopped := q.inlStop.ioEnd()
		if err != nil {
			stag := r.rr.srcSTag
			q.endInlineLocked()
			q.w.mu.Unlock()
			if stopped {
				return fmt.Errorf("STag %#08x invalidated while its Read Response was sent: %w", stag, err)
			}
			return err
		}
		if last {
			break
		}
		// Between batches, Sends go out (as in serveRead).
		q.w.mu.Unlock()
		q.w.mu.Lock()
		if err := q.w.startLocked(); err != nil {
			q.endInlineLocked()
			q.w.mu.Unlock()
			return err
		}
	}
	q.endInlineLocked()
	q.w.mu.Unlock()
	return nil
}

// readFault is the Terminate for an inbound RDMA Read that cannot be
// served: a remote protection error with the offending Read Request
// header (RFC 5040 s7, R flag).
func readFault(rr readRequest, code byte, cause error) *rxFault {
	var rb [readReqLen]byte
	rr.put(rb[:])
	return &rxFault{t: Terminate{Layer: LayerRDMAP, EType: RDMAPEtypeRemoteProtection, Code: code, ReadRequest: rb[:]}, cause: cause}
}
