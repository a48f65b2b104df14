package fuse

import (
	"context"
	"sync"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// BufferPool lends memory the transport moves without copying: the
// registered slab of an RPC-over-RDMA transport (mrcache.Pool). READ data
// lands in it by RDMA Write and goes to the kernel from it; WRITE data is
// copied into it once, from go-fuse's request buffer, and read from it by
// the server's RDMA Read. Alloc never waits: ErrNoMemory (any error)
// makes the caller use ordinary memory, which the transport then copies.
type BufferPool interface {
	Alloc(n int) (Buffer, error)
}

// Buffer is memory lent by a BufferPool (mrcache.Buffer). The calls that
// use it name it (the oncrpc.View of nfsclient's Read and Write is made
// from it: oncrpc.Lent), so the transport knows it for its own; Release
// gives it back.
type Buffer interface {
	oncrpc.Registered
	Release() error
}

// slabResult is a READ reply whose data stays in a pool buffer until
// go-fuse has written it to the kernel. It implements go-fuse's vectored
// result (Slices), so go-fuse writes it with writev from where it is and
// calls Done afterwards.
type slabResult struct {
	buf  Buffer
	data []byte
}

var _ gofuse.ReadResult = (*slabResult)(nil)

// Bytes returns the data in place.
func (r *slabResult) Bytes([]byte) ([]byte, gofuse.Status) { return r.data, gofuse.OK }

// Slices returns the data in place, for a vectored write to the kernel.
func (r *slabResult) Slices() ([][]byte, gofuse.Status) { return [][]byte{r.data}, gofuse.OK }

// Size returns the number of data bytes.
func (r *slabResult) Size() int { return len(r.data) }

// Done gives the buffer back once the data is with the kernel.
func (r *slabResult) Done() {
	if r.buf != nil {
		_ = r.buf.Release()
		r.buf, r.data = nil, nil
	}
}

// replyResult is a READ reply answered from the RPC reply's buffer
// (nfsclient.Client.ReadInPlace): go-fuse writes it to the kernel with
// writev from there and calls Done, which gives the buffer back.
type replyResult struct {
	data    []byte
	release func()
}

var _ gofuse.ReadResult = (*replyResult)(nil)

func (r *replyResult) Bytes([]byte) ([]byte, gofuse.Status) { return r.data, gofuse.OK }

func (r *replyResult) Slices() ([][]byte, gofuse.Status) { return [][]byte{r.data}, gofuse.OK }

func (r *replyResult) Size() int { return len(r.data) }

func (r *replyResult) Done() {
	if r.release != nil {
		r.release()
		r.release = nil
	}
}

// writeBuffer is a file's write-back buffer: pool memory when the
// transport has a pool, ordinary memory otherwise.
type writeBuffer struct {
	b    []byte       // len: bytes buffered; cap: room
	mem  Buffer       // the pool memory b lies in; nil: ordinary memory
	heap *heapBuffers // where ordinary memory of the recycled size goes back
}

// heapBuffers recycles the ordinary-memory write-back buffers of one
// size (wsize) once the UnstableWriter gives them back: a large write
// would otherwise allocate, and have the runtime zero, a fresh wsize
// buffer for every wsize of data, and leave the garbage collector the
// old ones.
type heapBuffers struct {
	size int
	p    sync.Pool // of *[]byte with cap size
}

func (hb *heapBuffers) get(n int) []byte {
	if n == hb.size {
		if b, ok := hb.p.Get().(*[]byte); ok {
			return (*b)[:0]
		}
	}
	return make([]byte, 0, n)
}

func (hb *heapBuffers) put(b []byte) {
	if cap(b) == hb.size {
		b = b[:0]
		hb.p.Put(&b)
	}
}

// newWriteBuffer returns an empty buffer with room for n bytes.
func (f *FS) newWriteBuffer(n int) writeBuffer {
	if p := f.opts.Buffers; p != nil {
		if m, err := p.Alloc(n); err == nil {
			return writeBuffer{b: m.Bytes()[:0], mem: m}
		}
	}
	return writeBuffer{b: f.heap.get(n), heap: &f.heap}
}

// newWriteBufferLocked is newWriteBuffer for h: when the pool is used up
// and h has unstable data waiting for a COMMIT, it commits first, which
// gives that data's buffers back (as the Linux client commits when too
// many unstable pages pile up), and tries again.
func (h *file) newWriteBufferLocked(ctx context.Context, n int) writeBuffer {
	f := h.n.fsys
	wb := f.newWriteBuffer(n)
	if wb.mem != nil || f.opts.Buffers == nil || h.w == nil || h.w.Pending() == 0 {
		return wb
	}
	if err := h.w.Commit(uninterrupted(ctx)); err != nil {
		if h.werr == nil {
			h.werr = err
		}
		return wb
	}
	if better := f.newWriteBuffer(n); better.mem != nil {
		return better
	}
	return wb
}

// view returns the buffered bytes as the calls that send them take them.
func (w writeBuffer) view() oncrpc.View {
	if w.mem != nil {
		return oncrpc.Lent(w.mem).Slice(0, len(w.b))
	}
	return oncrpc.Plain(w.b)
}

// release returns the function that gives the buffer back to where it
// came from, nil if it goes to the garbage collector; the caller no
// longer uses b once that has run.
func (w writeBuffer) release() func() {
	if w.mem != nil {
		return func() { _ = w.mem.Release() }
	}
	if w.heap != nil && cap(w.b) == w.heap.size {
		hb, b := w.heap, w.b
		return func() { hb.put(b) }
	}
	return nil
}
