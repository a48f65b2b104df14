package rpcrdma

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/internal/xdr"
)

// Version negotiation (draft-cel-nfsv4-rpcrdma-version-two-00 s5) and the
// requester's side of transport characteristics (xcharext s4).

// probeMaxSend is the largest first message on a connection that may
// reach a version-1 peer (v2 s5: the v1 default inline threshold).
const probeMaxSend = 1024

// v2DefaultInline is the version-2 default inline threshold (v2 s2.3).
const v2DefaultInline = 4096

// v1OnlyFor is how long a server that failed a version-2 negotiation is
// treated as version-1 only (A-V2-8).
const v1OnlyFor = time.Hour

type negState int

const (
	negProbe negState = iota // the first call goes out as version 2
	negV1
	negV2
)

// negotiation is a connection's protocol version and the peer's
// characteristics. It is guarded by conn.mu.
type negotiation struct {
	st        negState
	strict    bool // rdmavers=2: no fallback to version 1
	sendSize  int  // current send threshold
	privSend  int  // version-1 send threshold (RFC 8797 private data)
	inlineMax int  // our own largest Send
	probeSent bool
	fellBack  bool
	anyReply  bool // a non-error reply since negotiation settled

	peer        Chars  // the peer's characteristics (version 2)
	peerNoChg   Subset // those it said will not change
	peerInit    bool   // the peer sent ROPT_INITXCH
	optHeld     int    // credits held by one-way RDMA_OPTIONALs we sent
	reqXID      uint32 // our outstanding ROPT_REQXCH, 0 if none
	reqWant     []XCharVal
	pending     map[uint32]bool // characteristics with a change pending (RESPXCH pend)
	optXIDs     map[uint32]uint32
	initSent    bool // our ROPT_INITXCH went out
	initRefused bool // and the peer refused it
}

// replyLimit is the largest reply the responder will believe it may send
// us inline: what our private data said on version 1; on version 2 our
// XCHAR_RBSIZ once the INITXCH carrying it went out unrefused (a peer that
// does not support it must say so: v2 s3.1), else the 4096 default; for
// the probe, 1024 (A-V2-2).
func (n *negotiation) replyLimit(recvSize int) int {
	switch {
	case n.st == negProbe:
		return min(recvSize, probeMaxSend)
	case n.st == negV2 && !(n.initSent && !n.initRefused):
		return min(recvSize, v2DefaultInline)
	}
	return recvSize
}

// startNegotiation sets up a new connection's version state.
func (t *Transport) startNegotiation(privSend int) negotiation {
	n := negotiation{privSend: privSend, inlineMax: t.cfg.InlineSend, peer: DefaultChars,
		pending: make(map[uint32]bool), optXIDs: make(map[uint32]uint32)}
	switch {
	case t.cfg.Version == Version1:
		n.st, n.sendSize = negV1, privSend
	case t.cfg.Version == Version2:
		n.st, n.strict, n.sendSize = negProbe, true, min(probeMaxSend, t.cfg.InlineSend)
	case t.isV1Only():
		n.st, n.sendSize = negV1, privSend
	default:
		n.st, n.sendSize = negProbe, min(probeMaxSend, t.cfg.InlineSend)
	}
	return n
}

func (n *negotiation) state() string {
	switch n.st {
	case negProbe:
		return "negotiating"
	case negV1:
		return "1"
	}
	return "2"
}

func (n *negotiation) version() uint32 {
	if n.st == negV1 {
		return Version1
	}
	return Version2
}

// lostDuringNegotiation reports whether a connection lost now should
// make the next one start at version 1 (v2 s5.2, A-V2-8).
func (n *negotiation) lostDuringNegotiation() bool {
	return !n.strict && ((n.st == negProbe && n.probeSent) || (n.fellBack && !n.anyReply))
}

// v2SendSize is the version-2 send threshold: the peer's receive buffer
// size (XCHAR_RBSIZ, 4096 by default), capped by our own (A-V2-9).
func (n *negotiation) v2SendSize() int {
	return min(int(n.peer.RBSize), n.inlineMax)
}

type verdict int

const (
	deliverReply    verdict = iota // hand the reply to its call
	dropReply                      // malformed for this connection's version
	resendV1                       // ERR_VERS to the probe: send it again as version 1
	versionMismatch                // no common version
	confirmedV2                    // the probe's reply confirmed version 2
)

// reply checks an incoming reply's version and advances negotiation.
func (n *negotiation) reply(h *Header, isProbe bool) verdict {
	errVers := h.Proc == ProcError && h.ErrCode == ErrVers
	switch n.st {
	case negProbe:
		if !isProbe {
			return dropReply
		}
		if errVers {
			// RFC 8166 s7 / v2 s5.2: choose a version inside the range.
			if h.VersLow <= Version1 && Version1 <= h.VersHigh && !n.strict {
				n.st, n.sendSize, n.fellBack = negV1, n.privSend, true
				return resendV1
			}
			return versionMismatch
		}
		if h.Vers != Version2 {
			return dropReply // v2 s5.3: a reply has its call's version
		}
		if h.Proc == ProcError {
			return deliverReply
		}
		n.st, n.sendSize = negV2, n.v2SendSize()
		return confirmedV2
	case negV1:
		if h.Vers != Version1 && !errVers {
			return dropReply
		}
	case negV2:
		if h.Vers != Version2 && !errVers {
			return dropReply
		}
	}
	if h.Proc != ProcError {
		n.anyReply = true
	}
	return deliverReply
}

