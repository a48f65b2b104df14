package rpcrdma

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// receive handles one inbound message in receive buffer i; withInv says
// it came by Send With Invalidate of STag inv. It reports whether the
// buffer was lent to the upper layer with a reply; otherwise it has
// copied what it keeps and the buffer can be posted again.
//
// Dispatch follows the message, not the XID (RFC 8166 s4.2.1; the
// forward and backward XID spaces are independent): an RDMA_OPTIONAL by
// its type, an RDMA_MSG carrying an RPC call as a backward call, anything
// else as a reply to a pending call.
func (c *conn) receive(i int, msg []byte, inv uint32, withInv bool) (lent bool) {
	c.mu.Lock()
	st := c.neg.st
	c.mu.Unlock()
	// A message is decoded as the version it says; the elements of
	// version 2 (RDMA_OPTIONAL, error code 3) are malformed on a
	// version-1 connection (v2 draft s4.2, RFC 8166 s4.5).
	v2 := st != negV1 && len(msg) >= 8 && binary.BigEndian.Uint32(msg[4:]) == Version2
	h := &c.rxHdr
	hlen, err := h.Decode(msg, v2)
	if err != nil {
		// RFC 8166 s4.5: a malformed message is dropped; the call it
		// answers will time out and be retransmitted.
		c.drop("%v", err)
		if withInv {
			c.badInvalidate(inv, 0)
		}
		return false
	}
	payload := msg[hlen:]
	if withInv && (h.Proc == ProcOptional || h.Proc == ProcMsg && isCall(payload)) {
		// Send With Invalidate conveys replies only (xcharext s3.2).
		c.badInvalidate(inv, h.XID)
		return false
	}
	switch {
	case h.Proc == ProcOptional:
		c.receiveOptional(h)
		return false
	case h.Proc == ProcMsg && isCall(payload):
		c.backwardCall(h, payload)
		return false
	}
	return c.receiveReply(i, h, payload, inv, withInv)
}

// isCall reports whether an RPC message is a call.
func isCall(msg []byte) bool {
	mt, ok := oncrpc.MessageType(msg)
	return ok && mt == oncrpc.MsgCall
}

// drop counts and traces a message that is discarded.
func (c *conn) drop(format string, args ...any) {
	c.t.stats.dropped.Add(1)
	c.t.tracef(trace.RDMA, "drop: "+format, args...)
}

// badInvalidate tears the connection down after a Send With Invalidate
// whose STag no reply's call offered: the peer may have invalidated the
// memory of another call in flight (xcharext s3.2, RFC 8797 s5.1). The
// calls in flight are retransmitted on a new connection.
func (c *conn) badInvalidate(inv, xid uint32) {
	c.t.stats.invViolations.Add(1)
	c.failRx(fmt.Errorf("%w: Send With Invalidate of STag %#x, which xid %#x did not offer", oncrpc.ErrConnection, inv, xid))
}

// receiveReply handles a message that answers a forward call (or one of
// our RDMA_OPTIONALs).
func (c *conn) receiveReply(i int, h *Header, payload []byte, inv uint32, withInv bool) (lent bool) {
	r, v, lend := c.acceptReply(i, h, payload, inv, withInv)
	if r == nil {
		return false
	}
	// RFC 8166 s4.4.1: every region the peer may write (Write and Reply
	// chunks) is dead before the reply is used; if one cannot be, the
	// connection is closed first (s4.5.4) and the call fails to be
	// retransmitted. The Read chunk's, which the peer only reads, are
	// the caller's to invalidate before the call returns (frwr.unmapAll):
	// its provider may still be finishing the RDMA Read response, and
	// this loop need not wait for that.
	invErr := r.unmapWritable(c, r.xid)
	if invErr != nil {
		if lend {
			c.returnRecv(i)
		}
		r.err = fmt.Errorf("%w: xid %#x: %w", oncrpc.ErrConnection, r.xid, invErr)
		close(r.done)
		return lend
	}
	switch v {
	case resendV1:
		// v2 draft s5.2: the probe reached a version-1 peer; the same
		// call goes again as version 1 (it never reached the RPC
		// layer, so the RDMA_ERROR does not end it: RFC 8166 s4.5 is
		// about calls the responder processed).
		c.t.stats.fallbacks.Add(1)
		c.t.tracef(trace.RDMA, "negotiate xid=%#x: ERR_VERS %d..%d: falling back to version 1 on this connection", h.XID, h.VersLow, h.VersHigh)
		r.resend = true
		close(r.done)
		return false
	case versionMismatch:
		r.err = fmt.Errorf("rpcrdma: %s supports RPC-over-RDMA versions %d..%d only: %w", c.t.addr, h.VersLow, h.VersHigh, ErrVersion)
		close(r.done)
		go c.fail(r.err)
		return false
	}
	return c.deliverReply(r, i, h, payload, inv, withInv, lend)
}

