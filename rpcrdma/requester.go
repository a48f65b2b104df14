package rpcrdma

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
)

// Errors of individual calls.
var (
	// ErrVersion: the responder answered ERR_VERS (it does not speak our
	// RPC-over-RDMA version).
	ErrVersion = errors.New("rpcrdma: version not supported by peer")
	// ErrChunkRejected: the responder answered ERR_CHUNK (it could not
	// use the chunks offered, or the reply did not fit them).
	ErrChunkRejected = errors.New("rpcrdma: responder rejected the chunks (ERR_CHUNK)")
	// ErrExposed: a memory region could not be invalidated, so the
	// peer might still reach it through any connection of the
	// transport's protection domain; the transport refuses further
	// calls (RFC 8166 s4.5.4).
	ErrExposed = errors.New("rpcrdma: a memory region could not be invalidated; transport disabled to protect it")
)

// Config configures a requester Transport.
type Config struct {
	// Provider makes queue pairs (iwarp.Provider{} for the pure-Go
	// iWARP provider).
	Provider verbs.Provider
	// Credits is the number of calls we ask to have in flight; the
	// responder's grant may be lower. Zero means 128.
	Credits int
	// InlineSend and InlineRecv are our inline thresholds, announced
	// in RFC 8797 private data. Zero means 4096.
	InlineSend, InlineRecv int
	// BackchannelSlots is how many backward-direction calls we accept
	// at once (receive buffers reserved for them). Zero means 4.
	BackchannelSlots int
	// AcceptInvalidate tells the responder it may use Send With
	// Invalidate (RFC 8797 s5.1, RFC 8166 s3.4.6).
	AcceptInvalidate bool
	// CRC asks the provider for frame CRCs (iWARP MPA CRC32c).
	CRC bool
	// IRD and ORD are the queue pair's read depths; zero means 16.
	IRD, ORD int
	// MemoryBytes bounds the registered memory the transport maps for
	// buffers (the rdmamem mount option); zero means 64 MiB.
	MemoryBytes int64
	// DialTimeout bounds one connection attempt; zero means 30 s.
	DialTimeout time.Duration
	// Tracer receives -v rdma and mr events.
	Tracer *trace.Tracer
	// Version is the RPC-over-RDMA version: 0 negotiates (version 2
	// first, falling back to 1: draft-cel-nfsv4-rpcrdma-version-two s5),
	// 1 or 2 insists on that version (the rdmavers mount option).
	Version int
	// XChars makes a version-2 connection exchange transport
	// characteristics (ROPT_INITXCH after negotiation).
	XChars bool
}

// Transport is an RPC-over-RDMA requester (version 1, RFC 8166, or
// version 2, draft-cel-nfsv4-rpcrdma-version-two, as negotiated): an
// oncrpc.Transport over one reliable connection, redialled after it
// breaks.
type Transport struct {
	cfg  Config
	addr string
	pd   *verbs.ProtectionDomain
	pool *mrcache.Pool
	// borrowed: pd and pool belong to the transport Another was
	// called on, which closes them.
	borrowed bool

	mu      sync.Mutex // guards conn, closed, exposed; held while dialing
	conn    *conn
	closed  bool
	exposed error // set once a region could not be invalidated
	gens    uint64

	handler atomic.Pointer[oncrpc.CallHandler]
	stats   transportStats
	reqPool sync.Pool

	v1Mu    sync.Mutex
	v1Until time.Time // version 1 only until then (a failed negotiation)
}

// NewTransport returns a requester for the responder at addr
// ("host:port"). It connects on the first call.
func NewTransport(addr string, cfg Config) *Transport {
	if cfg.Credits <= 0 {
		cfg.Credits = 128
	}
	if cfg.InlineSend <= 0 {
		cfg.InlineSend = 4096
	}
	if cfg.InlineRecv <= 0 {
		cfg.InlineRecv = 4096
	}
	cfg.InlineRecv = recvFloor(cfg.InlineRecv)
	if cfg.BackchannelSlots <= 0 {
		cfg.BackchannelSlots = 4
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 30 * time.Second
	}
	pd := verbs.NewProtectionDomain()
	if dp, ok := cfg.Provider.(verbs.DomainProvider); ok {
		pd = dp.NewProtectionDomain()
	}
	t := &Transport{cfg: cfg, addr: addr, pd: pd, pool: mrcache.New(pd, cfg.MemoryBytes)}
	// A call exposes up to three buffers (Read chunk, Write chunk,
	// Reply chunk); most expose one. Regions beyond these are made on
	// demand and kept.
	_ = t.pool.ReserveFastRegions(cfg.Credits)
	t.reqPool.New = func() any { return &req{} }
	return t
}

