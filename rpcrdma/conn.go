package rpcrdma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
)

// conn is one connection of a requester: the queue pair, its receive
// buffers, the calls waiting for replies and the credits the responder
// granted (RFC 8166 s3.3).
type conn struct {
	t   *Transport
	qp  verbs.QueuePair
	mrc *mrcache.Cache

	recvSize int // our receive buffers: the peer's largest Send
	// privSendSize is the peer's inline receive size from RFC 8797
	// private data: the version-1 send threshold.
	privSendSize int

	recvBufs [][]byte
	ctx      context.Context
	cancel   context.CancelFunc

	mu       sync.Mutex
	neg      negotiation // version and characteristics; guarded by mu
	pending  map[uint32]*req
	granted  int // credits the responder granted; 1 until the first reply
	inflight int
	wake     chan struct{}
	sends    map[uint64]chan struct{}
	nextWR   uint64
	err      error
	dead     chan struct{}
}

// dial connects to the responder and exchanges RFC 8797 private data.
func (t *Transport) dial(ctx context.Context) (*conn, error) {
	ours := PrivateData{Version: privDataVersion, RemoteInvalidate: t.cfg.AcceptInvalidate,
		InlineSend: t.cfg.InlineSend, InlineRecv: t.cfg.InlineRecv}
	// Post a receive for every credit we may be granted plus the
	// backward direction's calls (RFC 8167 s4.1), in Setup: before the
	// connection is up, so nothing the peer sends finds no buffer.
	recvSize := t.cfg.InlineRecv
	recvBufs := make([][]byte, t.cfg.Credits+t.cfg.BackchannelSlots)
	slab := make([]byte, len(recvBufs)*recvSize)
	for i := range recvBufs {
		recvBufs[i] = slab[i*recvSize : (i+1)*recvSize : (i+1)*recvSize]
	}
	setup := func(qp verbs.QueuePair) error {
		for i, b := range recvBufs {
			if err := qp.PostRecv(uint64(i), b); err != nil {
				return fmt.Errorf("rpcrdma: post receive: %w", err)
			}
		}
		return nil
	}
	params := &verbs.ConnParams{PD: t.pd, PrivateData: ours.Marshal(), CRC: t.cfg.CRC, IRD: t.cfg.IRD, ORD: t.cfg.ORD, Setup: setup}
	dctx, cancel := context.WithTimeout(ctx, t.cfg.DialTimeout)
	defer cancel()
	qp, err := t.cfg.Provider.Dial(dctx, t.addr, params)
	if err != nil {
		return nil, fmt.Errorf("%w: rdma connect %s: %w", oncrpc.ErrConnection, t.addr, err)
	}
	peer, found, err := ParsePrivateData(qp.PeerPrivateData())
	if err != nil {
		qp.Close()
		return nil, fmt.Errorf("rdma connect %s: %w", t.addr, err)
	}
	c := &conn{
		t:            t,
		qp:           qp,
		mrc:          t.mrc,
		recvSize:     t.cfg.InlineRecv,
		privSendSize: min(peer.InlineRecv, t.cfg.InlineSend),
		pending:      make(map[uint32]*req),
		granted:      1, // RFC 8166 s3.3.3: one credit until the first reply
		wake:         make(chan struct{}),
		sends:        make(map[uint64]chan struct{}),
		dead:         make(chan struct{}),
	}
	c.neg = t.startNegotiation(c.privSendSize)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.recvBufs = recvBufs
	t.tracef(trace.RDMA, "connect %s: peer private data found=%v send=%d recv=%d inv=%v; ours send=%d recv=%d credits=%d crc=%v version=%s",
		t.addr, found, peer.InlineSend, peer.InlineRecv, peer.RemoteInvalidate, c.neg.sendSize, c.recvSize, t.cfg.Credits, qp.CRC(), c.neg.state())
	go c.recvLoop()
	go c.sendLoop()
	go func() {
		select {
		case <-qp.Done():
			c.fail(fmt.Errorf("%w: %w", oncrpc.ErrConnection, qp.Err()))
		case <-c.ctx.Done():
		}
	}()
	return c, nil
}

func (c *conn) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