// params returns the version and send threshold for the next message.
func (c *conn) params() (uint32, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.neg.version(), c.neg.sendSize
}

// markV1Only remembers that the server does not do version 2.
func (t *Transport) markV1Only() {
	if t.cfg.Version != 0 {
		return
	}
	t.v1Mu.Lock()
	t.v1Until = time.Now().Add(v1OnlyFor)
	t.v1Mu.Unlock()
	t.tracef(trace.RDMA, "negotiate %s: connection lost while negotiating; later connections start at version 1", t.addr)
}

func (t *Transport) isV1Only() bool {
	t.v1Mu.Lock()
	defer t.v1Mu.Unlock()
	return time.Now().Before(t.v1Until)
}

// optXID returns an XID for an RDMA_OPTIONAL we originate. RPC XIDs come
// from the RPC client; these come from a separate random sequence, and the
// peer never matches them against calls (A-XC-7).
func (c *conn) optXIDLocked(opt uint32) uint32 {
	for {
		x := rand.Uint32()
		if _, busy := c.pending[x]; !busy && x != 0 {
			c.neg.optXIDs[x] = opt
			return x
		}
	}
}

// sendOptionalLocked sends an RDMA_OPTIONAL; one-way ones hold a credit
// until the peer's next reply (A-V2-4).
func (c *conn) sendOptional(opt uint32, info []byte, oneWay bool) (uint32, error) {
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, err
	}
	if c.neg.st != negV2 {
		c.mu.Unlock()
		return 0, errors.New("rpcrdma: RDMA_OPTIONAL needs a version-2 connection")
	}
	xid := c.optXIDLocked(opt)
	c.inflight++
	if oneWay {
		c.neg.optHeld++
	}
	c.mu.Unlock()
	var e xdr.Encoder
	h := Header{XID: xid, Vers: Version2, Credit: uint32(c.t.cfg.Credits), Proc: ProcOptional, OptType: opt, OptInfo: info}
	h.Append(&e)
	c.t.tracef(trace.RDMA, "optional xid=%#x type=%d len=%d", xid, opt, e.Len())
	_, err := c.postSend([][]byte{e.Bytes()})
	return xid, err
}

// sendInitXch announces our characteristics as the first message after
// version 2 is confirmed (xcharext s4.1, A-XC-1): our receive buffer size,
// whether we accept Send With Invalidate, and our backward-request
// support; none of them will change.
func (c *conn) sendInitXch() {
	if !c.t.cfg.XChars {
		return
	}
	ours := Chars{RBSize: uint32(c.recvSize), ReqRemInv: c.t.cfg.AcceptInvalidate, BRS: BRSInline}
	m := InitXch{Start: ours.Spec(), NoChg: Subset{}.With(0).With(1).With(2)}
	if _, err := c.sendOptional(OptInitXch, m.Marshal(), true); err != nil {
		c.t.tracef(trace.RDMA, "INITXCH: %v", err)
		return
	}
	c.mu.Lock()
	c.neg.initSent = true
	c.mu.Unlock()
}