// acceptReply finds the call h answers and checks the reply against it
// before it changes anything (RFC 8166 s4.5); once accepted, the call
// leaves the pending set, its credit is freed and the grant taken. r is
// nil if the reply was dropped; lend says the payload stays in receive
// buffer i (a spare was posted in its place).
func (c *conn) acceptReply(i int, h *Header, payload []byte, inv uint32, withInv bool) (r *req, v verdict, lend bool) {
	c.mu.Lock()
	if !withInv && c.optionalErrorLocked(h) {
		c.mu.Unlock()
		return nil, 0, false
	}
	r = c.pending[h.XID]
	if r == nil {
		c.mu.Unlock()
		if withInv {
			c.badInvalidate(inv, h.XID)
			return nil, 0, false
		}
		c.drop("reply xid=%#x vers=%d proc=%d answers no call", h.XID, h.Vers, h.Proc)
		return nil, 0, false
	}
	if withInv && !r.offered(inv) {
		c.mu.Unlock()
		c.badInvalidate(inv, h.XID)
		return nil, 0, false
	}
	v = c.neg.classify(h, r.probe)
	if v == deliverReply || v == confirmedV2 {
		if err := r.check(h, payload); err != nil {
			// RFC 8166 s4.5: a malformed reply is discarded, credits
			// and all; the call goes on waiting and is retransmitted
			// by the upper layer's rules.
			c.mu.Unlock()
			c.drop("%v", err)
			return nil, 0, false
		}
	}
	if v == dropReply {
		c.mu.Unlock()
		c.drop("reply xid=%#x: version %d on a version-%s connection", h.XID, h.Vers, c.neg.state())
		return nil, 0, false
	}
	if withInv && !c.remoteInvalidateAllowedLocked() {
		// xcharext s3.2: we did not allow it. The STag was this
		// call's and every other one is invalidated locally anyway.
		c.t.stats.invViolations.Add(1)
		c.t.tracef(trace.RDMA, "reply xid=%#x: Send With Invalidate of STag %#x without permission", h.XID, inv)
	}
	// The reply is accepted: now it may change state.
	c.neg.commit(h, v)
	c.reapSendsLocked() // the call's Send, most likely
	if c.err != nil {
		// A completion in error broke the queue pair (maybe the call's
		// fast-register): the call fails with the connection.
		c.mu.Unlock()
		return nil, 0, false
	}
	delete(c.pending, h.XID)
	c.inflight--
	c.releaseOneWayLocked(r.seq)
	if h.Proc != ProcError {
		// RFC 8166 s3.3.1: every reply carries the current grant,
		// never 0; an RDMA_ERROR does not count (v2 draft s5). More
		// than we have receive buffers for is no use.
		c.granted = max(1, min(int(h.Credit), c.t.cfg.Credits))
	}
	if v == confirmedV2 {
		c.t.tracef(trace.RDMA, "negotiate xid=%#x: version 2 confirmed", h.XID)
		c.neg.initWanted = c.t.cfg.XChars
	}
	c.pumpLocked()
	// An inline reply's payload stays in its receive buffer.
	lend = (v == deliverReply || v == confirmedV2) && h.Proc == ProcMsg && c.lendLocked(i)
	c.mu.Unlock()
	return r, v, lend
}

