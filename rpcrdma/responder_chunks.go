package rpcrdma

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/verbs"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// The responder's RDMA Reads of Read chunks and RDMA Writes of Write and
// Reply chunks.

// pullReadChunks rebuilds the whole call: it RDMA-Reads each Read chunk
// straight to its position in the payload stream, after which come the
// XDR padding the requester left out (RFC 8166 s3.4.5) and the rest of
// the inline part. The returned release gives the buffer back.
func (c *serverConn) pullReadChunks(h *Header, inline []byte) (call []byte, release func(), err error) {
	if len(h.Reads) == 0 {
		if h.Proc == ProcNoMsg {
			return nil, nil, errors.New("RDMA_NOMSG without a Read chunk")
		}
		return inline, func() {}, nil
	}
	pos := h.Reads[0].Position
	total := 0
	for _, r := range h.Reads {
		if r.Position != pos {
			return nil, nil, errors.New("more than one Read chunk")
		}
		total += int(r.Length)
	}
	if h.Proc == ProcNoMsg && pos != 0 {
		return nil, nil, fmt.Errorf("RDMA_NOMSG with a Read chunk at position %d", pos)
	}
	if h.Proc == ProcNoMsg {
		inline = nil // RFC 8166 s3.5.3: the chunk is the whole call
	}
	if pos%4 != 0 || int(pos) > len(inline) {
		// RFC 8166 s3.4.5: positions are multiples of four inside the
		// payload stream.
		return nil, nil, fmt.Errorf("bad Read chunk position %d (payload %d bytes)", pos, len(inline))
	}
	if total > maxChunkBytes {
		return nil, nil, fmt.Errorf("read chunk of %d bytes exceeds the %d-byte limit", total, maxChunkBytes)
	}
	pad := xdr.Pad(total)
	if h.Proc == ProcNoMsg {
		pad = 0 // a Position-Zero Read chunk carries its own padding (s3.5.3)
	}
	// The call is rebuilt in registered memory when it fits one slab
	// buffer, so the RDMA Reads land in place; larger calls go through
	// registered pieces into ordinary memory.
	size := len(inline) + total + pad
	var buf []byte
	var put func()
	var into *mrcache.Buffer // the registered buffer buf is, nil for ordinary memory
	if size <= mrcache.ChunkSize {
		b, err := c.getBuf(size, true, false)
		if err != nil {
			return nil, nil, err
		}
		buf, put, into = b.Bytes()[:size], func() { c.putBuf(b, true) }, b
	} else {
		bp := getCallBuf(size)
		buf, put = *bp, func() { putCallBuf(bp) }
	}
	copy(buf, inline[:pos])
	if err := c.rdmaRead(h.Reads, buf[pos:int(pos)+total], into, int(pos)); err != nil {
		put()
		return nil, nil, err
	}
	copy(buf[int(pos)+total:], zeroPad[:pad])
	copy(buf[int(pos)+total+pad:], inline[pos:])
	return buf, put, nil
}

const maxChunkBytes = 64 << 20

// callBufs pools the buffers calls are rebuilt in, by power-of-two size.
var callBufs [28]sync.Pool

func getCallBuf(n int) *[]byte {
	class := bits.Len(uint(max(n, 1) - 1))
	if class >= len(callBufs) {
		b := make([]byte, n)
		return &b
	}
	if v := callBufs[class].Get(); v != nil {
		bp := v.(*[]byte)
		*bp = (*bp)[:n]
		return bp
	}
	b := make([]byte, n, 1<<class)
	return &b
}

func putCallBuf(bp *[]byte) {
	class := bits.Len(uint(max(cap(*bp), 1) - 1))
	if class < len(callBufs) && cap(*bp) == 1<<class {
		callBufs[class].Put(bp)
	}
}

// rdmaPiece bounds one RDMA Read or Write of the responder: its local
// memory is a slab buffer of at most this size.
const rdmaPiece = 1 << 20