// fail ends the connection: every waiting call gets err, its memory is
// invalidated, and the queue pair is closed. A new connection will be
// made for later calls, with fresh registrations.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	pending := c.pending
	c.pending = nil
	close(c.dead)
	close(c.wake)
	v1Only := c.neg.lostDuringNegotiation()
	c.mu.Unlock()
	if v1Only {
		c.t.markV1Only()
	}
	c.t.tracef(trace.RDMA, "connection %s lost: %v (%d calls failed)", c.t.addr, err, len(pending))
	for _, r := range pending {
		r.invalidate()
		r.err = err
		close(r.done)
	}
	c.cancel()
	c.qp.Close()
}

// acquireCredit waits until fewer calls are in flight than the responder
// granted (RFC 8166 s3.3.1: a requester never exceeds the grant).
func (c *conn) acquireCredit(ctx context.Context) error {
	for {
		c.mu.Lock()
		if c.err != nil {
			err := c.err
			c.mu.Unlock()
			return err
		}
		if c.inflight < c.granted {
			c.inflight++
			c.mu.Unlock()
			return nil
		}
		wake := c.wake
		c.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// wakeLocked lets credit waiters look again.
func (c *conn) wakeLocked() {
	close(c.wake)
	c.wake = make(chan struct{})
}

// postSend sends sgl as one Send and returns a channel closed when the
// send queue completes it (the buffers are then free).
func (c *conn) postSend(sgl [][]byte) (chan struct{}, error) {
	done := make(chan struct{})
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.nextWR++
	wr := c.nextWR
	c.sends[wr] = done
	c.mu.Unlock()
	if err := c.qp.PostSend(verbs.SendWR{WRID: wr, Opcode: verbs.OpSend, SGL: sgl}); err != nil {
		c.mu.Lock()
		delete(c.sends, wr)
		c.mu.Unlock()
		return nil, fmt.Errorf("rpcrdma: post send: %w", err)
	}
	return done, nil
}

func (c *conn) sendLoop() {
	var wc [32]verbs.Completion
	for {
		n, err := c.qp.SendCQ().Poll(c.ctx, wc[:])
		if err != nil {
			c.mu.Lock()
			for wr, ch := range c.sends {
				close(ch)
				delete(c.sends, wr)
			}
			c.mu.Unlock()
			return
		}
		for _, w := range wc[:n] {
			c.mu.Lock()
			ch := c.sends[w.WRID]
			delete(c.sends, w.WRID)
			c.mu.Unlock()
			if ch != nil {
				close(ch)
			}
			if w.Status != verbs.StatusSuccess {
				c.fail(fmt.Errorf("%w: send completion %v (%v)", oncrpc.ErrConnection, w.Status, c.qp.Err()))
			}
		}
	}
}

func (c *conn) recvLoop() {
	var wc [32]verbs.Completion
	for {
		n, err := c.qp.RecvCQ().Poll(c.ctx, wc[:])
		if err != nil {
			return
		}
		for _, w := range wc[:n] {
			if w.Status != verbs.StatusSuccess {
				c.fail(fmt.Errorf("%w: receive completion %v (%v)", oncrpc.ErrConnection, w.Status, c.qp.Err()))
				continue
			}
			if w.WRID >= uint64(len(c.recvBufs)) {
				continue
			}
			buf := c.recvBufs[w.WRID]
			inv := uint32(0)
			if w.Opcode == verbs.OpRecvWithInvalidate {
				inv = w.InvalidatedSTag
			}
			c.receive(buf[:w.ByteLen], inv)
			if err := c.qp.PostRecv(w.WRID, buf); err != nil {
				c.fail(fmt.Errorf("%w: repost receive: %w", oncrpc.ErrConnection, err))
			}
		}
	}
}

// receive handles one inbound message. It runs on the receive loop and
// copies what it keeps, so the buffer can be posted again at once.
func (c *conn) receive(msg []byte, invalidated uint32) {
	var h Header
	hlen, err := h.Decode(msg, true)
	if err != nil {
		// RFC 8166 s4.5: a malformed message is dropped; the call it
		// answers will time out and be retransmitted.
		c.t.stats.dropped.Add(1)
		c.t.tracef(trace.RDMA, "drop: %v", err)
		return
	}
	payload := msg[hlen:]
	if h.Proc == ProcOptional {
		c.receiveOptional(&h)
		return
	}
	if h.Proc == ProcMsg && len(h.Reads) == 0 && len(h.Writes) == 0 && h.Reply == nil {
		if mt, ok := oncrpc.MessageType(payload); ok && mt == oncrpc.MsgCall {
			c.backwardCall(h.XID, append([]byte(nil), payload...))
			return
		}
	}
	c.mu.Lock()
	if c.optionalErrorLocked(&h) {
		c.mu.Unlock()
		return
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
	c.mu.Unlock()
	if r == nil || verdict == dropReply {
		c.t.stats.dropped.Add(1)
		c.t.tracef(trace.RDMA, "drop: reply xid=%#x vers=%d proc=%d (call found: %v)", h.XID, h.Vers, h.Proc, r != nil)
		return
	}
	switch verdict {
	case resendV1:
		// RFC 8166 s5 / v2 s5.2: the probe reached a version-1 peer;
		// send the same call again as version 1 (A-V2-3).
		c.t.stats.fallbacks.Add(1)
		c.t.tracef(trace.RDMA, "negotiate xid=%#x: ERR_VERS %d..%d: falling back to version 1 on this connection", h.XID, h.VersLow, h.VersHigh)
		r.invalidate()
		r.resend = true
		close(r.done)
		return
	case versionMismatch:
		r.invalidate()
		r.err = fmt.Errorf("rpcrdma: %s supports RPC-over-RDMA versions %d..%d only: %w", c.t.addr, h.VersLow, h.VersHigh, ErrVersion)
		close(r.done)
		go c.fail(r.err)
		return
	case confirmedV2:
		c.t.tracef(trace.RDMA, "negotiate xid=%#x: version 2 confirmed", h.XID)
		c.sendInitXch()
	}
	rep, err := r.parseReply(&h, payload, invalidated)
	r.invalidate()
	c.t.tracef(trace.RDMA, "reply xid=%#x proc=%d credits=%d len=%d writes=%v reply=%v inv=%#x err=%v",
		h.XID, h.Proc, h.Credit, len(msg), h.Writes, h.Reply, invalidated, err)
	r.reply, r.err = rep, err
	close(r.done)
}

// backwardCall serves a call from the responder (RFC 8167): the handler's
// reply goes back inline as RDMA_MSG.
func (c *conn) backwardCall(xid uint32, msg []byte) {
	c.t.stats.backward.Add(1)
	hp := c.t.handler.Load()
	go func() {
		var reply []byte
		if hp != nil && *hp != nil {
			reply = (*hp).HandleCall(msg)
		} else if h, _, err := oncrpc.ParseCall(msg); err == nil {
			var e xdr.Encoder
			oncrpc.AppendAcceptedReply(&e, h.XID, oncrpc.ProgUnavail, 0, 0)
			reply = e.Bytes()
		}
		if reply == nil {
			return
		}
		var e xdr.Encoder
		vers, sendSize := c.params()
		hdr := Header{XID: xid, Vers: vers, Credit: uint32(c.t.cfg.BackchannelSlots), Proc: ProcMsg}
		hdr.Append(&e)
		if e.Len()+len(reply) > sendSize {
			// RFC 8167 s4.2: backward messages are inline only; on v2
			// the limit is the peer's XCHAR_RBSIZ.
			c.t.tracef(trace.RDMA, "backward reply xid=%#x: %d bytes exceed the %d-byte inline threshold; dropped", xid, len(reply), sendSize)
			return
		}
		c.t.tracef(trace.RDMA, "backward call xid=%#x len=%d reply=%d", xid, len(msg), len(reply))
		c.postSend([][]byte{e.Bytes(), reply})
	}()
}

// errUnusable marks a reply this requester cannot accept.
var errUnusable = errors.New("rpcrdma: unusable reply")

// parseReply checks a reply against what r offered and builds the
// oncrpc.Reply (RFC 8166 s3.4.6, s4.3).
func (r *req) parseReply(h *Header, payload []byte, invalidated uint32) (*oncrpc.Reply, error) {
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
	rep := &oncrpc.Reply{BulkPlaced: placed > 0}
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
		rep.Msg = r.replyBuf[:n]
		r.replyBuf = nil // handed to the caller
	} else {
		rep.Msg = append([]byte(nil), payload...)
	}
	if len(rep.Msg) < 4 || binary.BigEndian.Uint32(rep.Msg) != r.xid {
		return nil, fmt.Errorf("%w: xid %#x: RPC reply payload has another XID", errUnusable, r.xid)
	}
	r.tr.stats.countChunks(r.kinds, placed)
	return rep, nil
}
