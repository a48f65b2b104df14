package rpcrdma

import (
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

// req is one call in flight: what was registered for it and where its
// reply goes.
type req struct {
	xid  uint32
	call *oncrpc.Call

	hdr    Header
	hdrBuf xdr.Encoder
	sgl    [][]byte

	regs      []*mrcache.Registration
	writeOff  []Segment // the Write chunk offered, to check the reply's echo
	replyBuf  []byte    // Reply chunk target
	replySegs []Segment
	kinds     [2]chunkKind // call and reply decisions, for tracing and counters
	pzrcBuf   []byte
	tr        *Transport
	probe     bool // sent as the version-2 negotiation probe
	resend    bool // the probe met ERR_VERS: send again as version 1

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
func (c *conn) marshal(r *req, credits uint32, vers uint32, sendSize, recvLimit int) error {
	call := r.call
	h := &r.hdr
	*h = Header{XID: call.XID, Vers: vers, Credit: credits, Proc: ProcMsg, Reads: h.Reads[:0], Writes: h.Writes[:0]}

	// Reply side first: it adds to the header's size.
	recvRoom := recvLimit - replyHeaderRoom
	if n := len(call.ReplyBulk); n > 0 && call.MaxReplySize+n > recvRoom {
		reg, err := c.register(r, call.ReplyBulk, verbs.AccessRemoteWrite|verbs.AccessLocalWrite)
		if err != nil {
			return err
		}
		// RFC 8166 s3.4.6: a Write chunk gets no room for XDR padding.
		r.writeOff = append(r.writeOff[:0], Segment{Handle: reg.STag, Length: uint32(n), Offset: reg.Offset})
		h.Writes = append(h.Writes, r.writeOff)
		r.kinds[1] = chunkWrite
	}
	if call.MaxReplySize > recvRoom {
		size := xdr.RoundUp(call.MaxReplySize)
		if cap(r.replyBuf) < size {
			r.replyBuf = make([]byte, size)
		}
		r.replyBuf = r.replyBuf[:size]
		reg, err := c.register(r, r.replyBuf, verbs.AccessRemoteWrite|verbs.AccessLocalWrite)
		if err != nil {
			return err
		}
		r.replySegs = append(r.replySegs[:0], Segment{Handle: reg.STag, Length: uint32(size), Offset: reg.Offset})
		h.Reply = r.replySegs
		if r.kinds[1] != chunkWrite {
			r.kinds[1] = chunkReply
		}
	}

	hdrLen := MinHeaderLen + len(h.Writes)*chunkHdrLen + writeSegLen*len(h.Writes)
	if h.Reply != nil {
		hdrLen += writeSegLen
	}
	pad := zeroPad[:xdr.Pad(len(call.Bulk))]
	switch {
	case hdrLen+call.Len() <= sendSize:
		r.kinds[0] = chunkInline
		r.sgl = append(r.sgl[:0], nil, call.Head, call.Bulk, pad, call.Tail)
	case call.Bulk != nil && hdrLen+readSegLen+len(call.Head)+len(call.Tail) <= sendSize:
		// RFC 8166 s3.4.5: the Read chunk's position is the offset of the
		// reduced item in the whole payload stream; the item's XDR pad
		// goes with it (s3.4.4), so Tail follows Head directly.
		reg, err := c.register(r, call.Bulk, verbs.AccessRemoteRead)
		if err != nil {
			return err
		}
		h.Reads = append(h.Reads, ReadSegment{Position: uint32(len(call.Head)),
			Segment: Segment{Handle: reg.STag, Length: uint32(len(call.Bulk)), Offset: reg.Offset}})
		r.kinds[0] = chunkRead
		r.sgl = append(r.sgl[:0], nil, call.Head, call.Tail)
	default:
		// RFC 8166 s3.5.3: a Position-Zero Read chunk carries the whole
		// call, padding included, and the Send carries only the header.
		buf := r.pzrcBuf[:0]
		buf = append(buf, call.Head...)
		buf = append(buf, call.Bulk...)
		buf = append(buf, pad...)
		buf = append(buf, call.Tail...)
		r.pzrcBuf = buf
		reg, err := c.register(r, buf, verbs.AccessRemoteRead)
		if err != nil {
			return err
		}
		h.Proc = ProcNoMsg
		h.Reads = append(h.Reads, ReadSegment{Position: 0,
			Segment: Segment{Handle: reg.STag, Length: uint32(len(buf)), Offset: reg.Offset}})
		r.kinds[0] = chunkPosZero
		r.sgl = append(r.sgl[:0], nil)
	}
	r.hdrBuf.Reset(r.hdrBuf.Bytes())
	h.Append(&r.hdrBuf)
	r.sgl[0] = r.hdrBuf.Bytes()
	if n := sglLen(r.sgl); n > sendSize {
		return fmt.Errorf("rpcrdma: marshal xid %#x: %d-byte Send exceeds the peer's %d-byte inline threshold", call.XID, n, sendSize)
	}
	return nil
}

func sglLen(sgl [][]byte) int {
	n := 0
	for _, b := range sgl {
		n += len(b)
	}
	return n
}

func (c *conn) register(r *req, buf []byte, access verbs.Access) (*mrcache.Registration, error) {
	reg, err := c.mrc.Register(buf, access)
	if err != nil {
		return nil, fmt.Errorf("rpcrdma: xid %#x: %w", r.xid, err)
	}
	r.regs = append(r.regs, reg)
	return reg, nil
}

// invalidate ends every registration of r before its reply is handed up
// (RFC 8166 s8.1), unless the peer already did with Send With Invalidate.
func (r *req) invalidate() {
	for i, reg := range r.regs {
		reg.Invalidate()
		r.regs[i] = nil
	}
	r.regs = r.regs[:0]
}
