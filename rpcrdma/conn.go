package rpcrdma

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
)

// conn is one connection of a requester: the queue pair, its receive
// buffers, the calls waiting for replies and the credits the responder
// granted (RFC 8166 s3.3).
//
// Receive buffers are slab memory (mrcache). An inline reply is lent to
// the upper layer in its receive buffer, without a copy, and a spare
// buffer is posted in its place; the reply's Release gives the buffer
// back (xprtrdma lends its rep buffers the same way).
type conn struct {
	t  *Transport
	qp verbs.QueuePair

	recvSize int // our receive buffers: the largest Send we accept

	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	neg      negotiation // version and characteristics; guarded by mu
	pending  map[uint32]*req
	granted  int      // credits the responder granted; 1 until the first reply
	inflight int      // credits in use: calls, REQXCH, one-way messages
	oneWay   []uint64 // sequence numbers of one-way messages holding a credit
	wake     chan struct{}
	waiting  int                  // callers waiting on wake for a credit
	sends    map[uint64]sendState // Sends not yet reaped (reapSendsLocked)
	reapBuf  [16]verbs.Completion // reapSendsLocked's; guarded by mu
	sglFree  []*[1]verbs.SGE      // gather lists of reaped Sends, for reuse
	nextWR   uint64               // also the sequence number of the last message posted
	// Registration work requests waited for, by work request ID, and
	// the reaper that polls for them (regwr.go); guarded by mu.
	regs       map[uint64]regSlot
	reaping    bool
	reapCancel context.CancelFunc
	regBuf     [16]verbs.Completion // the reaper's
	regWR      atomic.Uint64        // the last registration work request ID (regWRID)
	err        error
	dead       chan struct{}
	qpClosed   chan struct{} // closed once the queue pair is closed: no access to our memory any more

	// Receive buffers, by work request ID; guarded by mu.
	recvBufs  []*mrcache.Buffer
	recvSGL   [][]verbs.SGE // each buffer's scatter list, made once
	recvState []recvState
	recvFree  []int    // neither posted nor lent
	recvRet   []func() // recvRet[i] gives buffer i back (a lent reply's Release)

	// bcSlots bounds the backward direction: a slot per backward call
	// being served or answered, up to the slots we offered (RFC 8167
	// s4.1; the back channel's credits).
	bcSlots chan struct{}

	// byHandler: receive completions come to onRecv by a receive
	// handler, not by recvLoop (set before they come).
	byHandler bool

	// rxHdr is the header of the message being received: messages are
	// received one at a time (onRecv), and decoding into the same
	// Header reuses its lists.
	rxHdr Header
}

type recvState uint8

const (
	recvPosted recvState = iota
	recvIdle
	recvLent
	recvGone // returned to the pool
)

// sendState is a Send in flight: its registered buffer and its gather
// list, which the send queue owns until the Send completes.
type sendState struct {
	buf *mrcache.Buffer
	sgl *[1]verbs.SGE
}

// complete ends a Send: the send queue is done with its buffer and its
// gather list. Called with c.mu held.
func (c *conn) complete(s sendState) {
	// The send buffer never left the transport: its handle is reused.
	c.t.pool.Recycle(s.buf)
	c.sglFree = append(c.sglFree, s.sgl)
}

