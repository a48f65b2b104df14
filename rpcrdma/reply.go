package rpcrdma

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// receive handles one inbound message in receive buffer i. It reports
// whether the buffer was lent to the upper layer with a reply; otherwise
// it has copied what it keeps and the buffer can be posted again.
func (c *conn) receive(i int, msg []byte, invalidated uint32) (lent bool) {
	var h Header
	hlen, err := h.Decode(msg, true)
	if err != nil {
		// RFC 8166 s4.5: a malformed message is dropped; the call it
		// answers will time out and be retransmitted.
		c.t.stats.dropped.Add(1)
		c.t.tracef(trace.RDMA, "drop: %v", err)
		return false
	}
	payload := msg[hlen:]
	if h.Proc == ProcOptional {
		c.receiveOptional(&h)
		return false
	}
	if h.Proc == ProcMsg && len(h.Reads) == 0 && len(h.Writes) == 0 && h.Reply == nil {
		if mt, ok := oncrpc.MessageType(payload); ok && mt == oncrpc.MsgCall {
			c.backwardCall(h.XID, append([]byte(nil), payload...))
			return false
		}
	}
	c.mu.Lock()
	if c.optionalErrorLocked(&h) {
		c.mu.Unlock()
		return false
	}
	r := c.pending[h.XID]
	verdict := c.neg.reply(&h, r != nil && r.probe)
	if r != nil && verdict != dropReply {
		delete(c.pending, h.XID)
		c.inflight--
		// One-way RDMA_OPTIONALs we sent held a credit until the
		// peer's next reply (A-V2-4).
		c.inflight -= c.neg.optHeld
		c.neg.optHeld = 0
	}
	// RFC 8166 s3.3.1: every reply carries the current grant; an
	// RDMA_ERROR does not (v2 s5, A-V1-4).
	if h.Proc != ProcError && verdict != dropReply {
		c.granted = max(1, min(int(h.Credit), c.t.cfg.Credits))
	}
	if c.err == nil {
		c.wakeLocked()
	}
	// An inline reply's payload stays in its receive buffer.
	lend := r != nil && verdict != dropReply && verdict != resendV1 && verdict != versionMismatch && h.Proc == ProcMsg && len(payload) > 0 && c.lendLocked(i)
	c.mu.Unlock()
	if r == nil || verdict == dropReply {
		c.t.stats.dropped.Add(1)
		c.t.tracef(trace.RDMA, "drop: reply xid=%#x vers=%d proc=%d (call found: %v)", h.XID, h.Vers, h.Proc, r != nil)
		return false
	}
	switch verdict {
	case resendV1:
		// RFC 8166 s5 / v2 s5.2: the probe reached a version-1 peer;
		// send the same call again as version 1 (A-V2-3).
		c.t.stats.fallbacks.Add(1)
		c.t.tracef(trace.RDMA, "negotiate xid=%#x: ERR_VERS %d..%d: falling back to version 1 on this connection", h.XID, h.VersLow, h.VersHigh)
		r.invalidate(c)
		r.resend = true
		close(r.done)
		return false
	case versionMismatch:
		r.invalidate(c)
		r.err = fmt.Errorf("rpcrdma: %s supports RPC-over-RDMA versions %d..%d only: %w", c.t.addr, h.VersLow, h.VersHigh, ErrVersion)
		close(r.done)
		go c.fail(r.err)
		return false
	case confirmedV2:
		c.t.tracef(trace.RDMA, "negotiate xid=%#x: version 2 confirmed", h.XID)
		c.sendInitXch()
	}
	// RFC 8166 s8.1: every region the call exposed is dead before the
	// reply is used.
	r.invalidate(c)
	var rep *oncrpc.Reply
	if lend {
		rep, err = r.parseReply(&h, payload, invalidated, func() { c.returnRecv(i) })
		if rep == nil {
			c.returnRecv(i)
		}
	} else {
		rep, err = r.parseReply(&h, payload, invalidated, nil)
	}
	c.t.tracef(trace.RDMA, "reply xid=%#x proc=%d credits=%d len=%d writes=%v reply=%v inv=%#x lent=%v err=%v",
		h.XID, h.Proc, h.Credit, len(msg), h.Writes, h.Reply, invalidated, lend, err)
	r.reply, r.err = rep, err
	close(r.done)
	return lend
}

// errUnusable marks a reply this requester cannot accept.
var errUnusable = errors.New("rpcrdma: unusable reply")

