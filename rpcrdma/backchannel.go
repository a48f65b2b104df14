package rpcrdma

import (
	"encoding/binary"
	"fmt"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// The backward direction (RFC 8167): the responder calls us, as NFSv4.1
// callbacks do, and we answer as a responder would. Backward messages are
// inline only here (we announce XCHAR_BRS INLINE: xcharext s3.3).

// backwardCall handles an RPC call from the responder, on the receive
// path. The call gets one of the back channel's slots until its answer is
// posted: the responder is to stay within the credits we grant in
// backward replies (RFC 8167 s4.1), and a call beyond them is dropped, so
// a responder cannot make us serve more calls at once. (The slot is free
// once the answer is posted, not once its Send completes: the responder
// may call again as soon as the answer reaches it, and our completion can
// come later. Answers a responder does not read wait in send buffers,
// which the memory budget bounds.) Its
// transport header is checked first (RFC 8166 s4.5.1, s4.5.2): an
// unsupported version draws ERR_VERS, chunks or an rdma_xid that is not
// the RPC XID draw ERR_CHUNK.
func (c *conn) backwardCall(h *Header, payload []byte) {
	c.t.stats.backward.Add(1)
	select {
	case c.bcSlots <- struct{}{}:
	default:
		c.t.stats.bcDropped.Add(1)
		c.t.tracef(trace.RDMA, "drop: backward call xid=%#x beyond our %d slots", h.XID, cap(c.bcSlots))
		return
	}
	low, high := c.backwardVersions()
	switch {
	case h.Vers < low || h.Vers > high:
		c.backwardError(h, ErrVers, low, high)
		return
	case len(h.Reads) != 0 || len(h.Writes) != 0 || h.Reply != nil:
		c.backwardError(h, ErrChunk, 0, 0)
		return
	case binary.BigEndian.Uint32(payload) != h.XID:
		c.backwardError(h, ErrChunk, 0, 0)
		return
	}
	msg := append([]byte(nil), payload...)
	go c.serveBackward(h.XID, h.Vers, msg)
}

// backwardVersions is the range of versions this connection speaks: its
// negotiated version, or both while negotiation is under way.
func (c *conn) backwardVersions() (low, high uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch c.neg.st {
	case negV1:
		return Version1, Version1
	case negV2:
		return Version2, Version2
	}
	return Version1, Version2
}

// releaseSlot ends a backward call's hold on its slot.
func (c *conn) releaseSlot() { <-c.bcSlots }

// backwardError answers a backward call with an RDMA_ERROR echoing its
// XID and version (RFC 8166 s4.5) and granting our backward credits. If
// it cannot be sent the connection is closed, so that the responder
// learns the reply is lost (RFC 8166 s4.5.4).
func (c *conn) backwardError(h *Header, code, low, high uint32) {
	c.t.tracef(trace.RDMA, "backward call xid=%#x vers=%d: RDMA_ERROR %d", h.XID, h.Vers, code)
	eh := Header{XID: h.XID, Vers: h.Vers, Credit: uint32(c.t.cfg.BackchannelSlots), Proc: ProcError,
		ErrCode: code, VersLow: low, VersHigh: high}
	c.mu.Lock()
	_, err := c.postHeaderLocked(&eh)
	c.mu.Unlock()
	if err != nil {
		c.failRx(fmt.Errorf("%w: backward call xid %#x: cannot send RDMA_ERROR: %w", oncrpc.ErrConnection, h.XID, err))
	}
	c.releaseSlot()
}

// serveBackward runs the handler and sends its reply inline as RDMA_MSG,
// in the version of the call (v2 draft s5.3), granting our backward
// credits (never 0: RFC 8167 s4.1). A reply that cannot be sent, too
// large for the responder's inline threshold or failing to post, closes
// the connection (RFC 8166 s4.5.4): the responder must learn that it is
// lost.
func (c *conn) serveBackward(xid, vers uint32, msg []byte) {
	var reply []byte
	if hp := c.t.handler.Load(); hp != nil && *hp != nil {
		reply = (*hp).HandleCall(msg)
	} else if h, _, err := oncrpc.ParseCall(msg); err == nil {
		var e xdr.Encoder
		oncrpc.AppendAcceptedReply(&e, h.XID, oncrpc.ProgUnavail, 0, 0)
		reply = e.Bytes()
	}
	if reply == nil {
		c.releaseSlot()
		return
	}
	var e xdr.Encoder
	hdr := Header{XID: xid, Vers: vers, Credit: uint32(c.t.cfg.BackchannelSlots), Proc: ProcMsg}
	hdr.Append(&e)
	_, sendSize := c.params()
	c.t.tracef(trace.RDMA, "backward call xid=%#x len=%d reply=%d", xid, len(msg), len(reply))
	var err error
	if e.Len()+len(reply) > sendSize {
		err = fmt.Errorf("%d-byte reply exceeds the %d-byte inline threshold", e.Len()+len(reply), sendSize)
	} else {
		var buf *mrcache.Buffer
		var n int
		if buf, n, err = c.sendBuffer(c.ctx, [][]byte{e.Bytes(), reply}); err == nil {
			c.mu.Lock()
			_, err = c.postLocked(buf, n)
			c.mu.Unlock()
		}
	}
	if err != nil {
		c.fail(fmt.Errorf("%w: backward reply xid %#x lost: %w", oncrpc.ErrConnection, xid, err))
	}
	c.releaseSlot()
}
