package rpcrdma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
)

// Responder is the server side of RPC-over-RDMA: it accepts connections,
// pulls in Read chunks, calls the handler, and returns replies inline or
// through Write and Reply chunks; it sends backward calls to requesters
// (RFC 8167). "rdmafs relay" puts it in front of a TCP NFS server; tests
// use it as the peer whose behaviour they control.
type Responder struct {
	cfg  ResponderConfig
	ln   verbs.Listener
	pd   *verbs.ProtectionDomain
	pool *mrcache.Pool // registered memory for every buffer the queue pairs use

	mu    sync.Mutex
	conns map[*serverConn]struct{}
	wg    sync.WaitGroup

	// Calls counts calls handled; MaxInFlight is the most calls that were
	// ever between arrival and reply on one connection.
	recvBufs sync.Map // verbs.QueuePair -> *connSetup, by setupQP

	calls       atomic.Uint64
	maxInFlight atomic.Int64
	sendInvs    atomic.Uint64
	optErrors   atomic.Uint64 // RDMA_ERRORs sent for RDMA_OPTIONALs
	stats       responderCounters
	gate        connGate
}

// SendInvalidates returns how many replies used Send With Invalidate.
func (s *Responder) SendInvalidates() uint64 { return s.sendInvs.Load() }

// OptionalErrors returns how many RDMA_OPTIONALs were refused.
func (s *Responder) OptionalErrors() uint64 { return s.optErrors.Load() }

// Listen starts a responder on addr ("127.0.0.1:0" for a free port).
func Listen(addr string, cfg ResponderConfig) (*Responder, error) {
	if cfg.Handler == nil && cfg.NewConn == nil {
		return nil, errors.New("rpcrdma: listen: a responder needs a Handler or NewConn")
	}
	if cfg.Credits <= 0 {
		cfg.Credits = 32
	}
	if cfg.InlineSend <= 0 {
		cfg.InlineSend = 4096
	}
	if cfg.InlineRecv <= 0 {
		cfg.InlineRecv = 4096
	}
	cfg.InlineRecv = recvFloor(cfg.InlineRecv)
	if cfg.MaxVersion <= 0 {
		cfg.MaxVersion = Version1
	}
	if cfg.MaxRecv <= 0 {
		cfg.MaxRecv = 64 << 10
	}
	if cfg.Memory <= 0 {
		cfg.Memory = defaultMemory
	}
	if cfg.ConnMemory <= 0 {
		cfg.ConnMemory = cfg.Memory / defaultShareDiv
	}
	// Each half of the share (responder_limits.go) holds at least the
	// largest buffer asked of it at once beside the receive buffers: a
	// call rebuilt in one slab chunk, or a wait for it could never end.
	cfg.ConnMemory = max(cfg.ConnMemory, 2*(mrcache.ChunkSize+int64(recvCount(cfg.Credits))*int64(cfg.MaxRecv)))
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = defaultReadTimeout
	}
	pd := verbs.NewProtectionDomain()
	if dp, ok := cfg.Provider.(verbs.DomainProvider); ok {
		pd = dp.NewProtectionDomain()
	}
	s := &Responder{cfg: cfg, pd: pd, pool: mrcache.New(pd, cfg.Memory), conns: make(map[*serverConn]struct{})}
	ours := PrivateData{Version: privDataVersion, RemoteInvalidate: false, InlineSend: cfg.InlineSend, InlineRecv: cfg.InlineRecv}
	// Receive buffers are posted in Setup, before the connection is
	// accepted: the requester's first Send must find one (RFC 5040 s5.3).
	ln, err := cfg.Provider.Listen(addr, &verbs.ConnParams{PD: s.pd, PrivateData: ours.Marshal(), Setup: s.setupQP})
	if err != nil {
		return nil, fmt.Errorf("rpcrdma: listen %s: %w", addr, err)
	}
	s.ln = ln
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// Addr returns the listening address.
func (s *Responder) Addr() string { return s.ln.Addr().String() }

// Buffers returns the responder's registered memory. A Handler that
// implements oncrpc.ViewHandler may build replies in it and return them
// as views of the buffers (oncrpc.Lent): the bulk data of such a reply is
// RDMA-Written from where it lies, without a copy, and the reply is
// released (ReleaseView) once those Writes have completed.
func (s *Responder) Buffers() *mrcache.Pool { return s.pool }

// Calls returns the number of calls handled.
func (s *Responder) Calls() uint64 { return s.calls.Load() }

// MaxInFlight returns the most calls a connection had in progress at once.
func (s *Responder) MaxInFlight() int64 { return s.maxInFlight.Load() }

