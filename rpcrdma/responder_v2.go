package rpcrdma

import (
	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/verbs"

	"github.com/rdmafs/rdmafs/mrcache"
)

// The responder's side of version 2 (draft-cel-nfsv4-rpcrdma-version-two)
// and of transport characteristics (xcharext).

// setVersion records the connection's version from a call; it reports
// whether this is the connection's first version-2 message.
func (c *serverConn) setVersion(v uint32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := c.vers != v && v == Version2
	c.vers = v
	return first
}

// sendParams returns the reply threshold and whether Send With Invalidate
// is allowed: on version 1 from RFC 8797 private data, on version 2 from
// the requester's XCHAR_RBSIZ (4096 by default, v2 s2.3) and
// XCHAR_REQREMINV (FALSE by default: xcharext s3.2).
func (c *serverConn) sendParams() (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.vers == Version2 {
		return min(int(c.peerChars.RBSize), c.s.cfg.InlineSend), c.peerChars.ReqRemInv
	}
	return c.privSend, c.peerInv
}

// nextRecvBuf returns the buffer to post after old was consumed: a larger
// one while a receive-buffer growth is under way. Once every posted buffer
// has the new size, the requester is told with UPDXCH: it must never send
// at the new size before then (xcharext s3.1, s3: whoever changes a
// characteristic must not break the peer).
func (c *serverConn) nextRecvBuf(old *mrcache.Buffer) *mrcache.Buffer {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.growTo == 0 || len(old.Bytes()) >= c.growTo {
		return old
	}
	size := c.growTo
	c.oldBufs--
	if c.oldBufs == 0 {
		// Every other posted buffer already has the new size and the
		// one returned here goes to the back of the queue, so the
		// requester may use the new size from its next message on.
		c.recvSize, c.growTo = size, 0
		go c.sendOptional(OptUpdXch, UpdXch{Now: Uint32Val(XCharRBSize, uint32(size)), PendClr: true}.Marshal(), 0)
	}
	b, err := c.getBuf(size, true, true)
	if err != nil {
		return old
	}
	c.putBuf(old, true)
	return b
}

// sendInitXch announces our characteristics after the first version-2
// reply (xcharext s4.1).
func (c *serverConn) sendInitXch() {
	c.mu.Lock()
	ours := Chars{RBSize: uint32(c.recvSize), ReqRemInv: false, BRS: BRSNone}
	c.mu.Unlock()
	c.sendOptional(OptInitXch, InitXch{Start: ours.Spec(), NoChg: Subset{}.With(1).With(2)}.Marshal(), 0)
}

func (c *serverConn) sendOptional(opt uint32, info []byte, xid uint32) {
	if xid == 0 {
		xid = uint32(c.wr.Add(1)) | 0x80000000
	}
	var e xdr.Encoder
	h := Header{XID: xid, Vers: Version2, Credit: c.grant(), Proc: ProcOptional, OptType: opt, OptInfo: info}
	h.Append(&e)
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.postSend(verbs.OpSend, 0, e.Bytes())
}

// handleOptional serves an RDMA_OPTIONAL from the requester.
func (c *serverConn) handleOptional(h *Header) {
	if !c.s.cfg.XChars {
		c.s.optErrors.Add(1)
		c.sendError(h, ErrOption) // v2 s3.1
		return
	}
	var err error
	switch h.OptType {
	case OptInitXch:
		var m InitXch
		if m, err = ParseInitXch(h.OptInfo); err == nil {
			c.mu.Lock()
			err = c.peerChars.applySpec(m.Start)
			c.mu.Unlock()
		}
	case OptReqXch:
		var m ReqXch
		if m, err = ParseReqXch(h.OptInfo); err == nil {
			c.sendOptional(OptRespXch, c.answerReqXch(m, h.XID).Marshal(), h.XID) // xcharext s4.3: same XID
		}
	case OptUpdXch:
		var m UpdXch
		if m, err = ParseUpdXch(h.OptInfo); err == nil {
			c.mu.Lock()
			_, err = c.peerChars.apply(m.Now)
			c.mu.Unlock()
		}
	default:
		c.s.optErrors.Add(1)
		c.sendError(h, ErrOption)
		return
	}
	if err != nil {
		c.tracef("optional xid=%#x type=%d: %v", h.XID, h.OptType, err)
		c.s.optErrors.Add(1)
		c.sendError(h, ErrChunk) // BAD_HEADER: xcharext s2.1 XDR error
	}
}

// answerReqXch decides a requester's request to change our
// characteristics. A larger receive buffer is granted as pending: the
// buffers are replaced as they are consumed, and UPDXCH with pendclr
// reports the new size once all are (xcharext s4.3, s4.4).
func (c *serverConn) answerReqXch(m ReqXch, xid uint32) RespXch {
	c.mu.Lock()
	defer c.mu.Unlock()
	ours := Chars{RBSize: uint32(c.recvSize), BRS: BRSNone}
	return answerReqXch(m, ours, func(v XCharVal, want Chars) xchAnswer {
		switch {
		case v.Which != XCharRBSize:
			return xchRej
		case int(want.RBSize) <= c.recvSize:
			return xchDone
		case int(want.RBSize) > c.s.cfg.MaxRecv || c.growTo != 0:
			return xchRej
		}
		c.growTo, c.oldBufs, c.growXID = int(want.RBSize), int(c.posted.Load()), xid
		return xchPend
	})
}
