package iwarp

import (
	"errors"
	"fmt"
	"sync"

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
	mr     *Region
	off    int // bytes of src added to the writer
	// bad: the region cannot be read; the responder goroutine sends
	// this Terminate (a Read Request a poster took, parkRead).
	bad *rxFault
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
	if q.inl.mr != nil {
		q.inl.mr.EndAccess(&q.inlStop, 0, 0)
	}
	q.setInlLocked(inlineResp{})
}

// setInlLocked sets the inline response, under the writer's lock.
func (q *QP) setInlLocked(r inlineResp) {
	q.inl = r
	q.inlActive.Store(r.active)
}

// serveRead sends the Read Response for rr (RFC 5040 s5.2): tagged
// segments to the requester's sink STag.
func (q *QP) serveRead(rr readRequest) error {
	// A zero-length Read names no memory and is not checked (Linux siw
	// sends one with a dummy STag as ready-to-receive in peer-to-peer
	// mode).
	if rr.size == 0 {
		q.w.mu.Lock()
		defer q.w.mu.Unlock()
		return q.writeZeroRespLocked(&rr)
	}
	// The region stays busy until the response is out: an invalidation
	// waits for it, and stops it if the peer does not take it
	// (stopper), so nothing is read after the invalidation returns
	// (RFC 8166 s8.1.3).
	q.respStop.prepare()
	src, mr, err := q.pd.BeginAccess(rr.srcSTag, verbs.AccessRemoteRead, rr.srcTO, uint64(rr.size), &q.respStop)
	if err != nil {
		return accessFault(rr, err)
	}
	defer mr.EndAccess(&q.respStop, 0, 0)
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

// accessFault is the Terminate for a Read Request whose region cannot be
// read (BeginAccess failed). rr keeps its IRD slot: the stream ends with
// the Terminate, and no later request is answered before it.
func accessFault(rr readRequest, err error) *rxFault {
	code := byte(RDMAPCodeInvalidSTag)
	switch {
	case errors.Is(err, verbs.ErrBounds):
		code = RDMAPCodeBaseBounds
	case errors.Is(err, verbs.ErrAccess):
		code = RDMAPCodeAccessRights
	}
	return readFault(rr, code, fmt.Errorf("inbound RDMA Read: %w", err))
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
// responder goroutine, when the writer is busy (unless a poster holding
// it takes rr: parkRead), holds the rest of an earlier write or an
// unfinished inline response, or the region cannot be read (the
// responder reports why), or the connection is not a socket (no
// non-blocking writes).
func (q *QP) respondInline(rr readRequest) bool {
	if q.w.raw == nil {
		return false
	}
	if !q.w.mu.TryLock() {
		return q.parkRead(rr)
	}
	if q.w.pending() || q.w.sealed || q.inl.active || q.respExited {
		q.w.mu.Unlock()
		return false
	}
	kick, aerr, err := q.respondLocked(rr)
	q.w.mu.Unlock()
	if aerr != nil {
		return false
	}
	q.afterRespond(kick, err)
	return true
}

// afterRespond, once the writer's lock is let go, breaks the queue pair
// after a failed write of a Read Response, or has the responder goroutine
// write what respondLocked left.
func (q *QP) afterRespond(kick bool, err error) {
	switch {
	case err != nil:
		q.txFailed("Read Response", err)
	case kick:
		q.kickResponder()
	}
}

// respondLocked writes rr's response with non-blocking writes; the caller
// holds the writer's lock, and nothing is pending in the writer, nor an
// inline response. What the socket does not take becomes the inline
// response, for the responder goroutine (kick). aerr: the region cannot
// be read, nothing was written. err: a write failed (afterRespond).
func (q *QP) respondLocked(rr readRequest) (kick bool, aerr, err error) {
	var src []byte
	var mr *Region
	if rr.size > 0 {
		q.inlStop.prepare()
		src, mr, aerr = q.pd.BeginAccess(rr.srcSTag, verbs.AccessRemoteRead, rr.srcTO, uint64(rr.size), &q.inlStop)
		if aerr != nil {
			return false, aerr, nil
		}
	}
	err = q.w.startLocked() // nothing pending: it does not write
	off := 0
	for err == nil {
		if rr.size > 0 && !q.inlStop.ioStart() {
			break // stopped: the responder tells the peer
		}
		var last bool
		if rr.size == 0 {
			q.addZeroRespLocked(&rr)
			last = true
		} else {
			off, last = q.addRespLocked(&rr, src, off)
		}
		err = q.w.tryFlushLocked()
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
		return false, nil, err
	case rr.size == 0 || off == len(src) && !q.w.pending():
		if mr != nil {
			mr.EndAccess(&q.inlStop, 0, 0)
		}
		return q.w.pending(), nil, nil
	}
	// The socket is full, or an invalidation stopped the response: the
	// responder goroutine goes on. The access stays until it is done;
	// whoever writes the pending rest does so as part of the access.
	q.setInlLocked(inlineResp{active: true, rr: rr, src: src, mr: mr, off: off})
	if q.w.pending() {
		q.w.pendStop = &q.inlStop
	}
	q.respHandoffs.Add(1)
	return true, nil, nil
}

// addZeroRespLocked adds the response to a zero-length Read to the
// writer's started batch. RFC 5040 s5.2: one tagged segment without data
// (a requester's fence, or Linux siw's ready-to-receive).
func (q *QP) addZeroRespLocked(rr *readRequest) {
	var hb [taggedHdrLen]byte
	putTagged(hb[:], true, opReadResp, rr.sinkSTag, rr.sinkTO)
	// As in addRespLocked: the IRD slot is free before the peer can
	// see the response.
	q.irqCount.Add(-1)
	_ = q.w.addLocked(hb[:], nil) // the batch is empty: no write
}

// writeZeroRespLocked writes the response to a zero-length Read after
// what the writer holds, with blocking writes. The caller holds the
// writer's lock, so a request after rr, answered inline, cannot go
// first.
func (q *QP) writeZeroRespLocked(rr *readRequest) error {
	if err := q.w.startLocked(); err != nil {
		return err
	}
	q.addZeroRespLocked(rr)
	return q.w.flushLocked()
}

// A Read Request often arrives while the Send that asked for it is still
// being posted: the peer answered before the poster's write returned (or
// before the poster's thread ran again). Rather than waking the
// responder goroutine, which would then wait for the writer, the
// receiving goroutine leaves the request to the poster (parkRead), which
// answers it before it lets go of the writer (answerParkedLocked), with
// non-blocking writes as respondInline: nobody waits for the socket.
// Whatever the poster cannot write becomes the inline response, which
// the responder goroutine finishes before any later request (respLoop),
// so responses keep the requests' order.

// postParked is the poster's side of parkRead, under its mutex.
type postParked struct {
	mu      sync.Mutex
	posting bool // the writer's holder is a direct poster (postDirect)
	has     bool // rr waits for it
	rr      readRequest
}

// startPosting marks the writer's holder, the caller, as a direct
// poster: it takes a parked Read Request (endPostingLocked) before it lets go
// of the writer.
func (q *QP) startPosting() {
	q.pk.mu.Lock()
	q.pk.posting = true
	q.pk.mu.Unlock()
}

// parkRead leaves rr, which respondInline could not answer because the
// writer was busy, to the writer's holder if that is a direct poster. It
// reports false, leaving rr to the responder goroutine, when the holder
// is not one, or an inline response is unfinished (which goes first:
// the responder goroutine has it).
func (q *QP) parkRead(rr readRequest) bool {
	if q.inlActive.Load() {
		// Only the receiving goroutine, or a poster answering a parked
		// request, starts an inline response: the receiving goroutine
		// sees one it did not start here.
		return false
	}
	q.pk.mu.Lock()
	defer q.pk.mu.Unlock()
	if !q.pk.posting || q.pk.has {
		return false
	}
	q.pk.rr, q.pk.has = rr, true
	q.respParked.Add(1)
	return true
}

// endPostingLocked, by a direct poster before it lets go of the writer,
// ends its posting and answers the Read Request parked with it, if any,
// unless its own write failed (ok false: the stream is over). The
// results are for afterRespond, once the writer's lock is let go.
func (q *QP) endPostingLocked(ok bool) (kick bool, err error) {
	q.pk.mu.Lock()
	rr, has := q.pk.rr, q.pk.has
	q.pk.posting, q.pk.has, q.pk.rr = false, false, readRequest{}
	q.pk.mu.Unlock()
	if !has || !ok {
		return false, nil
	}
	return q.answerParkedLocked(rr)
}

// answerParkedLocked answers a parked Read Request; the caller, its
// poster, holds the writer's lock and its own write succeeded. No
// inline response is unfinished (parkRead). The results are
// respondLocked's, for afterRespond.
func (q *QP) answerParkedLocked(rr readRequest) (kick bool, err error) {
	if q.w.sealed || q.respExited {
		return false, nil // the stream is over
	}
	if !q.w.pending() {
		kick, aerr, err := q.respondLocked(rr)
		if aerr == nil {
			return kick, err
		}
		// The responder goroutine sends the Terminate, before any
		// later request's response.
		q.setInlLocked(inlineResp{active: true, rr: rr, bad: accessFault(rr, aerr)})
		return true, nil
	}
	// The post left the rest of its write: the responder goroutine
	// writes it, then the whole response (resumeInline).
	r := inlineResp{active: true, rr: rr}
	if rr.size > 0 {
		q.inlStop.prepare()
		src, mr, aerr := q.pd.BeginAccess(rr.srcSTag, verbs.AccessRemoteRead, rr.srcTO, uint64(rr.size), &q.inlStop)
		if aerr != nil {
			r.bad = accessFault(rr, aerr)
		}
		r.src, r.mr = src, mr
	}
	q.setInlLocked(r)
	return true, nil
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
	if r.active && r.bad != nil {
		f := r.bad
		q.endInlineLocked()
		q.w.mu.Unlock()
		return f
	}
	if r.active && r.rr.size == 0 {
		// A parked zero-length Read (answerParkedLocked).
		err := q.writeZeroRespLocked(&r.rr)
		q.endInlineLocked()
		q.w.mu.Unlock()
		return err
	}
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