// deliverReply hands the accepted reply to its call, its memory safe to
// read (the writable exposures ended).
func (c *conn) deliverReply(r *req, i int, h *Header, payload []byte, inv uint32, withInv, lend bool) bool {
	var rep *oncrpc.Reply
	var err error
	if lend {
		rep, err = r.parseReply(h, payload, c.returner(i))
		if rep == nil {
			c.returnRecv(i)
		}
	} else {
		rep, err = r.parseReply(h, payload, nil)
	}
	if errors.Is(err, oncrpc.ErrConnection) {
		go c.fail(err)
	}
	if c.t.cfg.Tracer.On(trace.RDMA) {
		// Formatted only when traced: the arguments would cost a
		// call an allocation each.
		c.t.tracef(trace.RDMA, "reply xid=%#x proc=%d credits=%d len=%d writes=%s reply=%s inv=%v/%#x lent=%v err=%v",
			h.XID, h.Proc, h.Credit, len(payload), chunksString(h.Writes), segsString(h.Reply), withInv, inv, lend, err)
	}
	r.reply, r.err = rep, err
	close(r.done)
	return lend
}

// errUnusable marks a reply this requester cannot accept.
var errUnusable = errors.New("rpcrdma: malformed reply")

// check validates a reply against what r offered, before anything of it
// is used or any state changes (RFC 8166 s4.5: a reply with a malformed
// transport header is discarded). It reads only the transport header and
// the inline payload, which is in our receive buffer and never exposed.
func (r *req) check(h *Header, payload []byte) error {
	switch h.Proc {
	case ProcError:
		return nil
	case ProcMsg, ProcNoMsg:
	default:
		return fmt.Errorf("%w: xid %#x: procedure %d in a reply", errUnusable, r.xid, h.Proc)
	}
	if len(h.Reads) != 0 {
		// RFC 8166 s4.3.1: a responder sends no Read list.
		return fmt.Errorf("%w: xid %#x: reply carries a Read list", errUnusable, r.xid)
	}
	switch {
	case len(h.Writes) == 0:
	case len(h.Writes) == 1 && len(r.writeOff) > 0:
		if err := checkEcho(h.Writes[0], r.writeOff); err != nil {
			return fmt.Errorf("%w: xid %#x: Write chunk: %w", errUnusable, r.xid, err)
		}
	default:
		return fmt.Errorf("%w: xid %#x: %d Write chunks returned, %d offered", errUnusable, r.xid, len(h.Writes), min(len(r.writeOff), 1))
	}
	if h.Proc == ProcNoMsg {
		if h.Reply == nil || len(r.replySegs) == 0 {
			return fmt.Errorf("%w: xid %#x: RDMA_NOMSG without the Reply chunk offered", errUnusable, r.xid)
		}
		if err := checkEcho(h.Reply, r.replySegs); err != nil {
			return fmt.Errorf("%w: xid %#x: Reply chunk: %w", errUnusable, r.xid, err)
		}
		if h.Vers == Version2 && len(payload) != 0 {
			// v2 draft s4.2: no payload follows RDMA_NOMSG.
			return fmt.Errorf("%w: xid %#x: %d bytes after an RDMA_NOMSG header", errUnusable, r.xid, len(payload))
		}
		return nil
	}
	// RDMA_MSG: the payload stream follows and starts with the XID
	// (RFC 8166 s4.2.1: rdma_xid and the RPC XID must match).
	if len(payload) < 4 || binary.BigEndian.Uint32(payload) != h.XID {
		return fmt.Errorf("%w: xid %#x: RPC payload of %d bytes with another XID", errUnusable, r.xid, len(payload))
	}
	return nil
}

// checkEcho checks a returned chunk against the one offered (RFC 8166
// s3.4.6): the same segment count, handles and offsets, each length at
// most the one offered, and the chunk filled contiguously in segment
// order (a short segment is followed by empty ones only).
func checkEcho(got, offered []Segment) error {
	if len(got) != len(offered) {
		return fmt.Errorf("%d segments returned, %d offered", len(got), len(offered))
	}
	short := false
	for i, s := range got {
		o := offered[i]
		switch {
		case s.Handle != o.Handle || s.Offset != o.Offset:
			return fmt.Errorf("segment %d is not the one offered", i)
		case s.Length > o.Length:
			return fmt.Errorf("segment %d: %d bytes returned, %d offered", i, s.Length, o.Length)
		case short && s.Length != 0:
			return fmt.Errorf("segment %d: data after a short segment", i)
		}
		short = short || s.Length < o.Length
	}
	return nil
}

