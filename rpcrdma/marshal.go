package rpcrdma

import (
	"context"
	"fmt"

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

	// frwr is what the call exposed to the peer (frwr.go): mapped here,
	// unmapped when the reply comes (what the peer may write) and when
	// the call ends (all of it).
	frwr

	owned     []*mrcache.Buffer // transport buffers of this call, back to the pool at its end
	bounceIn  [][]byte          // Write chunk segments standing in for a ReplyBulk outside the slab (in owned)
	writeOff  []Segment         // the Write chunk offered (empty: none), to check the reply's echo
	readSegs  []Segment         // backs the Read chunk's segments
	replyBuf  *mrcache.Buffer   // Reply chunk target; handed up with the reply
	replySegs []Segment         // the Reply chunk offered (empty: none)
	kinds     [2]chunkKind      // call and reply decisions, for tracing and counters
	tr        *Transport
	probe     bool   // sent as the version-2 negotiation probe
	resend    bool   // the probe met ERR_VERS: send again as version 1
	seq       uint64 // the call's place in the connection's message order

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
	if n := call.ReplyBulk.Len(); n > 0 && call.MaxReplySize+n > recvRoom {
		// RFC 8166 s3.4.6: a Write chunk gets no room for XDR padding.
		segs, bounce, err := c.exposeBulk(ctx, r, &r.writeRegs, call.ReplyBulk, verbs.AccessRemoteWrite|verbs.AccessLocalWrite, r.writeOff[:0])
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
		reg, err := r.mapBuffer(c, r.xid, &r.replyRegs, buf, 0, size, verbs.AccessRemoteWrite|verbs.AccessLocalWrite)
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
	bulk := call.Bulk.Bytes()
	pad := zeroPad[:xdr.Pad(len(bulk))]
	switch {
	case hdrLen+call.Len() <= sendSize:
		r.kinds[0] = chunkInline
		r.pieces = append(r.pieces[:0], nil, call.Head, bulk, pad, call.Tail)
		c.t.stats.copied.Add(uint64(len(bulk))) // into the send buffer
	case !call.Bulk.IsZero() && hdrLen+readSegLen*c.bulkSegments(call.Bulk)+len(call.Head)+len(call.Tail) <= sendSize:
		// RFC 8166 s3.4.5: the Read chunk's position is the offset of the
		// reduced item in the whole payload stream; the item's XDR pad
		// goes with it (s3.4.4), so Tail follows Head directly.
		segs, _, err := c.exposeBulk(ctx, r, &r.readRegs, call.Bulk, verbs.AccessRemoteRead, r.readSegs[:0])
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
		lent, err := c.callBuffer(ctx, r, call.Len())
		if err != nil {
			return err
		}
		buf := lent.Bytes()
		k := copy(buf, call.Head)
		k += copy(buf[k:], bulk)
		k += copy(buf[k:], pad)
		copy(buf[k:], call.Tail)
		c.t.stats.copied.Add(uint64(len(bulk)))
		reg, err := r.mapBuffer(c, r.xid, &r.readRegs, lent, 0, len(buf), verbs.AccessRemoteRead)
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

// own returns the buffer of this transport's slab that v lies in and v's
// offset in it; nil if v is ordinary memory or another pool's (RFC 8166
// s8.1: only memory the transport registered itself is offered to its
// peer).
func (c *conn) own(v oncrpc.View) (*mrcache.Buffer, int) {
	owner, off := v.Owner()
	if b, ok := owner.(*mrcache.Buffer); ok && b.Pool() == c.t.pool {
		return b, off
	}
	return nil, 0
}

// bulkSegments returns how many chunk segments exposeBulk makes for v.
func (c *conn) bulkSegments(v oncrpc.View) int {
	if b, _ := c.own(v); v.Len() == 0 || b != nil {
		return 1
	}
	return (v.Len() + bounceSize - 1) / bounceSize
}

// exposeBulk exposes data for a Read chunk (access remote read) or a Write
// chunk (remote write), adds the exposures to regs and appends its
// segments to segs. Data in a slab buffer of this transport is exposed
// where it is, as one segment; other data goes through
// transport buffers of at most bounceSize bytes, one segment each: for a
// Read chunk data is copied in now, for a Write chunk the returned
// buffers are copied out when the reply comes (both counted).
func (c *conn) exposeBulk(ctx context.Context, r *req, regs *[]*mrcache.Registration, v oncrpc.View, access verbs.Access, segs []Segment) ([]Segment, [][]byte, error) {
	if buf, off := c.own(v); buf != nil && v.Len() > 0 {
		reg, err := r.mapBuffer(c, r.xid, regs, buf, off, v.Len(), access)
		if err != nil {
			return nil, nil, err
		}
		return append(segs, Segment{Handle: reg.STag, Length: uint32(v.Len()), Offset: reg.Offset}), nil, nil
	}
	data := v.Bytes()
	var bounce [][]byte
	for off := 0; off < len(data) || off == 0; off += bounceSize {
		piece := data[off:min(len(data), off+bounceSize)]
		lent, err := c.callBuffer(ctx, r, max(len(piece), 1))
		if err != nil {
			return nil, nil, err
		}
		buf := lent.Bytes()[:len(piece)]
		if access&verbs.AccessRemoteRead != 0 {
			copy(buf, piece)
			c.t.stats.copied.Add(uint64(len(piece)))
		}
		reg, err := r.mapBuffer(c, r.xid, regs, lent, 0, max(len(buf), 1), access)
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
func (c *conn) callBuffer(ctx context.Context, r *req, n int) (*mrcache.Buffer, error) {
	b, err := c.t.pool.GetWait(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("rpcrdma: xid %#x: %w", r.xid, err)
	}
	r.owned = append(r.owned, b)
	return b, nil
}