// Close stops listening and closes every connection.
func (s *Responder) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.qp.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.pool.Close()
	return err
}

// Shutdown stops accepting connections, waits until no connection has a
// call in progress or ctx ends, and then closes every connection (Close).
// Replies already handed to the queue pairs may be flushed by the close;
// the requesters retransmit those calls after they reconnect.
func (s *Responder) Shutdown(ctx context.Context) error {
	lerr := s.ln.Close()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for s.busy() {
		select {
		case <-ctx.Done():
			s.Close()
			return fmt.Errorf("rpcrdma: responder shutdown: calls still in progress: %w", ctx.Err())
		case <-tick.C:
		}
	}
	s.Close() // its listener's second Close fails, as it should
	return lerr
}

// busy reports whether any connection has a call in progress.
func (s *Responder) busy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.inFlight.Load() > 0 {
			return true
		}
	}
	return false
}

// serverConn is one accepted connection.
type serverConn struct {
	s        *Responder
	qp       verbs.QueuePair
	privSend int  // version-1 send threshold from RFC 8797 private data
	peerInv  bool // version 1: the requester accepts Send With Invalidate

	handler oncrpc.CallHandler // ResponderConfig.Handler, or what NewConn made

	// The backward direction (RFC 8167, responder_backward.go): calls
	// we send, at most backwardSlots at once, waiting for their replies
	// by XID.
	bcSlots   chan struct{}
	bcMu      sync.Mutex
	bcPending map[uint32]chan []byte

	recvBufs []*mrcache.Buffer // posted by Responder.setupQP, owned by serve
	posted   atomic.Int32      // receive buffers posted: the grant (responder_recv.go)
	recvSGL  [][1]verbs.SGE    // by WRID: the scatter list of the posted buffer, owned by serve

	// ctx ends with the connection: waits for memory end with it.
	ctx    context.Context
	cancel context.CancelFunc
	// The connection's share of registered memory, in two halves:
	// buffers the peer fills (receives, RDMA Read sinks) and buffers
	// we send from (Sends, RDMA Write sources). A call holds its
	// sink while its reply waits for a source; with one budget, calls
	// holding all of it would wait for each other forever.
	mem, out *connBudget
	slots    chan struct{} // one per call in progress, at most the grant

	mu        sync.Mutex // guards the version-2 state below
	vers      uint32     // 0 until the first call, then its version
	peerChars Chars      // the requester's characteristics (version 2)
	recvSize  int        // our receive buffers' size, as announced
	growTo    int        // REQXCH asked for this size; buffers being replaced
	oldBufs   int        // posted buffers still smaller than growTo
	growXID   uint32

	inFlight     atomic.Int64
	lastRecv     atomic.Int64 // when the last message arrived, in Unix nanoseconds (IdleTimeout)
	readTimedOut atomic.Bool  // a Read chunk went unanswered past ReadTimeout
	sendMu       sync.Mutex   // orders a reply's RDMA Writes before its Send
	wr           atomic.Uint64
	doneMu       sync.Mutex
	onDone       map[uint64]wrDone // by WRID, run by sendLoop; guarded by doneMu
	ended        bool              // the queue pair is closed and its completions run; guarded by doneMu
}

func (c *serverConn) tracef(format string, args ...any) {
	if c.s.cfg.Tracer.On(trace.RDMA) {
		c.s.cfg.Tracer.Printf(trace.RDMA, "responder: "+format, args...)
	}
}

func (c *serverConn) serve() {
	bufs := c.recvBufs
	ctx, cancel := c.ctx, c.cancel
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		c.sendLoop(ctx)
	}()
	stopIdle := c.watchIdle()
	defer func() {
		stopIdle()
		// Closing flushes every work request; the send loop then runs
		// their completions, which give the buffers back.
		c.qp.Close()
		cancel()
		<-sendDone
		// Work requests posted as the queue pair closed may have no
		// completion the send loop saw: the queue pair, closed, no
		// longer touches their memory, and nothing is posted from now
		// on (postSGE), so what they held goes back here.
		c.doneMu.Lock()
		c.ended = true
		left := c.onDone
		c.onDone = nil
		c.doneMu.Unlock()
		for _, d := range left {
			d.release(c)
		}
		for _, b := range bufs {
			c.putBuf(b, true)
		}
	}()
	var wc [16]verbs.Completion
	for {
		n, err := c.qp.RecvCQ().Poll(ctx, wc[:])
		if err != nil {
			return
		}
		c.touch()
		for _, w := range wc[:n] {
			if w.Status != verbs.StatusSuccess {
				return
			}
			msg := append([]byte(nil), bufs[w.WRID].Bytes()[:w.ByteLen]...)
			bufs[w.WRID] = c.nextRecvBuf(bufs[w.WRID])
			if c.repostRecv(w.WRID, bufs[w.WRID]) != nil {
				return
			}
			if c.backwardReply(msg) {
				continue // RFC 8167 s4: a reply takes no forward credit
			}
			if !c.enter() {
				// RFC 8166 s3.3.1: the requester sent more than we
				// granted; "the RDMA layer may signal an error,
				// possibly terminating the connection". The grant
				// bounds the calls in progress, so it is closed.
				c.tracef("closing: a message beyond the %d calls in progress the grant allows", cap(c.slots))
				c.s.stats.overruns.Add(1)
				return
			}
			bufs = c.growRecv(bufs)
			if len(msg) >= 16 && binary.BigEndian.Uint32(msg[12:]) == ProcOptional {
				// Characteristics apply in arrival order, before any
				// call that follows them.
				c.handle(msg)
				continue
			}
			go c.handle(msg)
		}
	}
}