// Another returns a second requester to the same responder with the same
// configuration (nconnect), whose connection shares t's protection
// domain and registered memory: a buffer from t.Buffers() can be exposed
// on either connection, so the upper layer need not know which one a
// call takes. It connects on the first call. Close it before t, which
// owns the memory.
func (t *Transport) Another() *Transport {
	a := &Transport{cfg: t.cfg, addr: t.addr, pd: t.pd, pool: t.pool, borrowed: true}
	// Fast regions for this connection's calls too.
	_ = a.pool.ReserveFastRegions(a.cfg.Credits)
	a.reqPool.New = func() any { return &req{} }
	return a
}

// Generation counts the connections made so far (1 for the first).
func (t *Transport) Generation() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.gens
}

// SetCallHandler registers the handler for backward-direction calls.
func (t *Transport) SetCallHandler(h oncrpc.CallHandler) { t.handler.Store(&h) }

// PD returns the transport's protection domain (tests check that no
// region stays exposed after a call: PD().LiveRemoteRegions()).
func (t *Transport) PD() *verbs.ProtectionDomain { return t.pd }

// Buffers returns the transport's registered memory: an upper layer that
// draws its READ destinations and WRITE data from it (Get, Put) moves
// them without a copy; other memory goes through a transport buffer.
func (t *Transport) Buffers() *mrcache.Pool { return t.pool }

// Connect makes the connection now instead of on the first call.
func (t *Transport) Connect(ctx context.Context) error {
	_, err := t.connection(ctx)
	return err
}

func (t *Transport) connection(ctx context.Context) (*conn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, oncrpc.ErrClosed
	}
	if t.exposed != nil {
		return nil, t.exposed
	}
	if t.conn != nil && !t.conn.isDead() {
		return t.conn, nil
	}
	c, err := t.dial(ctx)
	if err != nil {
		return nil, err
	}
	t.conn = c
	t.gens++
	t.stats.connects.Add(1)
	return c, nil
}

// Close ends the connection; calls in flight fail.
func (t *Transport) Close() error {
	t.mu.Lock()
	t.closed = true
	c := t.conn
	t.conn = nil
	t.mu.Unlock()
	if c != nil {
		c.fail(oncrpc.ErrClosed)
	}
	if !t.borrowed {
		t.pool.Close()
	}
	return nil
}

// RoundTrip sends call and waits for its reply. Memory exposed for the
// call is invalidated before RoundTrip returns (RFC 8166 s8.1).
func (t *Transport) RoundTrip(ctx context.Context, call *oncrpc.Call) (*oncrpc.Reply, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := t.connection(ctx)
	if err != nil {
		return nil, err
	}
	r := t.reqPool.Get().(*req)
	r.tr, r.xid, r.call = t, call.XID, call
	for {
		if err := c.send(ctx, r); err != nil {
			return nil, err
		}
		if !r.resend {
			break
		}
		// The version-2 probe met a version-1 peer: the connection now
		// speaks version 1; the same call goes again (v2 draft s5.2).
		r.resend = false
	}
	rep, err := r.reply, r.err
	r.reply = nil
	r.call = nil
	t.reqPool.Put(r)
	return rep, err
}

