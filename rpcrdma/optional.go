package rpcrdma

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/internal/xdr"
)

// RDMA_OPTIONAL (v2 draft s3) and the requester's side of transport
// characteristics (draft-dnoveck-nfsv4-rpcrdma-xcharext s4).
//
// Credits. Every message we send uses up a Receive at the peer, so every
// one is counted against the grant (RFC 8166 s3.3.1), RDMA_OPTIONALs and
// the RDMA_ERRORs answering the peer's included; the v2 draft does not
// say how, so this is our reading. A ROPT_REQXCH is answered and holds
// its credit until the ROPT_RESPXCH or RDMA_ERROR comes. A one-way
// message (ROPT_INITXCH, ROPT_RESPXCH, an RDMA_ERROR) is never
// acknowledged: its credit comes back with the reply to a call sent after
// it, which the peer can only have sent once it had consumed the one-way
// message. So a one-way message goes out only while a credit stays free
// for calls (with a grant of 1 it waits: sending it would stall every
// call behind it), and what cannot wait is dropped.

// optReply is a one-way answer waiting for a credit.
type optReply struct {
	xid, opt uint32
	info     []byte
}

// optXIDLocked returns an XID for an RDMA_OPTIONAL we originate. RPC XIDs
// come from the RPC client; these come from a separate random sequence,
// not in use by a call now, and the peer never matches them against calls
// (xcharext s4.4).
func (c *conn) optXIDLocked() uint32 {
	for {
		x := rand.Uint32()
		if _, busy := c.pending[x]; !busy && x != 0 {
			if _, busy := c.neg.optXIDs[x]; !busy {
				return x
			}
		}
	}
}

// sendOneWayLocked sends h, a message no reply acknowledges, if a credit
// is free beyond the one kept for calls and a send buffer is free now; it
// reports whether it did. Called with c.mu held.
func (c *conn) sendOneWayLocked(h *Header) bool {
	if c.err != nil || c.inflight+1 >= c.granted {
		return false
	}
	seq, err := c.postHeaderLocked(h)
	if err != nil {
		c.t.tracef(trace.RDMA, "optional xid=%#x: %v", h.XID, err)
		return false
	}
	c.inflight++
	c.oneWay = append(c.oneWay, seq)
	return true
}

// noWait is a context that has ended: GetWait with it does not wait.
var noWait = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// postHeaderLocked posts a message of a transport header only, in a send
// buffer taken without waiting. Called with c.mu held.
func (c *conn) postHeaderLocked(h *Header) (uint64, error) {
	var e xdr.Encoder
	h.Append(&e)
	buf, err := c.t.pool.GetWait(noWait, e.Len())
	if err != nil {
		return 0, fmt.Errorf("rpcrdma: send buffer: %w", err)
	}
	return c.postLocked(buf, copy(buf.Bytes(), e.Bytes()))
}

// releaseOneWayLocked returns the credits of the one-way messages sent
// before message seq, whose reply has come. The peer has consumed them:
// an RDMA_ERROR refusing one would have come before that reply.
func (c *conn) releaseOneWayLocked(seq uint64) {
	if len(c.oneWay) == 0 {
		return
	}
	for x, o := range c.neg.optXIDs {
		if o.opt != OptReqXch && o.seq < seq {
			delete(c.neg.optXIDs, x)
		}
	}
	k := 0
	for _, s := range c.oneWay {
		if s < seq {
			c.inflight--
		} else {
			c.oneWay[k] = s
			k++
		}
	}
	c.oneWay = c.oneWay[:k]
}

// releaseOneWaySeqLocked returns the credit of one one-way message (the
// peer answered it with an RDMA_ERROR).
func (c *conn) releaseOneWaySeqLocked(seq uint64) {
	for k, s := range c.oneWay {
		if s == seq {
			c.oneWay = append(c.oneWay[:k], c.oneWay[k+1:]...)
			c.inflight--
			return
		}
	}
}

// pumpLocked sends the one-way messages waiting for a credit, then lets
// credit waiters look again. Called with c.mu held after credits came
// back.
func (c *conn) pumpLocked() {
	if c.err != nil {
		return
	}
	if c.neg.initWanted && c.sendInitXchLocked() {
		c.neg.initWanted = false
	}
	if w := c.neg.respWanted; w != nil {
		h := Header{XID: w.xid, Vers: Version2, Credit: uint32(c.t.cfg.Credits), Proc: ProcOptional, OptType: w.opt, OptInfo: w.info}
		if c.sendOneWayLocked(&h) {
			c.neg.respWanted = nil
		}
	}
	c.wakeLocked()
}