// dial connects to the responder and exchanges RFC 8797 private data.
func (t *Transport) dial(ctx context.Context) (*conn, error) {
	ours := PrivateData{Version: privDataVersion, RemoteInvalidate: t.cfg.AcceptInvalidate,
		InlineSend: t.cfg.InlineSend, InlineRecv: t.cfg.InlineRecv}
	c := &conn{
		t:        t,
		recvSize: t.cfg.InlineRecv,
		pending:  make(map[uint32]*req),
		granted:  1, // RFC 8166 s3.3.3: one credit until the first reply
		wake:     make(chan struct{}),
		sends:    make(map[uint64]sendState),
		regs:     make(map[uint64]regSlot),
		dead:     make(chan struct{}),
		qpClosed: make(chan struct{}),
		bcSlots:  make(chan struct{}, t.cfg.BackchannelSlots),
	}
	if t.cfg.Version != Version1 {
		// Version 2 receivers accept 4096-byte messages (v2 draft
		// s2.3): with a smaller inline threshold the buffers are
		// larger than it, and only the threshold stays small.
		c.recvSize = max(c.recvSize, v2DefaultInline)
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	// A receive for every credit we may be granted plus the backward
	// direction's calls (RFC 8167 s4.1), and as many spares for replies
	// lent to the upper layer.
	posted := t.cfg.Credits + t.cfg.BackchannelSlots
	for i := range posted + t.cfg.Credits {
		b, err := t.pool.GetWait(ctx, c.recvSize)
		if err != nil {
			c.putRecvBufs()
			return nil, fmt.Errorf("rpcrdma: receive buffers: %w", err)
		}
		sge, err := b.SGE(0, c.recvSize)
		if err != nil {
			t.pool.Put(b)
			c.putRecvBufs()
			return nil, fmt.Errorf("rpcrdma: receive buffer: %w", err)
		}
		c.recvBufs = append(c.recvBufs, b)
		c.recvSGL = append(c.recvSGL, []verbs.SGE{sge})
		c.recvState = append(c.recvState, recvIdle)
		c.recvRet = append(c.recvRet, func() { c.returnRecv(i) })
		if i >= posted {
			c.recvFree = append(c.recvFree, i)
		}
	}
	// Post them in Setup: before the connection is up, so nothing the
	// peer sends finds no buffer.
	setup := func(qp verbs.QueuePair) error {
		for i := range posted {
			if err := c.postRecv(qp, i); err != nil {
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
		c.putRecvBufs()
		return nil, fmt.Errorf("%w: rdma connect %s: %w", oncrpc.ErrConnection, t.addr, err)
	}
	peer, found, err := ParsePrivateData(qp.PeerPrivateData())
	if err != nil {
		qp.Close()
		c.putRecvBufs()
		return nil, fmt.Errorf("rdma connect %s: %w", t.addr, err)
	}
	c.qp = qp
	// RFC 8166 s3.3.2: the call threshold is the smaller of our largest
	// Send and the peer's largest Receive, the reply threshold the
	// smaller of its largest Send and our Receives; without private
	// data the peer's are 1024 (s3.3.3).
	c.neg, err = t.startNegotiation(min(peer.InlineRecv, t.cfg.InlineSend), min(peer.InlineSend, t.cfg.InlineRecv), c.recvSize)
	if err != nil {
		qp.Close()
		c.putRecvBufs()
		return nil, err
	}
	t.tracef(trace.RDMA, "connect %s: peer private data found=%v send=%d recv=%d inv=%v; ours send=%d recv=%d credits=%d crc=%v version=%s",
		t.addr, found, peer.InlineSend, peer.InlineRecv, peer.RemoteInvalidate, c.neg.sendSize, c.recvSize, t.cfg.Credits, qp.CRC(), c.neg.state())
	c.startReceiving()
	go func() {
		select {
		case <-qp.Done():
			c.fail(fmt.Errorf("%w: %w", oncrpc.ErrConnection, qp.Err()))
		case <-c.ctx.Done():
		}
	}()
	return c, nil
}

// postRecv posts receive buffer i.
func (c *conn) postRecv(qp verbs.QueuePair, i int) error {
	c.recvState[i] = recvPosted
	return qp.PostRecv(verbs.RecvWR{WRID: uint64(i), SGL: c.recvSGL[i]})
}

// putRecvBufs gives receive buffers back to the pool once the queue pair
// can no longer place into them; lent ones come back with their reply.
func (c *conn) putRecvBufs() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, b := range c.recvBufs {
		if c.recvState[i] != recvLent && c.recvState[i] != recvGone {
			c.t.pool.Put(b)
			c.recvState[i] = recvGone
		}
	}
}

// returner returns the function that gives receive buffer i back.
func (c *conn) returner(i int) func() {
	if i < len(c.recvRet) {
		return c.recvRet[i]
	}
	return func() { c.returnRecv(i) }
}

// returnRecv takes back a receive buffer lent with a reply.
func (c *conn) returnRecv(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isDead() {
		c.t.pool.Put(c.recvBufs[i])
		c.recvState[i] = recvGone
		return
	}
	c.recvState[i] = recvIdle
	c.recvFree = append(c.recvFree, i)
}

// lendLocked posts a spare receive buffer in place of buffer i, so that i
// can be lent to the upper layer. It reports false when no spare is
// free (the caller copies instead).
func (c *conn) lendLocked(i int) bool {
	k := len(c.recvFree)
	if k == 0 || c.err != nil {
		return false
	}
	j := c.recvFree[k-1]
	c.recvFree = c.recvFree[:k-1]
	if err := c.postRecv(c.qp, j); err != nil {
		c.recvFree = append(c.recvFree, j)
		return false
	}
	c.recvState[i] = recvLent
	return true
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
	pending, first := c.markFailed(err)
	if !first {
		<-c.qpClosed
		return
	}
	c.teardown(err, pending)
}

// failRx is fail on the receive path, which may run in the provider's
// receiving goroutine (a receive handler): closing the queue pair waits
// for that goroutine, so the queue pair is closed, and the calls' memory
// invalidated, by another goroutine. The connection takes no reply once
// failRx returns.
func (c *conn) failRx(err error) {
	if pending, first := c.markFailed(err); first {
		go c.teardown(err, pending)
	}
}

// markFailed records err as the reason the connection ended and takes
// the calls waiting; first is false if it had ended already.
func (c *conn) markFailed(err error) (pending map[uint32]*req, first bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.markFailedLocked(err)
}

// markFailedLocked is markFailed with c.mu held.
func (c *conn) markFailedLocked(err error) (pending map[uint32]*req, first bool) {
	if c.err != nil {
		return nil, false
	}
	c.err = err
	pending = c.pending
	c.pending = nil
	close(c.dead)
	close(c.wake)
	return pending, true
}

// teardown is the rest of fail, once markFailed took the calls.
func (c *conn) teardown(err error, pending map[uint32]*req) {
	c.mu.Lock()
	v1Only := c.neg.lostDuringNegotiation()
	c.mu.Unlock()
	if v1Only {
		c.t.markV1Only()
	}
	c.t.tracef(trace.RDMA, "connection %s lost: %v (%d calls failed)", c.t.addr, err, len(pending))
	c.cancel()
	// Closing the queue pair ends placements in progress, so the
	// invalidations below cannot stall (RFC 8166 s8.1).
	c.qp.Close()
	if cb, ok := c.qp.(verbs.CopyCounter); ok {
		c.t.stats.provCopied.Add(cb.CopiedBytes())
	}
	close(c.qpClosed)
	c.putSends()
	for _, r := range pending {
		// The call's send ends its exposures (frwr.unmapAll) before
		// it returns; with the queue pair closed, none can stall.
		r.err = err
		close(r.done)
	}
	c.putRecvBufs()
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
		c.waiting++
		c.mu.Unlock()
		var err error
		select {
		case <-wake:
		case <-ctx.Done():
			err = ctx.Err()
		}
		c.mu.Lock()
		c.waiting--
		c.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// wakeLocked lets credit waiters look again. With none, the channel
// stays: a reply does not pay for a new one.
func (c *conn) wakeLocked() {
	if c.waiting == 0 {
		return
	}
	close(c.wake)
	c.wake = make(chan struct{})
}

// sendBuffer copies the concatenation of pieces into a registered send
// buffer (they are transport headers, RPC headers and at most an inline
// threshold of arguments, as in xprtrdma's send buffers) and returns it
// and the message length.
func (c *conn) sendBuffer(ctx context.Context, pieces [][]byte) (*mrcache.Buffer, int, error) {
	n := 0
	for _, p := range pieces {
		n += len(p)
	}
	buf, err := c.t.pool.GetWait(ctx, max(n, 1))
	if err != nil {
		return nil, 0, fmt.Errorf("rpcrdma: send buffer: %w", err)
	}
	k, mem := 0, buf.Bytes()
	for _, p := range pieces {
		k += copy(mem[k:], p)
	}
	return buf, n, nil
}

// postLocked posts the first n bytes of buf as one Send and returns its sequence number:
// messages are posted, and so reach the peer, in that order. The send
// queue owns buf until the Send completes. The fast-registers of the
// call's exposures were posted before it (frwr.mapBuffer). Called with
// c.mu held.
func (c *conn) postLocked(buf *mrcache.Buffer, n int) (uint64, error) {
	if c.err != nil {
		c.t.pool.Recycle(buf)
		return 0, c.err
	}
	c.reapSendsLocked()
	if c.err != nil { // a completion in error broke the queue pair
		c.t.pool.Recycle(buf)
		return 0, c.err
	}
	// The gather list too stays the send queue's until the Send
	// completes: one of a reaped Send, so that a post allocates none.
	var sgl *[1]verbs.SGE
	if k := len(c.sglFree); k > 0 {
		sgl = c.sglFree[k-1]
		c.sglFree = c.sglFree[:k-1]
	} else {
		sgl = new([1]verbs.SGE)
	}
	sge, err := buf.SGE(0, max(n, 1))
	if err != nil {
		c.t.pool.Recycle(buf)
		c.sglFree = append(c.sglFree, sgl)
		return 0, fmt.Errorf("rpcrdma: post send: %w", err)
	}
	sgl[0] = sge
	sgl[0].Length = uint32(n)
	c.nextWR++
	wr := c.nextWR
	if err := c.qp.PostSend(verbs.SendWR{WRID: wr, Opcode: verbs.OpSend, SGL: sgl[:]}); err != nil {
		c.t.pool.Recycle(buf)
		c.sglFree = append(c.sglFree, sgl)
		return 0, fmt.Errorf("rpcrdma: post send: %w", err)
	}
	c.sends[wr] = sendState{buf: buf, sgl: sgl}
	return wr, nil
}

// reapSendsLocked takes the send queue completions that have come,
// without waiting, and gives the Sends' buffers back (completedLocked).
// Called with c.mu held.
//
// No goroutine waits for Send completions: a call does not wait for its
// Send (the send queue owns the buffer), so the completions are reaped
// when the next Send is posted and when a reply comes (which its Send
// has preceded), and the rest when the connection ends (teardown).
// xprtrdma posts most Sends unsignalled and reaps them in batches for
// the same reason: a wake-up per Send costs more than the Send.
func (c *conn) reapSendsLocked() {
	cq := c.qp.SendCQ()
	for {
		n := cq.TryPoll(c.reapBuf[:])
		for _, w := range c.reapBuf[:n] {
			c.completedLocked(w)
		}
		if n < len(c.reapBuf) {
			return
		}
	}
}

// putSends gives back the buffers of every Send not reaped, once the
// queue pair, closed, reads none of them any more.
func (c *conn) putSends() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for wr, s := range c.sends {
		c.complete(s)
		delete(c.sends, wr)
	}
}

// startReceiving takes in receive completions: by handler where the
// queue pair offers one, else by polling in recvLoop.
func (c *conn) startReceiving() {
	if hs, ok := c.qp.(verbs.RecvHandlerSetter); ok && hs.SetRecvHandler(c.onRecv) == nil {
		c.byHandler = true
		return
	}
	go c.recvLoop()
}

func (c *conn) recvLoop() {
	var wc [32]verbs.Completion
	for {
		n, err := c.qp.RecvCQ().Poll(c.ctx, wc[:])
		if err != nil {
			return
		}
		for _, w := range wc[:n] {
			c.onRecv(w)
		}
	}
}

// onRecv handles one receive completion: the message, then the buffer is
// posted again unless it was lent with a reply.
func (c *conn) onRecv(w verbs.Completion) {
	if w.Status != verbs.StatusSuccess {
		c.failRx(fmt.Errorf("%w: receive completion %v (%v)", oncrpc.ErrConnection, w.Status, c.qp.Err()))
		return
	}
	if w.WRID >= uint64(len(c.recvBufs)) {
		return
	}
	i := int(w.WRID)
	withInv := w.Opcode == verbs.OpRecvWithInvalidate
	if c.receive(i, c.recvBufs[i].Bytes()[:w.ByteLen], w.InvalidatedSTag, withInv) {
		return // lent with a reply; a spare was posted
	}
	c.mu.Lock()
	if c.err != nil {
		// Failed: the buffer goes back to the pool with the others
		// once the queue pair is closed (putRecvBufs).
		c.mu.Unlock()
		return
	}
	err := c.postRecv(c.qp, i)
	c.mu.Unlock()
	if err != nil {
		c.failRx(fmt.Errorf("%w: repost receive: %w", oncrpc.ErrConnection, err))
	}
}