// parseReply checks a reply against what r offered and builds the
// oncrpc.Reply (RFC 8166 s3.4.6, s4.3). payload is in a receive buffer;
// with lent set the reply keeps it there and lent gives it back,
// otherwise it is copied.
func (r *req) parseReply(h *Header, payload []byte, invalidated uint32, lent func()) (*oncrpc.Reply, error) {
	switch h.Proc {
	case ProcError:
		if h.ErrCode == ErrVers {
			return nil, fmt.Errorf("rpcrdma: xid %#x: server supports RPC-over-RDMA versions %d..%d: %w", r.xid, h.VersLow, h.VersHigh, ErrVersion)
		}
		return nil, fmt.Errorf("rpcrdma: xid %#x: %w", r.xid, ErrChunkRejected)
	case ProcMsg, ProcNoMsg:
	default:
		return nil, fmt.Errorf("%w: xid %#x: procedure %d in a reply", errUnusable, r.xid, h.Proc)
	}
	if h.Vers == Version2 && h.Proc == ProcMsg && len(payload) == 0 {
		// v2 s4.2: an RDMA_MSG always carries a payload stream.
		return nil, fmt.Errorf("%w: xid %#x: version-2 RDMA_MSG without a payload", errUnusable, r.xid)
	}
	if len(h.Reads) != 0 {
		// RFC 8166 s4.3.1: a responder sends no Read list.
		return nil, fmt.Errorf("%w: xid %#x: reply carries a Read list", errUnusable, r.xid)
	}
	placed := 0
	switch {
	case len(h.Writes) == 0:
	case len(h.Writes) == 1 && r.writeOff != nil:
		got := h.Writes[0]
		if len(got) != len(r.writeOff) {
			return nil, fmt.Errorf("%w: xid %#x: Write chunk has %d segments, offered %d", errUnusable, r.xid, len(got), len(r.writeOff))
		}
		for i, s := range got {
			o := r.writeOff[i]
			if s.Handle != o.Handle || s.Offset != o.Offset || s.Length > o.Length {
				return nil, fmt.Errorf("%w: xid %#x: Write chunk segment %d does not match the one offered", errUnusable, r.xid, i)
			}
			placed += int(s.Length)
		}
	default:
		return nil, fmt.Errorf("%w: xid %#x: %d Write chunks returned, %d offered", errUnusable, r.xid, len(h.Writes), len(r.call.ReplyBulk))
	}
	if placed > 0 && r.bounceIn != nil {
		// The destination was not registered memory: the data came
		// into transport buffers, filled in segment order (RFC 8166
		// s3.4.6), and is copied out.
		dst, left := r.call.ReplyBulk, placed
		for _, b := range r.bounceIn {
			k := copy(dst, b[:min(len(b), left)])
			dst, left = dst[k:], left-k
		}
		r.tr.stats.copied.Add(uint64(placed))
	}
	var msg []byte
	var release func()
	if h.Proc == ProcNoMsg {
		if h.Reply == nil || r.replySegs == nil || len(h.Reply) != len(r.replySegs) {
			return nil, fmt.Errorf("%w: xid %#x: RDMA_NOMSG without the Reply chunk offered", errUnusable, r.xid)
		}
		n := 0
		for i, s := range h.Reply {
			o := r.replySegs[i]
			if s.Handle != o.Handle || s.Offset != o.Offset || s.Length > o.Length {
				return nil, fmt.Errorf("%w: xid %#x: Reply chunk does not match the one offered", errUnusable, r.xid)
			}
			n += int(s.Length)
		}
		// The Reply chunk's buffer goes up with the reply.
		buf, pool := r.replyBuf, r.tr.pool
		msg, release = buf[:n], func() { pool.Put(buf) }
		r.replyBuf = nil
	} else if lent != nil {
		msg, release = payload, lent
	} else {
		msg = append([]byte(nil), payload...)
		r.tr.stats.copied.Add(uint64(len(payload)))
	}
	if len(msg) < 4 || binary.BigEndian.Uint32(msg) != r.xid {
		if release != nil {
			release()
		}
		return nil, fmt.Errorf("%w: xid %#x: RPC reply payload has another XID", errUnusable, r.xid)
	}
	r.tr.stats.countChunks(r.kinds, placed)
	rep := oncrpc.NewReply(msg, release)
	rep.BulkPlaced, rep.BulkLen = placed > 0, placed
	return rep, nil
}
