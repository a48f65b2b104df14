package rpcrdma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
)

// The responder's side of the backward direction (RFC 8167): the server
// behind the responder calls the requester, as NFSv4.1 callbacks do
// (CB_RECALL, CB_SEQUENCE), and the requester's replies come back on the
// same connection. Backward messages are inline only: our requester
// announces XCHAR_BRS INLINE (xcharext s3.3) and Linux has no other.

// backwardSlots is how many backward calls a connection has in flight at
// once. knfsd sends its callbacks with a credit of 2 (wire-facts.md), and
// a requester posts receive buffers for at least that many (RFC 8167
// s4.1: backward calls consume the requester's extra receive buffers);
// ours posts 4, Linux's 16. Each slot has a receive buffer of ours for
// its reply beyond the forward grant (recvCount).
const backwardSlots = 2

// recvCount is how many receive buffers a connection posts for a grant of
// credits: one per forward call in progress, one per backward reply
// outstanding, and 4 for RDMA_OPTIONALs and a call that arrives as a
// reply goes out.
func recvCount(credits int) int { return credits + backwardSlots + 4 }

// ErrBackwardRejected is returned by ResponderConn.Call when the requester
// answered a backward call with RDMA_ERROR.
var ErrBackwardRejected = errors.New("rpcrdma: backward call answered with RDMA_ERROR")

// ResponderConn is one connection a Responder accepted, as ResponderConfig.NewConn
// sees it.
type ResponderConn struct {
	c *serverConn
}

// RemoteAddr returns the requester's address.
func (rc *ResponderConn) RemoteAddr() net.Addr { return rc.c.qp.RemoteAddr() }

// Close breaks the connection; the requester reconnects. A relay closes
// it when its own connection to the server broke: the server's session
// state bound to that connection (its back channel) went with it.
func (rc *ResponderConn) Close() { rc.c.qp.Close() }

// Call sends the RPC call msg (a whole call message, from its XID) to the
// requester as a backward call (RFC 8167 s4), inline, and returns the
// requester's whole reply message. It waits for one of the connection's
// backward slots, then for the reply, until ctx or the connection ends.
func (rc *ResponderConn) Call(ctx context.Context, msg []byte) ([]byte, error) {
	c := rc.c
	if len(msg) < 8 {
		return nil, fmt.Errorf("rpcrdma: backward call: %d-byte message", len(msg))
	}
	xid := binary.BigEndian.Uint32(msg)
	c.s.stats.backward.Add(1)
	reply, err := c.backwardCall(ctx, xid, msg)
	if err != nil {
		c.s.stats.backwardErrors.Add(1)
		c.tracef("backward call xid=%#x: %v", xid, err)
		return nil, fmt.Errorf("rpcrdma: backward call xid %#x to %v: %w", xid, c.qp.RemoteAddr(), err)
	}
	c.tracef("backward call xid=%#x len=%d reply=%d", xid, len(msg), len(reply))
	return reply, nil
}

func (c *serverConn) backwardCall(ctx context.Context, xid uint32, msg []byte) ([]byte, error) {
	select {
	case c.bcSlots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.ctx.Done():
		return nil, verbs.ErrClosed
	}
	defer func() { <-c.bcSlots }()
	ch := make(chan []byte, 1)
	c.bcMu.Lock()
	if _, dup := c.bcPending[xid]; dup {
		c.bcMu.Unlock()
		return nil, errors.New("a backward call with this XID is in flight")
	}
	c.bcPending[xid] = ch
	c.bcMu.Unlock()
	defer func() {
		c.bcMu.Lock()
		delete(c.bcPending, xid)
		c.bcMu.Unlock()
	}()

	c.mu.Lock()
	vers := max(c.vers, Version1)
	c.mu.Unlock()
	// RFC 8167 s4.1: the credit field of a backward call asks for the
	// requester's backward credits; rdma_xid is the RPC XID (s4.5.2).
	h := Header{XID: xid, Vers: vers, Credit: backwardSlots, Proc: ProcMsg}
	var e xdr.Encoder
	h.Append(&e)
	sendSize, _ := c.sendParams()
	if e.Len()+len(msg) > sendSize {
		// RFC 8167 s5: no chunks in the backward direction here.
		return nil, fmt.Errorf("%d-byte call exceeds the requester's %d-byte inline threshold", e.Len()+len(msg), sendSize)
	}
	c.sendMu.Lock()
	err := c.postSend(verbs.OpSend, 0, e.Bytes(), msg)
	c.sendMu.Unlock()
	if err != nil {
		return nil, err
	}
	select {
	case reply := <-ch:
		if reply == nil {
			return nil, ErrBackwardRejected
		}
		return reply, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.ctx.Done():
		return nil, fmt.Errorf("connection ended: %w", verbs.ErrClosed)
	}
}