// rdmaRead reads the segments, in order, into dst (RFC 5040 RDMA Read):
// straight into it when dst is the bytes at at in into, a registered
// buffer, else through registered buffers of at most rdmaPiece bytes.
func (c *serverConn) rdmaRead(segs []ReadSegment, dst []byte, into *mrcache.Buffer, at int) error {
	type piece struct {
		dst []byte
		ch  chan verbs.Completion
	}
	var pieces []piece
	// A requester that leaves the Reads unanswered holds the call's
	// memory and slot: past the deadline its connection is closed.
	timer := time.NewTimer(c.s.cfg.ReadTimeout)
	defer timer.Stop()
	wait := func() error {
		var err error
		for _, p := range pieces {
			select {
			case w := <-p.ch:
				if w.Status != verbs.StatusSuccess && err == nil {
					err = fmt.Errorf("RDMA Read: %v", w.Status)
				}
			case <-c.qp.Done():
				return fmt.Errorf("RDMA Read: %w", c.qp.Err())
			case <-timer.C:
				if c.readTimedOut.CompareAndSwap(false, true) {
					// Counted once per connection: its other calls'
					// Reads time out with it.
					c.tracef("closing: a Read chunk unanswered for %v", c.s.cfg.ReadTimeout)
					c.s.stats.readTimeouts.Add(1)
				}
				c.qp.Close()
				return fmt.Errorf("RDMA Read: unanswered for %v: connection closed", c.s.cfg.ReadTimeout)
			}
		}
		pieces = pieces[:0]
		timer.Reset(c.s.cfg.ReadTimeout)
		return err
	}
	off := 0
	for _, s := range segs {
		for done := uint32(0); done < s.Length; {
			n := min(s.Length-done, rdmaPiece)
			p := piece{dst: dst[off : off+int(n)], ch: make(chan verbs.Completion, 1)}
			pieces = append(pieces, p)
			wr := verbs.SendWR{WRID: c.wr.Add(1) | 1<<63, Opcode: verbs.OpRDMARead, RemoteSTag: s.Handle,
				RemoteOffset: s.Offset + uint64(done), Length: n}
			var err error
			if into != nil {
				// Straight into the registered call buffer.
				var sge verbs.SGE
				if sge, err = into.SGE(at+off, int(n)); err == nil {
					err = c.postSGE(wr, sge, wrDone{ch: p.ch})
				}
			} else {
				buf, gerr := c.getBuf(int(n), true, false)
				if gerr != nil {
					return gerr
				}
				err = c.post(wr, buf, int(n), wrDone{copyTo: p.dst, ch: p.ch, in: true})
			}
			if err != nil {
				return fmt.Errorf("RDMA Read: %w", err)
			}
			done += n
			off += int(n)
			if len(pieces) == 4 {
				if err := wait(); err != nil {
					return err
				}
			}
		}
	}
	return wait()
}

// rdmaWrite writes the bytes of view across chunk's segments in order
// and records the lengths used in ret.
func (c *serverConn) rdmaWrite(chunk []Segment, view oncrpc.View, ret []Segment, ref *replyRef) error {
	// Data the handler built in our registered memory, and will not
	// touch until it is released, goes out from where it is.
	owner, at := view.Owner()
	src, direct := owner.(*mrcache.Buffer)
	direct = direct && ref != nil && src.Pool() == c.s.pool
	data := view.Bytes()
	for i, s := range chunk {
		if len(data) == 0 {
			ret[i].Length = 0
			continue
		}
		n := min(int(s.Length), len(data))
		for done := 0; done < n; {
			k := min(n-done, rdmaPiece)
			wr := verbs.SendWR{WRID: c.wr.Add(1), Opcode: verbs.OpRDMAWrite, RemoteSTag: s.Handle, RemoteOffset: s.Offset + uint64(done)}
			if direct {
				sge, err := src.SGE(at+done, k)
				if err != nil {
					return fmt.Errorf("RDMA Write: %w", err)
				}
				ref.hold()
				if err := c.postSGE(wr, sge, wrDone{ref: ref}); err != nil {
					return fmt.Errorf("RDMA Write: %w", err)
				}
				done += k
				continue
			}
			buf, err := c.getBuf(k, false, false)
			if err != nil {
				return fmt.Errorf("RDMA Write: %w", err)
			}
			copy(buf.Bytes(), data[done:done+k])
			if err := c.post(wr, buf, k, wrDone{}); err != nil {
				return fmt.Errorf("RDMA Write: %w", err)
			}
			done += k
		}
		ret[i].Length = uint32(n)
		data = data[n:]
		at += n
	}
	return nil
}

// segsString and chunksString format segments as %v does, from a copy:
// arguments given to a formatter escape, and the reply's segments live
// on the stack.
func segsString(segs []Segment) string {
	return fmt.Sprint(append([]Segment(nil), segs...))
}

func chunksString(chunks [][]Segment) string {
	cp := make([][]Segment, len(chunks))
	for i, w := range chunks {
		cp[i] = append([]Segment(nil), w...)
	}
	return fmt.Sprint(cp)
}

// singleSTag returns the one STag the call exposed for the reply, if it
// exposed exactly one (the condition knfsd uses for Send With Invalidate).
func (c *serverConn) singleSTag(h *Header) (uint32, bool) {
	var stag uint32
	n := 0
	add := func(s uint32) {
		if n == 0 || s != stag {
			stag = s
			n++
		}
	}
	for _, w := range h.Writes {
		for _, s := range w {
			add(s.Handle)
		}
	}
	for _, s := range h.Reply {
		add(s.Handle)
	}
	return stag, n == 1
}