// send marshals r for the connection's current version, sends it and
// waits for its reply. Whatever way it returns, the memory r exposed is
// invalidated and its buffers are back in the pool (RFC 8166 s8.1):
// finish, the one place a call's exposures all end.
func (c *conn) send(ctx context.Context, r *req) error {
	if err := c.acquireCredit(ctx); err != nil {
		return err
	}
	r.done = make(chan struct{})
	// The chunks offered are kept empty, not nil: their arrays serve
	// the next call of this req (a chunk offered has a segment).
	r.reply, r.err, r.writeOff, r.replySegs = nil, nil, r.writeOff[:0], r.replySegs[:0]
	r.kinds = [2]chunkKind{chunkInline, chunkInline}
	err := c.exchange(ctx, r)
	// What the reply left exposed (the Read chunk), or all of it when no
	// reply came, is invalidated before the call returns (RFC 8166
	// s8.1.3); if it cannot be, the connection is closed and the call
	// fails (s4.5.4). The provider may have yet to end its Read Response
	// access when the reply comes (the invalidation then waits).
	if ferr := r.finish(c); ferr != nil && err == nil && r.err == nil {
		if r.reply != nil {
			r.reply.Release()
			r.reply = nil
		}
		r.err, r.resend = fmt.Errorf("%w: xid %#x: %w", oncrpc.ErrConnection, r.xid, ferr), false
	}
	return err
}

// exchange marshals and posts r and waits for its reply (nil: r.reply
// and r.err are the call's result) or for ctx to end.
func (c *conn) exchange(ctx context.Context, r *req) error {
	t := c.t
	c.mu.Lock()
	vers, sendSize, recvLimit := c.neg.version(), c.neg.sendSize, c.neg.replyLimit(c.recvSize)
	r.probe = c.neg.st == negProbe
	if r.probe {
		c.neg.probeSent = true
	}
	c.mu.Unlock()
	if err := c.marshal(ctx, r, uint32(t.cfg.Credits), vers, sendSize, recvLimit); err != nil {
		c.releaseCredit()
		return err
	}
	buf, n, err := c.sendBuffer(ctx, r.pieces)
	if err != nil {
		c.releaseCredit()
		return err
	}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		t.pool.Recycle(buf)
		return err
	}
	if old := c.pending[r.xid]; old != nil {
		// A retransmission of a call that gave up waiting: the old
		// call's credit stays in use until this one's reply. The old
		// call ends now; its own send invalidates what it exposed.
		c.inflight--
		delete(c.pending, r.xid)
		old.err = fmt.Errorf("%w: superseded by retransmission", oncrpc.ErrConnection)
		close(old.done)
	}
	c.pending[r.xid] = r
	// The Send's completion is not waited for: the pieces are in a send
	// buffer that the send queue owns, and a peer that never
	// acknowledges the Send must not hold the call past its reply or its
	// context.
	// The call's exposures were fast-registered on this connection's
	// send queue ahead of its Send (frwr.mapBuffer).
	r.seq, err = c.postLocked(buf, n)
	c.mu.Unlock()
	t.traceMarshal(r, vers)
	if err != nil {
		c.fail(fmt.Errorf("%w: %w", oncrpc.ErrConnection, err))
		<-r.done
		return nil // r.err is the connection's error
	}
	return c.await(ctx, r)
}

// await waits for r's reply (nil) or for ctx to end.
func (c *conn) await(ctx context.Context, r *req) error {
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
	}
	// The call's memory is invalidated (finish) before send returns;
	// its credit stays counted until a reply or the end of the
	// connection.
	c.mu.Lock()
	if c.pending[r.xid] == r {
		delete(c.pending, r.xid)
		c.mu.Unlock()
		switch {
		case r.probe:
			// v2 s5.2: an unanswered probe means the server does not
			// speak version 2; reconnect at version 1.
			c.t.markV1Only()
			c.fail(fmt.Errorf("%w: version-2 probe unanswered", oncrpc.ErrConnection))
		case errors.Is(context.Cause(ctx), oncrpc.ErrNoReply):
			// rfc5666bis s7.3.2 (checklist B4-7.3.2-a), RFC 8881
			// s2.9.2: the client re-establishes the connection before
			// it sends the call again.
			c.fail(fmt.Errorf("%w: no reply to XID %#x: reconnecting", oncrpc.ErrConnection, r.xid))
		default:
			go c.reclaimCreditLater()
		}
	} else {
		c.mu.Unlock()
		<-r.done
	}
	if r.reply != nil {
		r.reply.Release()
		r.reply = nil
	}
	return ctx.Err()
}

