package rpcrdma

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
)

// Chunk kinds, counted per connection and traced (like xprtrdma's
// "marshal" tracepoint).
type chunkKind int

const (
	chunkInline  chunkKind = iota // the whole call was Sent
	chunkRead                     // a Read chunk carried the DDP-eligible argument
	chunkPosZero                  // a Position-Zero Read chunk carried the whole call
	chunkWrite                    // a Write chunk was offered for the DDP-eligible result
	chunkReply                    // a Reply chunk was offered for the whole reply
	numChunkKinds
)

var chunkNames = [numChunkKinds]string{"inline", "read", "pos0", "write", "reply"}

// Header sizes used to decide whether a message fits inline.
const (
	readSegLen  = 4 + 4 + 16 // presence, position, segment
	writeSegLen = 16
	chunkHdrLen = 4 + 4 // presence, segment count
	// replyHeaderRoom is what a reply's transport header can take beyond
	// its payload when it returns one Write chunk.
	replyHeaderRoom = MinHeaderLen + chunkHdrLen + writeSegLen
)

var zeroPad [4]byte

// req is one call in flight: what was exposed for it and where its
// reply goes.
type req struct {
	xid  uint32
	call *oncrpc.Call

	hdr    Header
	hdrBuf xdr.Encoder
	pieces [][]byte // what the Send carries: transport header, then RPC message parts

	// What the call exposed, one list per chunk kind (RFC 8166 s3.4), in
	// the order of the chunk's segments. The peer may write the Write
	// and Reply chunks', which are invalidated before the reply is looked
	// at; it may only read the Read chunk's, invalidated by the caller
	// before the call returns.
	writeRegs, replyRegs, readRegs []*mrcache.Registration

	binds    []*verbs.MemoryRegion // backs bindList, kept with the pooled req
	owned    [][]byte              // transport buffers of this call, back to the pool at its end
	bounceIn [][]byte              // Write chunk segments standing in for a ReplyBulk outside the slab
	writeOff []Segment             // the Write chunk offered (empty: none), to check the reply's echo
	// writePlaced is what the provider saw placed in each Write chunk
	// segment, counted by invalidate (mrcache InvalidatePlaced); nil
	// when it cannot know (a hardware provider).
	writePlaced []int
	placedBuf   []int        // backs writePlaced, kept with the pooled req
	readSegs    []Segment    // backs the Read chunk's segments
	replyBuf    []byte       // Reply chunk target (slab); handed up with the reply
	replySegs   []Segment    // the Reply chunk offered (empty: none)
	kinds       [2]chunkKind // call and reply decisions, for tracing and counters
	tr          *Transport
	probe       bool   // sent as the version-2 negotiation probe
	resend      bool   // the probe met ERR_VERS: send again as version 1
	seq         uint64 // the call's place in the connection's message order
	exposed     bool   // an exposure could not be invalidated: buffers withdrawn

	// replyPlaced is what the provider saw placed in the Reply chunk,
	// counted by invalidate; replyKnown is false when it cannot know.
	replyPlaced int
	replyKnown  bool

	done  chan struct{}
	reply *oncrpc.Reply
	err   error
}