// RequestChange asks the peer to change its characteristics with
// ROPT_REQXCH (xcharext s4.2), for example a larger receive buffer; the
// answer comes as ROPT_RESPXCH and, for pending changes, ROPT_UPDXCH.
func (t *Transport) RequestChange(ctx context.Context, want []XCharVal) error {
	c, err := t.connection(ctx)
	if err != nil {
		return err
	}
	if err := c.acquireCredit(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	c.inflight-- // sendOptional counts it again
	busy := c.neg.reqXID != 0
	c.mu.Unlock()
	if busy {
		c.releaseCredit()
		return errors.New("rpcrdma: a characteristics change is already outstanding")
	}
	m := ReqXch{Want: want}
	xid, err := c.sendOptional(OptReqXch, m.Marshal(), false)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.neg.reqXID, c.neg.reqWant = xid, want
	c.mu.Unlock()
	return nil
}

// receiveOptional handles an RDMA_OPTIONAL from the responder.
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
		// A-XC-1: accepted any time after connecting.
		var m InitXch
		if m, err = ParseInitXch(h.OptInfo); err == nil {
			if err = c.neg.peer.applySpec(m.Start); err == nil {
				c.neg.peerNoChg, c.neg.peerInit = m.NoChg, true
			}
		}
	case OptReqXch:
		var m ReqXch
		if m, err = ParseReqXch(h.OptInfo); err == nil {
			resp := c.answerReqXch(m)
			go c.sendOptionalReply(h.XID, OptRespXch, resp.Marshal())
		}
	case OptRespXch:
		var m RespXch
		if m, err = ParseRespXch(h.OptInfo); err == nil {
			if h.XID != c.neg.reqXID || c.neg.reqXID == 0 {
				c.t.tracef(trace.RDMA, "drop: RESPXCH xid=%#x answers no request", h.XID)
				return
			}
			c.applyRespXch(m)
		}
	case OptUpdXch:
		var m UpdXch
		if m, err = ParseUpdXch(h.OptInfo); err == nil {
			// Unknown ids are ignored (A-XC-10).
			if _, err = c.neg.peer.apply(m.Now); err == nil && m.PendClr {
				delete(c.neg.pending, m.Now.Which)
			}
		}
	default:
		// v2 s3.1: an unsupported opttype draws INVAL_OPTION with its XID.
		c.t.stats.optRejected.Add(1)
		go c.sendErrorReply(h.XID, ErrOption)
		return
	}
	if err != nil {
		// A-XC-5: an XDR error in the optinfo draws BAD_HEADER; the
		// connection goes on and nothing else changes.
		c.t.stats.optRejected.Add(1)
		c.t.tracef(trace.RDMA, "optional xid=%#x type=%d: %v", h.XID, h.OptType, err)
		go c.sendErrorReply(h.XID, ErrChunk)
		return
	}
	if c.neg.st == negV2 {
		c.neg.sendSize = c.neg.v2SendSize()
	}
	c.t.tracef(trace.RDMA, "optional xid=%#x type=%d: peer %+v send=%d", h.XID, h.OptType, c.neg.peer, c.neg.sendSize)
}

// answerReqXch decides a peer's request to change our characteristics
// (xcharext s4.3): done, rej and pend are disjoint and cover the request.
func (c *conn) answerReqXch(m ReqXch) RespXch {
	var r RespXch
	seen := map[uint32]bool{}
	for i, v := range m.Want {
		if seen[v.Which] { // A-XC-9: later duplicates are rejected
			r.Rej = r.Rej.With(i)
			continue
		}
		seen[v.Which] = true
		want := Chars{RBSize: uint32(c.recvSize), ReqRemInv: c.t.cfg.AcceptInvalidate, BRS: BRSInline}
		known, err := want.apply(v)
		switch {
		case !known || err != nil:
			r.Rej = r.Rej.With(i)
		case want.RBSize > uint32(c.recvSize):
			r.Rej = r.Rej.With(i) // our Receives do not grow
		case want.ReqRemInv && !c.t.cfg.AcceptInvalidate:
			r.Rej = r.Rej.With(i)
		case want.BRS > BRSInline:
			r.Rej = r.Rej.With(i)
		default:
			r.Done = r.Done.With(i)
		}
	}
	return r
}

// applyRespXch applies the answer to our REQXCH, reading overlaps and
// gaps as A-XC-8 says: rej wins, then pend, and uncovered means rejected.
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
	if c.err == nil {
		c.wakeLocked()
	}
}

func (c *conn) sendOptionalReply(xid, opt uint32, info []byte) {
	var e xdr.Encoder
	h := Header{XID: xid, Vers: Version2, Credit: uint32(c.t.cfg.Credits), Proc: ProcOptional, OptType: opt, OptInfo: info}
	h.Append(&e)
	c.postSend([][]byte{e.Bytes()})
}

// sendErrorReply answers an RDMA_OPTIONAL we cannot use (A-V2-6: the one
// case where a requester sends RDMA_ERROR).
func (c *conn) sendErrorReply(xid, code uint32) {
	var e xdr.Encoder
	h := Header{XID: xid, Vers: Version2, Proc: ProcError, ErrCode: code}
	h.Append(&e)
	c.postSend([][]byte{e.Bytes()})
}

// optionalError handles an RDMA_ERROR answering one of our RDMA_OPTIONALs;
// it reports whether h was one.
func (c *conn) optionalErrorLocked(h *Header) bool {
	opt, ok := c.neg.optXIDs[h.XID]
	if !ok || h.Proc != ProcError {
		return false
	}
	delete(c.neg.optXIDs, h.XID)
	c.t.stats.optErrors.Add(1)
	if opt == OptInitXch {
		c.neg.initRefused = true
	}
	if opt == OptReqXch && h.XID == c.neg.reqXID {
		c.neg.reqXID, c.neg.reqWant = 0, nil
		c.inflight--
	}
	c.t.tracef(trace.RDMA, "optional xid=%#x type=%d refused by peer: error %d", h.XID, opt, h.ErrCode)
	return true
}

// SendOptional sends an RDMA_OPTIONAL message on the current version-2
// connection, for tests and diagnostics; one-way messages hold a credit
// until the peer's next reply (A-V2-4).
func (t *Transport) SendOptional(ctx context.Context, opt uint32, info []byte) error {
	c, err := t.connection(ctx)
	if err != nil {
		return err
	}
	_, err = c.sendOptional(opt, info, true)
	return err
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