// sendLoop runs the completion callbacks of send queue work requests;
// once ctx ends (after the queue pair was closed) it runs those of the
// flushed ones too.
func (c *serverConn) sendLoop(ctx context.Context) {
	var wc [16]verbs.Completion
	run := func(ws []verbs.Completion) {
		for _, w := range ws {
			if d, ok := c.takeDone(w.WRID); ok {
				d.run(c, w)
			}
		}
	}
	for {
		n, err := c.qp.SendCQ().Poll(ctx, wc[:])
		if err != nil {
			for {
				k := c.qp.SendCQ().TryPoll(wc[:])
				if k == 0 {
					return
				}
				run(wc[:k])
			}
		}
		run(wc[:n])
	}
}

// postSend posts a Send (or Send With Invalidate) of the concatenated
// pieces, copied into a registered buffer that goes back to the pool when
// the Send completes.
func (c *serverConn) postSend(op verbs.Opcode, invalidate uint32, pieces ...[]byte) error {
	n := 0
	for _, p := range pieces {
		n += len(p)
	}
	buf, err := c.getBuf(n, false, false)
	if err != nil {
		return err
	}
	k, mem := 0, buf.Bytes()
	for _, p := range pieces {
		k += copy(mem[k:], p)
	}
	return c.post(verbs.SendWR{WRID: c.wr.Add(1), Opcode: op, InvalidateSTag: invalidate}, buf, n, wrDone{})
}

// wrDone is what the completion of a send queue work request does, in
// this order: copy a transport buffer out to copyTo (an RDMA Read through
// a bounce buffer, on success only), hand the completion to ch, give buf
// back to the pool, drop a hold on ref. Only then may the memory be
// reused: the queue pair no longer touches it.
type wrDone struct {
	buf    *mrcache.Buffer
	in     bool // buf is the sink of an RDMA Read (see getBuf)
	copyTo []byte
	ch     chan<- verbs.Completion
	ref    *replyRef
}

func (d wrDone) run(c *serverConn, w verbs.Completion) {
	if d.copyTo != nil && w.Status == verbs.StatusSuccess {
		copy(d.copyTo, d.buf.Bytes())
	}
	if d.ch != nil {
		d.ch <- w
	}
	d.release(c)
}

// release gives back what the work request held, without a completion
// (it could not be posted) or after one.
func (d wrDone) release(c *serverConn) {
	if d.buf != nil {
		c.putBuf(d.buf, d.in)
	}
	if d.ref != nil {
		d.ref.drop()
	}
}

// takeDone removes and returns the completion work of wrid.
func (c *serverConn) takeDone(wrid uint64) (wrDone, bool) {
	c.doneMu.Lock()
	d, ok := c.onDone[wrid]
	delete(c.onDone, wrid)
	c.doneMu.Unlock()
	return d, ok
}

// post posts wr with the first n bytes of buf as its one SGE; buf goes
// back to the pool once wr has completed (d.buf is set to it).
func (c *serverConn) post(wr verbs.SendWR, buf *mrcache.Buffer, n int, d wrDone) error {
	d.buf = buf
	sge, err := buf.SGE(0, max(n, 1))
	if err != nil {
		d.release(c)
		return fmt.Errorf("rpcrdma: responder: post %v: %w", wr.Opcode, err)
	}
	sge.Length = uint32(n)
	return c.postSGE(wr, sge, d)
}