// marshal decides how call travels (RFC 8166 s3.5, the choices of a
// mature client): inline when it fits the peer's receive buffer; else a
// Read chunk for the DDP-eligible argument (RDMA_MSG); else the whole call
// in a Position-Zero Read chunk (RDMA_NOMSG). For the reply it offers a
// Write chunk for a DDP-eligible result and a Reply chunk when the rest
// may not fit our receive buffer.
//
// Bulk data in the transport's slab (mrcache) is exposed where it is;
// other memory goes through a slab buffer of the call's own, a counted
// copy.
func (c *conn) marshal(ctx context.Context, r *req, credits uint32, vers uint32, sendSize, recvLimit int) error {
	call := r.call
	h := &r.hdr
	*h = Header{XID: call.XID, Vers: vers, Credit: credits, Proc: ProcMsg, Reads: h.Reads[:0], Writes: h.Writes[:0]}
	r.writePlaced, r.replyKnown = nil, false
	pool := c.t.pool

	// Reply side first: it adds to the header's size. The reply's
	// transport header echoes the Write and Reply chunks offered (RFC
	// 8166 s4.3.3: what must fit the reply threshold is the transport
	// header and the payload).
	recvRoom := recvLimit - replyHeaderRoom
	if n := len(call.ReplyBulk); n > 0 && call.MaxReplySize+n > recvRoom {
		// RFC 8166 s3.4.6: a Write chunk gets no room for XDR padding.
		segs, bounce, err := c.exposeBulk(ctx, r, &r.writeRegs, call.ReplyBulk, call.ReplyBulkMem, verbs.AccessRemoteWrite|verbs.AccessLocalWrite, r.writeOff[:0])
		if err != nil {
			return err
		}
		r.writeOff, r.bounceIn = segs, bounce
		h.Writes = append(h.Writes, r.writeOff)
		r.kinds[1] = chunkWrite
	}
	if replyHdr := msgHeaderLen(h.Writes); call.MaxReplySize > min(recvRoom, recvLimit-replyHdr) {
		size := xdr.RoundUp(call.MaxReplySize)
		buf, err := pool.GetWait(ctx, size)
		if err != nil {
			return fmt.Errorf("rpcrdma: xid %#x: Reply chunk buffer: %w", r.xid, err)
		}
		r.replyBuf = buf
		reg, err := c.expose(r, &r.replyRegs, nil, buf, verbs.AccessRemoteWrite|verbs.AccessLocalWrite)
		if err != nil {
			return err
		}
		r.replySegs = append(r.replySegs[:0], Segment{Handle: reg.STag, Length: uint32(size), Offset: reg.Offset})
		h.Reply = r.replySegs
		if r.kinds[1] != chunkWrite {
			r.kinds[1] = chunkReply
		}
	}

	hdrLen := msgHeaderLen(h.Writes)
	if h.Reply != nil {
		// The Reply chunk's segment count and segments; its presence
		// word is in MinHeaderLen.
		hdrLen += 4 + writeSegLen*len(h.Reply)
	}
	pad := zeroPad[:xdr.Pad(len(call.Bulk))]
	switch {
	case hdrLen+call.Len() <= sendSize:
		r.kinds[0] = chunkInline
		r.pieces = append(r.pieces[:0], nil, call.Head, call.Bulk, pad, call.Tail)
		c.t.stats.copied.Add(uint64(len(call.Bulk))) // into the send buffer
	case call.Bulk != nil && hdrLen+readSegLen*c.bulkSegments(call.Bulk, call.BulkMem)+len(call.Head)+len(call.Tail) <= sendSize:
		// RFC 8166 s3.4.5: the Read chunk's position is the offset of the
		// reduced item in the whole payload stream; the item's XDR pad
		// goes with it (s3.4.4), so Tail follows Head directly.
		segs, _, err := c.exposeBulk(ctx, r, &r.readRegs, call.Bulk, call.BulkMem, verbs.AccessRemoteRead, r.readSegs[:0])
		if err != nil {
			return err
		}
		r.readSegs = segs
		for _, sg := range segs {
			h.Reads = append(h.Reads, ReadSegment{Position: uint32(len(call.Head)), Segment: sg})
		}
		r.kinds[0] = chunkRead
		r.pieces = append(r.pieces[:0], nil, call.Head, call.Tail)
	default:
		// RFC 8166 s3.5.3: a Position-Zero Read chunk carries the whole
		// call, padding included, and the Send carries only the header.
		buf, err := c.callBuffer(ctx, r, call.Len())
		if err != nil {
			return err
		}
		k := copy(buf, call.Head)
		k += copy(buf[k:], call.Bulk)
		k += copy(buf[k:], pad)
		copy(buf[k:], call.Tail)
		c.t.stats.copied.Add(uint64(len(call.Bulk)))
		reg, err := c.expose(r, &r.readRegs, nil, buf, verbs.AccessRemoteRead)
		if err != nil {
			return err
		}
		h.Proc = ProcNoMsg
		h.Reads = append(h.Reads, ReadSegment{Position: 0,
			Segment: Segment{Handle: reg.STag, Length: uint32(len(buf)), Offset: reg.Offset}})
		r.kinds[0] = chunkPosZero
		r.pieces = append(r.pieces[:0], nil)
	}
	r.hdrBuf.Reset(r.hdrBuf.Bytes())
	h.Append(&r.hdrBuf)
	r.pieces[0] = r.hdrBuf.Bytes()
	if n := piecesLen(r.pieces); n > sendSize {
		return fmt.Errorf("rpcrdma: marshal xid %#x: %d-byte Send exceeds the peer's %d-byte inline threshold", call.XID, n, sendSize)
	}
	return nil
}