// sendInitXchLocked announces our characteristics (xcharext s4.1): our
// receive buffer size, whether we accept Send With Invalidate, and our
// backward request support; none of them will change. It goes out only
// once version 2 is confirmed (before, the peer may speak version 1 only:
// v2 draft s5) and a credit is free.
func (c *conn) sendInitXchLocked() bool {
	ours := Chars{RBSize: uint32(c.recvSize), ReqRemInv: c.t.cfg.AcceptInvalidate, BRS: BRSInline}
	m := InitXch{Start: ours.Spec(), NoChg: Subset{}.With(0).With(1).With(2)}
	h := Header{XID: c.optXIDLocked(), Vers: Version2, Credit: uint32(c.t.cfg.Credits), Proc: ProcOptional, OptType: OptInitXch, OptInfo: m.Marshal()}
	if !c.sendOneWayLocked(&h) {
		return false
	}
	c.neg.optXIDs[h.XID] = optSent{opt: OptInitXch, seq: c.oneWay[len(c.oneWay)-1]}
	c.neg.initSent = true
	c.t.tracef(trace.RDMA, "optional xid=%#x: INITXCH %+v", h.XID, ours)
	return true
}

// remoteInvalidateAllowedLocked reports whether we told the peer it may
// use Send With Invalidate: RFC 8797 private data on version 1,
// XCHAR_REQREMINV in our ROPT_INITXCH on version 2 (xcharext s3.2).
func (c *conn) remoteInvalidateAllowedLocked() bool {
	return c.t.cfg.AcceptInvalidate && (c.neg.st != negV2 || c.neg.initSent)
}

// RequestChange asks the peer to change its characteristics with
// ROPT_REQXCH (xcharext s4.2), for example a larger receive buffer; the
// answer comes as ROPT_RESPXCH and, for pending changes, ROPT_UPDXCH.
func (t *Transport) RequestChange(ctx context.Context, want []XCharVal) error {
	c, err := t.connection(ctx)
	if err != nil {
		return err
	}
	// A REQXCH is answered: it holds a credit like a call.
	if err := c.acquireCredit(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.err != nil:
		return c.err
	case c.neg.st != negV2:
		c.inflight--
		return errors.New("rpcrdma: RDMA_OPTIONAL needs a version-2 connection")
	case c.neg.reqXID != 0:
		c.inflight--
		c.pumpLocked()
		return errors.New("rpcrdma: a characteristics change is already outstanding")
	}
	h := Header{XID: c.optXIDLocked(), Vers: Version2, Credit: uint32(t.cfg.Credits), Proc: ProcOptional, OptType: OptReqXch, OptInfo: ReqXch{Want: want}.Marshal()}
	seq, err := c.postHeaderLocked(&h)
	if err != nil {
		c.inflight--
		c.pumpLocked()
		return err
	}
	c.neg.optXIDs[h.XID] = optSent{opt: OptReqXch, seq: seq}
	c.neg.reqXID, c.neg.reqWant = h.XID, want
	t.tracef(trace.RDMA, "optional xid=%#x: REQXCH %d values", h.XID, len(want))
	return nil
}

// receiveOptional handles an RDMA_OPTIONAL from the responder. Answers
// go out one-way, within credits; one that finds no credit is dropped
// (the peer learns nothing, as if the message were lost), so a flood of
// RDMA_OPTIONALs costs us at most a credit's worth of sends.
func (c *conn) receiveOptional(h *Header) {
	c.t.stats.optionals.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.neg.st == negV1 {
		c.t.tracef(trace.RDMA, "drop: RDMA_OPTIONAL on a version-1 connection")
		return
	}
	var err error
	switch h.OptType {
	case OptInitXch:
		// Accepted any time after connecting (xcharext s4.1).
		var m InitXch
		if m, err = ParseInitXch(h.OptInfo); err == nil {
			if err = c.neg.peer.applySpec(m.Start); err == nil {
				c.neg.peerNoChg, c.neg.peerInit = m.NoChg, true
			}
		}
	case OptReqXch:
		// xcharext s4.2: always answered with a ROPT_RESPXCH carrying
		// the request's XID (s4.3); one answer waits for a credit at
		// most.
		var m ReqXch
		if m, err = ParseReqXch(h.OptInfo); err == nil {
			resp := optReply{xid: h.XID, opt: OptRespXch, info: c.answerReqXch(m).Marshal()}
			rh := Header{XID: h.XID, Vers: Version2, Credit: uint32(c.t.cfg.Credits), Proc: ProcOptional, OptType: OptRespXch, OptInfo: resp.info}
			if !c.sendOneWayLocked(&rh) {
				if c.neg.respWanted != nil {
					c.t.stats.optDropped.Add(1)
				}
				c.neg.respWanted = &resp
			}
		}
	case OptRespXch:
		var m RespXch
		if m, err = ParseRespXch(h.OptInfo); err == nil {
			if h.XID != c.neg.reqXID || c.neg.reqXID == 0 {
				c.t.tracef(trace.RDMA, "drop: RESPXCH xid=%#x answers no request", h.XID)
				return
			}
			c.applyRespXch(m)
			delete(c.neg.optXIDs, h.XID)
		}
	case OptUpdXch:
		var m UpdXch
		if m, err = ParseUpdXch(h.OptInfo); err == nil {
			// Unknown ids are ignored (xcharext s2.1).
			if _, err = c.neg.peer.apply(m.Now); err == nil && m.PendClr {
				delete(c.neg.pending, m.Now.Which)
			}
		}
	default:
		// v2 draft s3.1: an unsupported opttype draws INVAL_OPTION
		// with its XID.
		c.t.stats.optRejected.Add(1)
		c.sendErrorLocked(h, ErrOption)
		return
	}
	if err != nil {
		// xcharext s2.1: an XDR error in the optinfo is reported, as
		// RDMA_ERROR/BAD_HEADER (the draft names no code); the
		// connection goes on and nothing else changes.
		c.t.stats.optRejected.Add(1)
		c.t.tracef(trace.RDMA, "optional xid=%#x type=%d: %v", h.XID, h.OptType, err)
		c.sendErrorLocked(h, ErrChunk)
		return
	}
	if c.neg.st == negV2 {
		c.neg.sendSize = c.neg.v2SendSize()
	}
	c.t.tracef(trace.RDMA, "optional xid=%#x type=%d: peer %+v send=%d", h.XID, h.OptType, c.neg.peer, c.neg.sendSize)
}