// backwardReply takes msg, just received, if it answers a backward call:
// an RDMA_MSG carrying an RPC reply (RFC 8167 s4: the RPC message type
// tells it from a call), or an RDMA_ERROR with the XID of a backward call
// in flight. It reports whether it took msg; a reply to no call of ours
// is dropped.
func (c *serverConn) backwardReply(msg []byte) bool {
	if len(msg) < MinHeaderLen {
		return false
	}
	proc := binary.BigEndian.Uint32(msg[12:])
	if proc != ProcMsg && proc != ProcError {
		return false
	}
	var h Header
	hlen, err := h.Decode(msg, c.s.cfg.MaxVersion >= Version2)
	if err != nil {
		return false
	}
	if proc == ProcMsg {
		if mt, ok := oncrpc.MessageType(msg[hlen:]); !ok || mt != oncrpc.MsgReply {
			return false
		}
	}
	c.bcMu.Lock()
	ch := c.bcPending[h.XID]
	delete(c.bcPending, h.XID)
	c.bcMu.Unlock()
	switch {
	case ch != nil && proc == ProcMsg:
		ch <- msg[hlen:]
	case ch != nil:
		ch <- nil
	case proc == ProcMsg:
		c.tracef("drop: reply xid=%#x to no backward call in flight", h.XID)
	default:
		return false // an RDMA_ERROR for something else: handleCall discards it
	}
	return true
}

// responderCounters are the Responder's counters for ResponderStats.
type responderCounters struct {
	accepted, refused                    atomic.Uint64
	bytesIn, bytesOut                    atomic.Uint64
	chunkErrors, replyErrors, unanswered atomic.Uint64
	overruns, readTimeouts               atomic.Uint64
	backward, backwardErrors             atomic.Uint64
	notAllowed, overLimit, idleClosed    atomic.Uint64
}

// ResponderStats are a Responder's counters since it started.
type ResponderStats struct {
	Connections   int    // open now
	Accepted      uint64 // connections accepted
	Refused       uint64 // connections NewConn refused
	Calls         uint64 // calls handed to the handler
	BytesIn       uint64 // bytes of the calls, Read chunks included
	BytesOut      uint64 // bytes of the replies the handler returned, Write chunks included
	ChunkErrors   uint64 // calls answered with ERR_CHUNK: chunks that could not be pulled in
	ReplyErrors   uint64 // replies that could not be sent
	Unanswered    uint64 // calls the handler returned no reply for
	Overruns      uint64 // connections closed for exceeding the credit grant
	ReadTimeouts  uint64 // connections closed for leaving an RDMA Read unanswered
	Backward      uint64 // backward calls sent (RFC 8167)
	BackwardFails uint64 // backward calls that got no reply
	NotAllowed    uint64 // connections refused by ResponderConfig.Allow
	OverLimit     uint64 // connections refused by MaxConns or MaxConnsPerSource
	IdleClosed    uint64 // connections closed after IdleTimeout with nothing received
}

// Stats returns the responder's counters.
func (s *Responder) Stats() ResponderStats {
	s.mu.Lock()
	n := len(s.conns)
	s.mu.Unlock()
	st := &s.stats
	return ResponderStats{
		Connections: n, Accepted: st.accepted.Load(), Refused: st.refused.Load(), Calls: s.calls.Load(),
		BytesIn: st.bytesIn.Load(), BytesOut: st.bytesOut.Load(),
		ChunkErrors: st.chunkErrors.Load(), ReplyErrors: st.replyErrors.Load(), Unanswered: st.unanswered.Load(),
		Overruns: st.overruns.Load(), ReadTimeouts: st.readTimeouts.Load(),
		Backward: st.backward.Load(), BackwardFails: st.backwardErrors.Load(),
		NotAllowed: st.notAllowed.Load(), OverLimit: st.overLimit.Load(), IdleClosed: st.idleClosed.Load(),
	}
}