// finish ends the call's use of the transport: its exposures are
// invalidated (unmapAll) and its buffers go back to the pool (a Reply
// chunk's buffer went up with the reply, if there was one). An error
// means the call's memory was not safe when the call ended (see
// frwr.unmapAll).
func (r *req) finish(c *conn) error {
	err := r.unmapAll(c, r.xid)
	put := func(b *mrcache.Buffer) {
		if r.exposed {
			// A peer may still reach it: never reuse it.
			c.t.stats.quarantined.Add(uint64(len(b.Bytes())))
			return
		}
		c.t.pool.Put(b)
	}
	for i, b := range r.owned {
		put(b)
		r.owned[i] = nil
	}
	r.owned = r.owned[:0]
	if r.replyBuf != nil {
		put(r.replyBuf)
		r.replyBuf = nil
	}
	r.bounceIn = nil
	r.exposed = false
	return err
}

func (c *conn) releaseCredit() {
	c.mu.Lock()
	c.inflight--
	c.pumpLocked()
	c.mu.Unlock()
}

// reclaimCreditLater frees the credit of an abandoned call after a grace
// period: a late reply would find no call and be dropped.
func (c *conn) reclaimCreditLater() {
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case <-t.C:
		c.releaseCredit()
	case <-c.dead:
	}
}

func (t *Transport) tracef(cat trace.Category, format string, args ...any) {
	if t.cfg.Tracer.On(cat) {
		t.cfg.Tracer.Printf(cat, format, args...)
	}
}

func (t *Transport) traceMarshal(r *req, vers uint32) {
	if !t.cfg.Tracer.On(trace.RDMA) {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "marshal xid=%#x vers=%d proc=%d call=%s reply=%s len=%d send=%d",
		r.xid, vers, r.hdr.Proc, chunkNames[r.kinds[0]], chunkNames[r.kinds[1]], r.call.Len(), piecesLen(r.pieces))
	if r.probe {
		b.WriteString(" probe")
	}
	for _, rs := range r.hdr.Reads {
		fmt.Fprintf(&b, " read(pos=%d stag=%#x len=%d)", rs.Position, rs.Handle, rs.Length)
	}
	for _, w := range r.hdr.Writes {
		for _, s := range w {
			fmt.Fprintf(&b, " write(stag=%#x len=%d)", s.Handle, s.Length)
		}
	}
	for _, s := range r.hdr.Reply {
		fmt.Fprintf(&b, " replychunk(stag=%#x len=%d)", s.Handle, s.Length)
	}
	t.cfg.Tracer.Printf(trace.RDMA, "%s", b.String())
}

// transportStats are the requester's counters.
type transportStats struct {
	chunks   [numChunkKinds]atomic.Uint64
	placed   atomic.Uint64
	dropped  atomic.Uint64
	backward atomic.Uint64
	connects atomic.Uint64
	replies  atomic.Uint64

	copied     atomic.Uint64 // payload bytes copied by the transport (bounce buffers, inline data)
	provCopied atomic.Uint64 // bytes the provider copied, of connections that ended

	fallbacks   atomic.Uint64 // version-2 probes answered with ERR_VERS
	optionals   atomic.Uint64 // RDMA_OPTIONAL messages received
	optRejected atomic.Uint64 // RDMA_OPTIONAL messages we answered with an error
	optErrors   atomic.Uint64 // our RDMA_OPTIONAL messages the peer refused
	optDropped  atomic.Uint64 // answers to the peer's RDMA_OPTIONALs dropped for want of a credit

	invViolations atomic.Uint64 // Send With Invalidate we did not allow, or of an STag not offered
	bcDropped     atomic.Uint64 // backward calls beyond the back channel's slots, dropped
	quarantined   atomic.Uint64 // bytes never reused: a region over them could not be invalidated
}

func (s *transportStats) countChunks(kinds [2]chunkKind, placed int) {
	s.replies.Add(1)
	s.chunks[kinds[0]].Add(1)
	if kinds[1] != chunkInline {
		s.chunks[kinds[1]].Add(1)
	}
	s.placed.Add(uint64(placed))
}