// sendErrorLocked answers an RDMA_OPTIONAL we cannot use with an
// RDMA_ERROR echoing its XID and version (RFC 8166 s4.5; v2 draft s3.1
// makes this the one case where a requester sends RDMA_ERROR), carrying
// our credit request like every message we send.
func (c *conn) sendErrorLocked(h *Header, code uint32) {
	eh := Header{XID: h.XID, Vers: h.Vers, Credit: uint32(c.t.cfg.Credits), Proc: ProcError, ErrCode: code}
	if !c.sendOneWayLocked(&eh) {
		c.t.stats.optDropped.Add(1)
		c.t.tracef(trace.RDMA, "optional xid=%#x: no credit for RDMA_ERROR %d; not answered", h.XID, code)
	}
}

// answerReqXch decides a peer's request to change our characteristics
// (xcharext s4.3). Our Receives do not grow, we accept Send With
// Invalidate only if configured to, and we serve backward calls inline
// at most.
func (c *conn) answerReqXch(m ReqXch) RespXch {
	ours := Chars{RBSize: uint32(c.recvSize), ReqRemInv: c.t.cfg.AcceptInvalidate, BRS: BRSInline}
	return answerReqXch(m, ours, func(_ XCharVal, want Chars) xchAnswer {
		switch {
		case want.RBSize > ours.RBSize, want.ReqRemInv && !c.t.cfg.AcceptInvalidate, want.BRS > BRSInline:
			return xchRej
		}
		return xchDone
	})
}

// applyRespXch applies the answer to our REQXCH. xcharext s4.3 only says
// the subsets "should" be disjoint and cover the request; a bit in rej
// wins, then pend, and an entry in none is rejected.
func (c *conn) applyRespXch(m RespXch) {
	for i, v := range c.neg.reqWant {
		switch {
		case m.Rej.Has(i):
		case m.Pend.Has(i):
			c.neg.pending[v.Which] = true
		case m.Done.Has(i):
			c.neg.peer.apply(v)
		}
	}
	c.neg.reqXID, c.neg.reqWant = 0, nil
	c.inflight-- // the REQXCH's credit
	c.pumpLocked()
}

// optionalErrorLocked handles an RDMA_ERROR answering one of our
// RDMA_OPTIONALs; it reports whether h was one.
func (c *conn) optionalErrorLocked(h *Header) bool {
	o, ok := c.neg.optXIDs[h.XID]
	if !ok || h.Proc != ProcError {
		return false
	}
	delete(c.neg.optXIDs, h.XID)
	c.t.stats.optErrors.Add(1)
	switch {
	case o.opt == OptReqXch && h.XID == c.neg.reqXID:
		c.neg.reqXID, c.neg.reqWant = 0, nil
		c.inflight--
	default:
		// A refused one-way message: the peer consumed it.
		c.releaseOneWaySeqLocked(o.seq)
	}
	c.pumpLocked()
	c.t.tracef(trace.RDMA, "optional xid=%#x type=%d refused by peer: error %d", h.XID, o.opt, h.ErrCode)
	return true
}

// PeerChars returns the peer's characteristics as learned on the current
// connection, and whether it announced them with ROPT_INITXCH.
func (t *Transport) PeerChars() (Chars, bool) {
	t.mu.Lock()
	c := t.conn
	t.mu.Unlock()
	if c == nil {
		return DefaultChars, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.neg.peer, c.neg.peerInit
}

// PendingChange reports whether a characteristic change is pending.
func (t *Transport) PendingChange(which uint32) bool {
	t.mu.Lock()
	c := t.conn
	t.mu.Unlock()
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.neg.pending[which]
}