// postSGE posts wr with sge as its one SGE; d runs once wr has completed,
// or its release at once if wr could not be posted.
func (c *serverConn) postSGE(wr verbs.SendWR, sge verbs.SGE, d wrDone) error {
	wr.SGL = []verbs.SGE{sge}
	c.doneMu.Lock()
	if c.ended {
		c.doneMu.Unlock()
		d.release(c)
		return fmt.Errorf("rpcrdma: responder: post %v: %w", wr.Opcode, verbs.ErrClosed)
	}
	if c.onDone == nil {
		c.onDone = make(map[uint64]wrDone)
	}
	c.onDone[wr.WRID] = d
	c.doneMu.Unlock()
	if err := c.qp.PostSend(wr); err != nil {
		if d, ok := c.takeDone(wr.WRID); ok {
			d.release(c)
		}
		return err
	}
	return nil
}

// replyRef keeps a handler's reply alive while RDMA Writes straight
// from it are in flight, and gives it back to the handler
// (oncrpc.ReplyReleaser) when the last one completes. A nil replyRef
// means the handler does not recycle replies: its data is copied.
type replyRef struct {
	n     atomic.Int32
	reply oncrpc.View
	// One of these gives it back (kept as interfaces: a method value
	// would cost every reply an allocation).
	viewHandler oncrpc.ViewHandler
	releaser    oncrpc.ReplyReleaser
}

func (r *replyRef) hold() { r.n.Add(1) }

func (r *replyRef) drop() {
	if r.n.Add(-1) == 0 {
		if r.viewHandler != nil {
			r.viewHandler.ReleaseView(r.reply)
		} else {
			r.releaser.ReleaseReply(r.reply.Bytes())
		}
	}
}

// handle serves one message, in the call slot serve took for it.
func (c *serverConn) handle(msg []byte) {
	// A call is in progress from its arrival until its reply is about
	// to go out: the requester cannot send the next one before that
	// reply, so the slot is free again by the time it can.
	left := false
	leave := func() {
		if !left {
			left = true
			c.leave()
		}
	}
	defer leave()
	c.handleCall(msg, leave)
}

// handleCall serves one message; leave gives its call slot back.
func (c *serverConn) handleCall(msg []byte, leave func()) {
	var h Header
	hlen, err := h.Decode(msg, c.s.cfg.MaxVersion >= Version2)
	if err != nil {
		c.tracef("drop: %v", err)
		return
	}
	if h.Vers < Version1 || h.Vers > uint32(c.s.cfg.MaxVersion) {
		// RFC 8166 s5.1: answer ERR_VERS with the range we support.
		c.sendError(&h, ErrVers)
		return
	}
	first := c.setVersion(h.Vers)
	if h.Proc == ProcOptional {
		c.handleOptional(&h)
		return
	}
	if h.Proc == ProcError {
		return // RFC 8166 s4.2.4: a responder discards an RDMA_ERROR
	}
	if h.Proc != ProcMsg && h.Proc != ProcNoMsg {
		c.tracef("drop: xid=%#x procedure %d in a call", h.XID, h.Proc)
		return
	}
	if mt, ok := oncrpc.MessageType(msg[hlen:]); ok && mt == oncrpc.MsgReply && h.Proc == ProcMsg {
		return // a reply to no backward call of ours (backwardReply took the others)
	}
	call, release, err := c.pullReadChunks(&h, msg[hlen:])
	if err != nil {
		c.tracef("xid=%#x: %v", h.XID, err)
		c.s.stats.chunkErrors.Add(1)
		leave()
		c.sendError(&h, ErrChunk)
		return
	}
	defer release()
	c.s.stats.bytesIn.Add(uint64(len(call)))
	c.s.calls.Add(1)
	reply, ref := c.runHandler(call)
	if reply.IsZero() {
		c.s.stats.unanswered.Add(1)
		return
	}
	c.s.stats.bytesOut.Add(uint64(reply.Len()))
	if ref != nil {
		ref.hold()
		defer ref.drop()
	}
	leave()
	if err := c.sendReply(&h, call, reply, ref); err != nil {
		c.tracef("xid=%#x: reply: %v", h.XID, err)
		c.s.stats.replyErrors.Add(1)
		if errors.Is(err, ErrChunkRejected) {
			leave()
			c.sendError(&h, ErrChunk)
		}
	}
	if first && h.Vers == Version2 && c.s.cfg.XChars {
		c.sendInitXch()
	}
}

