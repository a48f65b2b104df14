package mrcache

import (
	"fmt"
	"sync"

	"github.com/rdmafs/rdmafs/verbs"
)

// Buffer is slab memory on loan to the upper layer: a READ destination or
// a write-back buffer that the transport moves without copying. It is how
// registered memory travels through the layers above the transport (the
// FUSE buffers, the oncrpc.Views of a Call's Bulk and ReplyBulk) back to the
// transport that exposes it: the transport knows the memory by the
// handle, not by its address, so ordinary memory is never taken for it,
// and exposing or returning it needs no search of the slab.
//
// The life of a Buffer: Get or GetWait lends it; while a call is in flight the
// transport exposes parts of it to the peer (Expose and the
// registration's work requests) and invalidates them before the call
// returns; Release gives it back to the pool. The
// holder must not use Bytes after Release.
type Buffer struct {
	pool *Pool
	ci   int    // the chunk's index: chunks stay put while a buffer is out
	off  uint64 // of mem in the chunk
	mu   sync.Mutex
	mem  []byte // nil once released
}

// Bytes returns the buffer's memory (nil after Release).
func (b *Buffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mem
}

// Pool returns the pool the buffer belongs to: a transport exposes only
// its own pool's buffers.
func (b *Buffer) Pool() *Pool { return b.pool }

// SGE returns the local scatter/gather element of the n bytes at off in
// the buffer, for a work request of the transport's own (a Send, a
// receive, an RDMA Read sink or Write source): the registered chunk and
// the offset in it, known from the handle.
func (b *Buffer) SGE(off, n int) (verbs.SGE, error) {
	b.mu.Lock()
	size, released := len(b.mem), b.mem == nil
	b.mu.Unlock()
	if released || off < 0 || n < 0 || off > size-n {
		return verbs.SGE{}, fmt.Errorf("mrcache: %d bytes at %d of a %d-byte buffer (released: %v): %w", n, off, size, released, ErrNotRegistered)
	}
	p := b.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return verbs.SGE{}, fmt.Errorf("mrcache: SGE: %w", ErrClosed)
	}
	return verbs.SGE{MR: p.chunks[b.ci].mr, Offset: b.off + uint64(off), Length: uint32(n)}, nil
}

// Release gives the buffer back to the pool. A second Release is an
// error, not a second free.
func (b *Buffer) Release() error {
	b.mu.Lock()
	mem := b.mem
	b.mem = nil
	b.mu.Unlock()
	if mem == nil {
		return fmt.Errorf("mrcache: release of a buffer already released: %w", ErrNotRegistered)
	}
	b.pool.mu.Lock()
	defer b.pool.mu.Unlock()
	return b.pool.putLocked(b.ci, b.off)
}

// Expose prepares the exposure of exactly the n bytes at off in the
// buffer to the peer, with the given access, under a new key (RFC 8166
// s8.1): the registration's FastRegisterWR binds it once posted (see
// Registration). The exposure is named by its offset in the buffer and
// checked against the buffer's length: nothing outside it can be offered.
func (b *Buffer) Expose(off, n int, access verbs.Access) (*Registration, error) {
	b.mu.Lock()
	size, released := len(b.mem), b.mem == nil
	b.mu.Unlock()
	switch {
	case released:
		return nil, fmt.Errorf("mrcache: expose: use of a released buffer: %w", ErrNotRegistered)
	case n <= 0:
		return nil, fmt.Errorf("mrcache: expose %d bytes of a buffer: %w", n, verbs.ErrInvalidWR)
	case off < 0 || off > size-n:
		return nil, fmt.Errorf("mrcache: expose %d bytes at %d: not inside the %d-byte buffer: %w", n, off, size, ErrNotRegistered)
	}
	return b.pool.exposeAt(b.ci, b.off+uint64(off), n, access)
}