// msgHeaderLen is the size of a transport header with these Write
// chunks and no Read list or Reply chunk: each chunk is a presence word,
// a segment count and its segments (RFC 8166 s4.3).
func msgHeaderLen(writes [][]Segment) int {
	n := MinHeaderLen
	for _, w := range writes {
		n += chunkHdrLen + writeSegLen*len(w)
	}
	return n
}

func piecesLen(pieces [][]byte) int {
	n := 0
	for _, b := range pieces {
		n += len(b)
	}
	return n
}

// bounceSize is the largest transport buffer standing in for bulk data
// outside the slab; larger data takes several chunk segments.
const bounceSize = 1 << 20

// own returns mem as a buffer of this transport's slab, nil if it is
// ordinary memory or another pool's (RFC 8166 s8.1: only memory the
// transport registered itself is offered to its peer).
func (c *conn) own(mem oncrpc.Registered) *mrcache.Buffer {
	if b, ok := mem.(*mrcache.Buffer); ok && b.Pool() == c.t.pool {
		return b
	}
	return nil
}

// bulkSegments returns how many chunk segments exposeBulk makes for data
// in mem.
func (c *conn) bulkSegments(data []byte, mem oncrpc.Registered) int {
	if len(data) == 0 || c.own(mem) != nil {
		return 1
	}
	return (len(data) + bounceSize - 1) / bounceSize
}

// exposeBulk exposes data for a Read chunk (access remote read) or a Write
// chunk (remote write), adds the exposures to regs and appends its
// segments to segs. Data in a slab buffer of this transport (mem) is
// exposed where it is, as one segment; other data goes through
// transport buffers of at most bounceSize bytes, one segment each: for a
// Read chunk data is copied in now, for a Write chunk the returned
// buffers are copied out when the reply comes (both counted).
func (c *conn) exposeBulk(ctx context.Context, r *req, regs *[]*mrcache.Registration, data []byte, mem oncrpc.Registered, access verbs.Access, segs []Segment) ([]Segment, [][]byte, error) {
	if buf := c.own(mem); buf != nil && len(data) > 0 {
		reg, err := c.expose(r, regs, buf, data, access)
		if err != nil {
			return nil, nil, err
		}
		return append(segs, Segment{Handle: reg.STag, Length: uint32(len(data)), Offset: reg.Offset}), nil, nil
	}
	var bounce [][]byte
	for off := 0; off < len(data) || off == 0; off += bounceSize {
		piece := data[off:min(len(data), off+bounceSize)]
		buf, err := c.callBuffer(ctx, r, max(len(piece), 1))
		if err != nil {
			return nil, nil, err
		}
		buf = buf[:len(piece)]
		if access&verbs.AccessRemoteRead != 0 {
			copy(buf, piece)
			c.t.stats.copied.Add(uint64(len(piece)))
		}
		reg, err := c.expose(r, regs, nil, buf[:max(len(buf), 1)], access)
		if err != nil {
			return nil, nil, err
		}
		segs = append(segs, Segment{Handle: reg.STag, Length: uint32(len(piece)), Offset: reg.Offset})
		bounce = append(bounce, buf)
		if len(data) == 0 {
			break
		}
	}
	return segs, bounce, nil
}

