package rpcrdma

import (
	"fmt"
	"time"

	"github.com/rdmafs/rdmafs/internal/trace"
)

// Version negotiation (draft-cel-nfsv4-rpcrdma-version-two-00 s5). The
// RDMA_OPTIONAL messages of version 2 and the requester's side of
// transport characteristics are in optional.go.

// probeMaxSend is the largest first message on a connection that may
// reach a version-1 peer (v2 draft s5: the version-1 default inline
// threshold).
const probeMaxSend = 1024

// v2DefaultInline is the version-2 default inline threshold, and the
// smallest receive buffer a version-2 endpoint may post (v2 draft s2.3).
const v2DefaultInline = 4096

// v1OnlyFor is how long a server that failed a version-2 negotiation is
// treated as version-1 only (v2 draft s5.2 leaves "lost immediately"
// open; an hour keeps a v1 server from being probed on every reconnect).
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
	privReply int  // version-1 reply threshold (RFC 8797 private data)
	recvMax   int  // our own reply threshold (InlineRecv): never above it
	inlineMax int  // our own largest Send
	probeSent bool
	fellBack  bool
	anyReply  bool // a non-error reply since negotiation settled

	peer       Chars  // the peer's characteristics (version 2)
	peerNoChg  Subset // those it said will not change
	peerInit   bool   // the peer sent ROPT_INITXCH
	reqXID     uint32 // our outstanding ROPT_REQXCH, 0 if none
	reqWant    []XCharVal
	pending    map[uint32]bool    // characteristics with a change pending (RESPXCH pend)
	optXIDs    map[uint32]optSent // our RDMA_OPTIONALs an RDMA_ERROR may answer
	initWanted bool               // our ROPT_INITXCH waits for a credit
	initSent   bool               // our ROPT_INITXCH went out
	respWanted *optReply          // a ROPT_RESPXCH waiting for a credit
}

// optSent is an RDMA_OPTIONAL we sent.
type optSent struct {
	opt uint32
	seq uint64 // its place in the connection's message order
}

// replyLimit is the reply inline threshold (RFC 8166 s3.3.2): the
// largest reply the responder may send us inline, so the size above
// which a call needs a Reply chunk. On version 1 it is the smaller of
// the responder's largest Send and our receive buffers, as RFC 8797
// private data says (1024 each without it: RFC 8166 s3.3.3). For the
// probe it is 1024: the peer may speak version 1 only (v2 draft s5). On
// version 2 it is 4096 (v2 draft s2.3) even after our ROPT_INITXCH
// announced larger buffers: nothing tells us the peer took note of it
// (xcharext s4.1). It is never above our own configured threshold.
func (n *negotiation) replyLimit(recvSize int) int {
	limit := min(recvSize, n.recvMax)
	switch n.st {
	case negProbe:
		return min(limit, probeMaxSend)
	case negV2:
		return min(limit, v2DefaultInline)
	}
	return min(limit, n.privReply)
}

// startNegotiation sets up a new connection's version state. Version 2
// needs receive buffers of at least 4096 bytes (v2 draft s2.3); dial
// posts them unless the transport speaks version 1 only.
func (t *Transport) startNegotiation(privSend, privReply, recvSize int) (negotiation, error) {
	n := negotiation{privSend: privSend, privReply: privReply, recvMax: t.cfg.InlineRecv, inlineMax: t.cfg.InlineSend, peer: DefaultChars,
		pending: make(map[uint32]bool), optXIDs: make(map[uint32]optSent)}
	v2ok := recvSize >= v2DefaultInline
	switch {
	case t.cfg.Version == Version1:
		n.st, n.sendSize = negV1, privSend
	case t.cfg.Version == Version2 && !v2ok:
		return n, fmt.Errorf("rpcrdma: version 2 needs receive buffers of at least %d bytes (draft-cel-nfsv4-rpcrdma-version-two s2.3), have %d", v2DefaultInline, recvSize)
	case t.cfg.Version == Version2:
		n.st, n.strict, n.sendSize = negProbe, true, min(probeMaxSend, t.cfg.InlineSend)
	case !v2ok || t.isV1Only():
		n.st, n.sendSize = negV1, privSend
	default:
		n.st, n.sendSize = negProbe, min(probeMaxSend, t.cfg.InlineSend)
	}
	return n, nil
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
// make the next one start at version 1 (v2 draft s5.2: lost right after
// ERR_VERS, or while the probe was unanswered).
func (n *negotiation) lostDuringNegotiation() bool {
	return !n.strict && ((n.st == negProbe && n.probeSent) || (n.fellBack && !n.anyReply))
}

// v2SendSize is the version-2 send threshold: the peer's receive buffer
// size (XCHAR_RBSIZ, 4096 by default: xcharext s3.1), capped by our own
// largest Send.
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

// classify decides what a reply means for the connection's version,
// without changing anything: the reply may still be found malformed.
func (n *negotiation) classify(h *Header, isProbe bool) verdict {
	errVers := h.Proc == ProcError && h.ErrCode == ErrVers
	switch n.st {
	case negProbe:
		if !isProbe {
			return dropReply
		}
		if errVers {
			// RFC 8166 s4.5.1, v2 draft s5.2: choose a version inside
			// the range; the ERR_VERS is believed whatever its own
			// version word says (RFC 8166 s7).
			if h.VersLow <= Version1 && Version1 <= h.VersHigh && !n.strict {
				return resendV1
			}
			return versionMismatch
		}
		if h.Vers != Version2 {
			return dropReply // v2 draft s5.3: a reply has its call's version
		}
		if h.Proc == ProcError {
			return deliverReply
		}
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
	return deliverReply
}

// commit applies what an accepted reply means for the version.
func (n *negotiation) commit(h *Header, v verdict) {
	switch v {
	case resendV1:
		n.st, n.sendSize, n.fellBack = negV1, n.privSend, true
	case confirmedV2:
		n.st, n.sendSize = negV2, n.v2SendSize()
	case deliverReply:
		if h.Proc != ProcError && n.st != negProbe {
			n.anyReply = true
		}
	}
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