// parseReply builds the oncrpc.Reply of a reply that check accepted, once
// the call's memory is invalidated (RFC 8166 s3.4.6, s4.3). payload is in
// a receive buffer; with lent set the reply keeps it there and lent gives
// it back, otherwise it is copied.
func (r *req) parseReply(h *Header, payload []byte, lent func()) (*oncrpc.Reply, error) {
	if h.Proc == ProcError {
		switch h.ErrCode {
		case ErrVers:
			return nil, fmt.Errorf("rpcrdma: xid %#x: server supports RPC-over-RDMA versions %d..%d: %w", r.xid, h.VersLow, h.VersHigh, ErrVersion)
		case ErrChunk:
			return nil, fmt.Errorf("rpcrdma: xid %#x: %w", r.xid, ErrChunkRejected)
		}
		return nil, fmt.Errorf("rpcrdma: xid %#x: RDMA_ERROR %d: %w", r.xid, h.ErrCode, ErrChunkRejected)
	}
	// The bytes placed are what the responder reports in the returned
	// Write chunk (RFC 8166 s3.4.6), which check bounded by what was
	// offered, and no more than the provider saw land in each segment
	// when it can tell: a responder claiming bytes it never wrote would
	// pass off what the buffer held before as data. Counting stops at
	// the first segment holding less than claimed (what follows is not
	// contiguous). The upper layer compares the count with the one in
	// its result (BulkLen); a Write chunk returned unused places 0.
	placed := 0
	if len(h.Writes) == 1 {
		dst := r.call.ReplyBulk.Bytes()
		for k, s := range h.Writes[0] {
			n := int(s.Length)
			if r.writePlaced != nil && k < len(r.writePlaced) {
				n = min(n, r.writePlaced[k])
			}
			if r.bounceIn != nil {
				// The destination was not registered memory: each
				// segment's bytes came into a transport buffer and
				// are copied out in segment order.
				dst = dst[copy(dst, r.bounceIn[k][:n]):]
				r.tr.stats.copied.Add(uint64(n))
			}
			placed += n
			if n < int(s.Length) {
				break
			}
		}
	}
	var msg []byte
	var release func()
	switch {
	case h.Proc == ProcNoMsg:
		// The Reply chunk's buffer goes up with the reply.
		buf, pool := r.replyBuf, r.tr.pool
		msg, release = buf.Bytes()[:chunkLen(h.Reply)], func() { pool.Put(buf) }
		r.replyBuf = nil
		if r.replyKnown && len(msg) > r.replyPlaced {
			// RFC 8166 s3.4.6, as for a Write chunk: only the bytes
			// the responder wrote are the reply; what the buffer held
			// beyond them is not. A chunk claiming more is unusable,
			// and the call's memory is gone (see below).
			release()
			return nil, fmt.Errorf("%w: %w: xid %#x: Reply chunk claims %d bytes, %d were written", oncrpc.ErrConnection, errUnusable, r.xid, len(msg), r.replyPlaced)
		}
		if len(msg) < 4 || binary.BigEndian.Uint32(msg) != h.XID {
			// Found only now that the chunk may be read: the call's
			// memory is gone, so it cannot wait for another reply.
			release()
			return nil, fmt.Errorf("%w: %w: xid %#x: Reply chunk holds another XID", oncrpc.ErrConnection, errUnusable, r.xid)
		}
	case lent != nil:
		msg, release = payload, lent
	default:
		msg = append([]byte(nil), payload...)
		r.tr.stats.copied.Add(uint64(len(payload)))
	}
	r.tr.stats.countChunks(r.kinds, placed)
	rep := oncrpc.NewReply(msg, release)
	// A Write chunk offered is returned, used or unused (RFC 8166
	// s4.3.2): a reply that leaves the Write list out placed nothing in
	// it, and counts as such (s6.1: a result returned inline despite a
	// usable Write chunk is an error, which the upper layer's count
	// check makes of it).
	rep.BulkPlaced, rep.BulkLen = len(h.Writes) == 1 || len(r.writeOff) > 0, placed
	return rep, nil
}