// callBuffer returns a slab buffer that lives as long as the call.
func (c *conn) callBuffer(ctx context.Context, r *req, n int) ([]byte, error) {
	b, err := c.t.pool.GetWait(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("rpcrdma: xid %#x: %w", r.xid, err)
	}
	r.owned = append(r.owned, b)
	return b, nil
}

// expose offers exactly buf to the peer for this call (RFC 8166 s8.1)
// and adds the exposure to regs, one of r's lists. buf lies in src, an
// upper-layer buffer, or (src nil) in one the transport took itself.
func (c *conn) expose(r *req, regs *[]*mrcache.Registration, src *mrcache.Buffer, buf []byte, access verbs.Access) (*mrcache.Registration, error) {
	var reg *mrcache.Registration
	var err error
	if src != nil {
		reg, err = src.Expose(buf, access)
	} else {
		reg, err = c.t.pool.Expose(buf, access)
	}
	if err != nil {
		return nil, fmt.Errorf("rpcrdma: xid %#x: %w", r.xid, err)
	}
	*regs = append(*regs, reg)
	if c.t.cfg.Tracer.On(trace.MR) {
		c.t.cfg.Tracer.Printf(trace.MR, "mr_map xid=%#x stag=%#x len=%d access=%v", r.xid, reg.STag, reg.Len, access)
	}
	return reg, nil
}

// noWait is a context that has ended: an invalidation with it returns at
// once if a placement is in progress.
var noWait = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// invalidateWait bounds how long an invalidation waits for a placement in
// progress before the connection is closed under it.
const invalidateWait = 2 * time.Second

// invalidate ends every exposure of r before its reply is used or the
// call returns (RFC 8166 s4.4.1, s8.1), even those the peer already
// invalidated with Send With Invalidate. A placement still running after
// invalidateWait (a peer stalling a transfer) is ended by closing the
// queue pair, and only then is the memory reused.
//
// An error means the call's memory was not safe to use when the call
// ended: the connection is closed before invalidate returns, so before
// the call completes (RFC 8166 s4.5.4), and the call must not deliver a
// reply. An exposure that still cannot be invalidated once the queue
// pair is closed stays reachable through the protection domain, which
// outlives connections: its buffers are withdrawn for good and the
// transport refuses further calls (ErrExposed).
func (r *req) invalidate(c *conn) error {
	first := r.invalidateWritable(c, false)
	if err := r.invalidateReadable(c); first == nil {
		first = err
	}
	return first
}

// exposures returns how many exposures of r are live.
func (r *req) exposures() int {
	return len(r.writeRegs) + len(r.replyRegs) + len(r.readRegs)
}

// bindList returns the regions of the call's exposures, for its Send to
// bind (verbs.SendWR.Bind), or nil if it has none.
func (r *req) bindList() []*verbs.MemoryRegion {
	if r.exposures() == 0 {
		return nil
	}
	binds := r.binds[:0]
	for _, regs := range [...][]*mrcache.Registration{r.writeRegs, r.replyRegs, r.readRegs} {
		for _, reg := range regs {
			binds = append(binds, reg.MR())
		}
	}
	r.binds = binds
	return binds
}