// Stats is a snapshot of a requester's counters.
type Stats struct {
	Version                int
	InlineSend, InlineRecv int // current thresholds: our largest Send, our receive buffers
	Credits                int // granted by the responder now
	Connects               uint64
	Replies                uint64
	InlineCalls            uint64 // calls sent whole in one Send
	ReadChunks             uint64 // calls with a Read chunk for their bulk data
	PosZeroChunks          uint64 // calls sent as a Position-Zero Read chunk
	WriteChunks            uint64 // replies whose bulk data came by a Write chunk
	ReplyChunks            uint64 // replies offered a Reply chunk (and no Write chunk)
	BytesPlaced            uint64 // bytes the responder RDMA-wrote into Write chunks
	Dropped                uint64 // malformed or unmatched messages dropped
	BackwardCalls          uint64
	Fallbacks              uint64 // version-2 probes answered with ERR_VERS
	OptionalsReceived      uint64
	OptionalsRejected      uint64 // peer RDMA_OPTIONALs answered with INVAL_OPTION/BAD_HEADER
	OptionalErrors         uint64 // our RDMA_OPTIONALs the peer refused
	OptionalAnswersDropped uint64 // answers to peer RDMA_OPTIONALs dropped: no credit free
	// InvalidateViolations counts Send With Invalidate from the peer
	// that we did not allow, or that named an STag the reply's call did
	// not offer (the connection is then closed).
	InvalidateViolations uint64
	BackwardDropped      uint64 // backward calls beyond our slots, dropped
	QuarantinedBytes     uint64 // transport memory withdrawn: its invalidation failed
	Peer                 Chars  // the peer's transport characteristics (version 2)
	PeerAnnounced        bool   // the peer sent ROPT_INITXCH
	// BytesCopied counts user-space copies of payload bytes on the
	// data path: the transport's own (data outside registered memory
	// going through a transport buffer, inline READ and WRITE data)
	// and the provider's (received bytes that went through its
	// buffered reader).
	BytesCopied uint64
	Memory      mrcache.Stats // registered memory and its exposures
}

// Stats returns the requester's counters.
func (t *Transport) Stats() Stats {
	s := Stats{
		Fallbacks:              t.stats.fallbacks.Load(),
		OptionalsReceived:      t.stats.optionals.Load(),
		OptionalsRejected:      t.stats.optRejected.Load(),
		OptionalErrors:         t.stats.optErrors.Load(),
		OptionalAnswersDropped: t.stats.optDropped.Load(),
		InvalidateViolations:   t.stats.invViolations.Load(),
		BackwardDropped:        t.stats.bcDropped.Load(),
		QuarantinedBytes:       t.stats.quarantined.Load(),
		Connects:               t.stats.connects.Load(),
		Replies:                t.stats.replies.Load(),
		InlineCalls:            t.stats.chunks[chunkInline].Load(),
		ReadChunks:             t.stats.chunks[chunkRead].Load(),
		PosZeroChunks:          t.stats.chunks[chunkPosZero].Load(),
		WriteChunks:            t.stats.chunks[chunkWrite].Load(),
		ReplyChunks:            t.stats.chunks[chunkReply].Load(),
		BytesPlaced:            t.stats.placed.Load(),
		Dropped:                t.stats.dropped.Load(),
		BackwardCalls:          t.stats.backward.Load(),
		Memory:                 t.pool.Stats(),
		BytesCopied:            t.stats.copied.Load() + t.stats.provCopied.Load(),
	}
	t.mu.Lock()
	if c := t.conn; c != nil {
		c.mu.Lock()
		s.InlineSend, s.InlineRecv = c.neg.sendSize, c.recvSize
		s.Credits = c.granted
		s.Version = int(c.neg.version())
		if c.neg.st == negProbe {
			s.Version = 0
		}
		s.Peer, s.PeerAnnounced = c.neg.peer, c.neg.peerInit
		dead := c.err != nil
		c.mu.Unlock()
		if cb, ok := c.qp.(verbs.CopyCounter); ok && !dead {
			s.BytesCopied += cb.CopiedBytes()
		}
	}
	t.mu.Unlock()
	return s
}