// sendReply returns reply through the chunks the call offered (RFC 8166
// s3.5): the DDP-eligible result into the first Write chunk, then inline
// if the rest fits, else into the Reply chunk as RDMA_NOMSG.
func (c *serverConn) sendReply(call *Header, callMsg []byte, replyView oncrpc.View, ref *replyRef) error {
	reply := replyView.Bytes()
	// v2 s5.3: a reply has the version of its call.
	out := Header{XID: call.XID, Vers: call.Vers, Credit: c.grant(), Proc: ProcMsg}
	sendSize, remInv := c.sendParams()
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	// The payload is head then tail: a Write chunk takes the
	// DDP-eligible data and its pad out of the middle, the length word
	// staying (RFC 8166 s3.4.4); both are copied into the Send buffer.
	head, tail := reply, []byte(nil)
	var (
		segBuf [2]Segment
		wBuf   [1][]Segment
	)
	if len(call.Writes) > 0 {
		chunk := call.Writes[0]
		ret := append(segBuf[:0], chunk...)
		for i := range ret {
			ret[i].Length = 0 // RFC 8166 s4.3.2: unused chunks return lengths of zero
		}
		if f := c.s.cfg.ReplyBulk; f != nil {
			if off, n, ok := f(callMsg, reply); ok && off >= 0 && off+n <= len(reply) {
				if n > chunkLen(chunk) {
					return fmt.Errorf("%w: %d-byte result for a %d-byte Write chunk", ErrChunkRejected, n, chunkLen(chunk))
				}
				if err := c.rdmaWrite(chunk, replyView.Slice(off, off+n), ret, ref); err != nil {
					return err
				}
				head, tail = reply[:off], reply[min(off+xdr.RoundUp(n), len(reply)):]
			}
		}
		out.Writes = append(wBuf[:0], ret)
		for _, w := range call.Writes[1:] {
			unused := make([]Segment, len(w))
			copy(unused, w)
			for i := range unused {
				unused[i].Length = 0
			}
			out.Writes = append(out.Writes, unused)
		}
	}
	var hdrBuf [MinHeaderLen + 64]byte
	var e xdr.Encoder
	e.Reset(hdrBuf[:0])
	out.Append(&e)
	if e.Len()+len(head)+len(tail) > sendSize {
		payload := head
		if len(tail) > 0 {
			payload = append(append(make([]byte, 0, len(head)+len(tail)), head...), tail...)
		}
		if call.Reply == nil {
			return fmt.Errorf("%w: %d-byte reply does not fit inline and no Reply chunk", ErrChunkRejected, len(payload))
		}
		if len(payload) > chunkLen(call.Reply) {
			return fmt.Errorf("%w: %d-byte reply for a %d-byte Reply chunk", ErrChunkRejected, len(payload), chunkLen(call.Reply))
		}
		ret := make([]Segment, len(call.Reply))
		copy(ret, call.Reply)
		if err := c.rdmaWrite(call.Reply, oncrpc.Plain(payload), ret, nil); err != nil {
			return err
		}
		out.Proc = ProcNoMsg
		out.Reply = ret
		head, tail = nil, nil
		e.Reset(hdrBuf[:0])
		out.Append(&e)
	}
	op, inv := verbs.OpSend, uint32(0)
	if stag, ok := c.singleSTag(call); ok && c.s.cfg.RemoteInvalidate && remInv {
		op, inv = verbs.OpSendWithInvalidate, stag
		c.s.sendInvs.Add(1)
	}
	if c.s.cfg.Tracer.On(trace.RDMA) {
		c.tracef("reply xid=%#x proc=%d inline=%d writes=%s reply=%s", call.XID, out.Proc, len(head)+len(tail), chunksString(out.Writes), segsString(out.Reply))
	}
	return c.postSend(op, inv, e.Bytes(), head, tail)
}

// runHandler runs the handler on call and returns its reply and, if the
// handler recycles replies, the reference that gives it back once the
// RDMA Writes from it are done (nil: its data is copied).
func (c *serverConn) runHandler(call []byte) (oncrpc.View, *replyRef) {
	if vh, ok := c.handler.(oncrpc.ViewHandler); ok {
		reply := vh.HandleCallView(call)
		return reply, &replyRef{reply: reply, viewHandler: vh}
	}
	reply := oncrpc.Plain(c.handler.HandleCall(call))
	if r, ok := c.handler.(oncrpc.ReplyReleaser); ok {
		return reply, &replyRef{reply: reply, releaser: r}
	}
	return reply, nil
}

func (c *serverConn) sendError(call *Header, code uint32) {
	// RFC 8166 s5.1: an RDMA_ERROR echoes the version of the message
	// it answers; ERR_VERS carries the range we serve.
	out := Header{XID: call.XID, Vers: call.Vers, Credit: c.grant(), Proc: ProcError, ErrCode: code,
		VersLow: Version1, VersHigh: uint32(c.s.cfg.MaxVersion)}
	var e xdr.Encoder
	out.Append(&e)
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.postSend(verbs.OpSend, 0, e.Bytes())
}