// invalidateWritable is invalidate for the exposures the peer may write,
// the Write and Reply chunks', which end before the reply is looked at.
// With rx set it runs on the receive path, maybe in the provider's
// receiving goroutine (verbs.RecvHandlerSetter), which closing the queue
// pair would wait for.
//
// It notes what the peer placed in each (RFC 8166 s3.4.6: only the bytes
// the responder wrote are data), for the reply to be checked against.
func (r *req) invalidateWritable(c *conn, rx bool) error {
	var first error
	known := true // every Write chunk segment's placed count is known
	placed := r.placedBuf[:0]
	for i, reg := range r.writeRegs {
		n, ok, err := r.end(c, reg, rx)
		if err != nil {
			n = 0 // the call fails: see invalidate
			first = cmp.Or(first, err)
		}
		placed = append(placed, n)
		known = known && ok
		r.writeRegs[i] = nil
	}
	r.placedBuf = placed
	if len(r.writeRegs) > 0 && known {
		r.writePlaced = placed
	}
	r.writeRegs = r.writeRegs[:0]
	for i, reg := range r.replyRegs {
		n, ok, err := r.end(c, reg, rx)
		if err != nil {
			first = cmp.Or(first, err)
		} else {
			r.replyPlaced, r.replyKnown = n, ok
		}
		r.replyRegs[i] = nil
	}
	r.replyRegs = r.replyRegs[:0]
	return first
}

// invalidateReadable is invalidate for the Read chunk's exposures.
func (r *req) invalidateReadable(c *conn) error {
	var first error
	for i, reg := range r.readRegs {
		if _, _, err := r.end(c, reg, false); err != nil {
			first = cmp.Or(first, err)
		}
		r.readRegs[i] = nil
	}
	r.readRegs = r.readRegs[:0]
	return first
}

// end invalidates one exposure of r and returns what the provider saw
// placed in it (known false: it cannot count). An error closes the
// connection (see invalidate; rx as for invalidateWritable).
//
// The exposure is first invalidated without waiting, which needs no
// timer: only when the provider is still using the region (a Read chunk
// whose Read Response it is finishing when the reply comes: a few calls
// in a hundred with the responder in another process, about half with
// it in this one) does the bounded wait follow. The region is invalid
// after the first attempt either way; the second only waits.
func (r *req) end(c *conn, reg *mrcache.Registration, rx bool) (placed int, known bool, err error) {
	placed, known, err = reg.InvalidatePlaced(noWait)
	if err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), invalidateWait)
		placed, known, err = reg.InvalidatePlaced(ctx)
		cancel()
	}
	if c.t.cfg.Tracer.On(trace.MR) {
		c.t.cfg.Tracer.Printf(trace.MR, "mr_localinv xid=%#x stag=%#x err=%v", r.xid, reg.STag, err)
	}
	if err == nil {
		return placed, known, nil
	}
	c.t.tracef(trace.RDMA, "xid=%#x: %v: closing the connection", r.xid, err)
	if rx {
		// The close stops the placement all the same (not this
		// goroutine's: it places nothing while the reply is handled);
		// Invalidate waits for it.
		c.failRx(fmt.Errorf("%w: %w", oncrpc.ErrConnection, err))
	} else {
		c.qp.Close()
		go c.fail(fmt.Errorf("%w: %w", oncrpc.ErrConnection, err))
	}
	if err := reg.Invalidate(context.Background()); err != nil {
		r.exposed = true
		c.t.disable(fmt.Errorf("%w: xid %#x: %w", ErrExposed, r.xid, err))
	}
	return 0, false, err
}

// disable makes the transport refuse calls for good: memory it exposed
// could not be protected (RFC 8166 s4.5.4).
func (t *Transport) disable(err error) {
	t.tracef(trace.RDMA, "%v", err)
	t.mu.Lock()
	if t.exposed == nil {
		t.exposed = err
	}
	c := t.conn
	t.mu.Unlock()
	if c != nil {
		go c.fail(err)
	}
}

// finish ends the call's use of the transport: exposures are invalidated
// and its buffers go back to the pool (a Reply chunk's buffer went up
// with the reply, if there was one).
func (r *req) finish(c *conn) {
	_ = r.invalidate(c) // the call fails either way; see invalidate
	put := func(b []byte) {
		if r.exposed {
			// A peer may still reach it: never reuse it.
			c.t.stats.quarantined.Add(uint64(len(b)))
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
}
