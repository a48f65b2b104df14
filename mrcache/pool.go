// Package mrcache owns the memory that RPC-over-RDMA exposes to a peer:
// a bounded slab allocated outside the Go heap (mmap) and registered once
// per chunk, from which the transport's receive and send buffers, READ
// destinations and write-back buffers are drawn, and a pool of
// fast-registration regions that expose exactly the bytes of one call for
// as long as the call is in flight (FRWR, as Linux xprtrdma's frwr_ops.c
// does).
//
// Why outside the Go heap: registering memory pins its pages for the NIC.
// If the Go runtime freed a registered heap slice and returned its pages
// to the OS, the region would keep the old pages while the address got
// new ones. The slab is mapped by the pool, registered while mapped, and
// unmapped only after it is deregistered and no buffer of it is in use, so
// that cannot happen; no Go heap slice is ever registered.
//
// Why per-call fast registration: the slab chunks themselves grant only
// local access. A call that offers a chunk to the peer binds a
// fast-registration region to exactly the bytes of its buffer under a
// fresh key, and invalidates it before the reply is used or the call
// returns for any other reason (RFC 8166 s8.1): the peer can never reach
// bytes outside, or after, its call. Fast-registration regions are reused
// from call to call, so registration costs nothing in the steady state:
// Stats reports exposures and how many reused a region.
//
// Every piece of slab memory is a Buffer, a handle that says where it is
// (its chunk and offset), so nothing is ever found by its address. The
// upper layer borrows one from Get and hands it down in the views of the
// calls that use it (oncrpc.Lent, oncrpc.Call's Bulk and ReplyBulk) back
// to the transport, which exposes it where it is:
//
//	pool := mrcache.New(pd, 64<<20)
//	buf, _ := pool.Get(1 << 20) // lent slab memory, or ErrNoMemory
//	reg, _ := buf.Expose(0, 4096, verbs.AccessRemoteWrite|verbs.AccessLocalWrite)
//	qp.PostSend(reg.FastRegisterWR(1)) // ahead of the Send that offers it
//	reg.Posted()
//	// advertise reg.STag, reg.Offset, reg.Len in a Write chunk; after the reply:
//	qp.PostSend(reg.LocalInvalidateWR(2)) // poll its completion, then
//	reg.Invalidated()
//	pool.Put(buf)
//
// The pool posts nothing itself: the transport posts the registration work
// requests on its queue pair and reaps their completions with its own.
//
// The transport's own buffers (receives, sends, Reply chunks, bounce
// buffers) come from GetWait, are posted by their handle (Buffer.SGE)
// and go back with Put.
package mrcache

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"syscall"

	"github.com/rdmafs/rdmafs/verbs"
)

// Sizes of the slab.
const (
	// MinBlock is the smallest allocation (order 0).
	MinBlock = 4 << 10
	// ChunkSize is what the pool maps and registers at a time, and the
	// largest allocation.
	ChunkSize = 4 << 20
	// DefaultBytes is the budget when New is given none.
	DefaultBytes = 64 << 20

	maxOrder       = 10 // ChunkSize == MinBlock << maxOrder
	blocksPerChunk = 1 << maxOrder
	// The upper layer's long-lived buffers (Get) may use this share of
	// the budget; the rest stays for buffers that live for one call
	// (GetWait), so that calls in flight always finish.
	upperShareNum, upperShareDen = 3, 4
)

// Errors.
var (
	// ErrNoMemory: the budget is used up (Get does not wait).
	ErrNoMemory = errors.New("mrcache: registered memory budget exhausted")
	// ErrNotRegistered: a buffer is not slab memory of this pool.
	ErrNotRegistered = errors.New("mrcache: buffer is not registered memory of this pool")
	// ErrClosed: the pool was closed.
	ErrClosed = errors.New("mrcache: pool closed")
)

// Stats are the pool's counters.
type Stats struct {
	Chunks          int   // slab chunks mapped and registered now
	BytesRegistered int64 // their bytes
	BytesInUse      int64 // bytes of blocks handed out now
	BudgetBytes     int64 // the most the pool maps
	Allocs          uint64
	AllocFailures   uint64 // Get found no memory (the caller fell back)
	// Exposures counts fast registrations (one per buffer a call
	// offered to the peer); ExposureReuses those that bound a region
	// that already existed (reserved ahead, or idle after an earlier
	// call) instead of allocating one while the call was in flight.
	Exposures, ExposureReuses uint64
	FastRegions               int // fast-registration regions in existence
	LiveExposures             int // exposed now (calls in flight)
	// QuarantinedBytes is slab memory kept mapped for good because a
	// deregistration of it, or of a region bound inside it, failed: the
	// device may still reach it, so it is never unmapped or reused.
	QuarantinedBytes int64
}

// ReuseRate returns ExposureReuses/Exposures (1 when nothing was exposed).
func (s Stats) ReuseRate() float64 {
	if s.Exposures == 0 {
		return 1
	}
	return float64(s.ExposureReuses) / float64(s.Exposures)
}

// Pool is a protection domain's registered memory. It is safe for
// concurrent use.
type Pool struct {
	pd        *verbs.ProtectionDomain
	maxChunks int
	upperMax  int64

	mu      sync.Mutex
	freed   chan struct{} // closed and replaced when memory is freed while waiters > 0
	waiters int
	chunks  []*chunk
	// Per block (global index chunk*blocksPerChunk + block): the order
	// of the free block starting there (-1: none), the order of the
	// allocated block starting there (-1: none), whether Get allocated
	// it, and free-list links.
	freeOrder  []int8
	allocOrder []int8
	upper      []bool
	next, prev []int32
	heads      [maxOrder + 1]int32 // free lists, -1 terminated
	inUse      int64
	upperInUse int64
	idleFR     []*Registration // fast-registration regions not bound now
	spare      []*Buffer       // handles given back by Recycle, for get to reuse
	stats      Stats
	closed     bool
}

type chunk struct {
	mem []byte
	mr  *verbs.MemoryRegion
	// pinned: a deregistration touching this chunk failed; its memory
	// stays mapped (quarantined) even after Close.
	pinned bool
}

// New returns a pool over pd that maps at most maxBytes (0 means
// DefaultBytes; at least one chunk).
func New(pd *verbs.ProtectionDomain, maxBytes int64) *Pool {
	if maxBytes <= 0 {
		maxBytes = DefaultBytes
	}
	n := max(1, int((maxBytes+ChunkSize-1)/ChunkSize))
	p := &Pool{pd: pd, maxChunks: n, freed: make(chan struct{})}
	p.upperMax = int64(n) * ChunkSize * upperShareNum / upperShareDen
	for i := range p.heads {
		p.heads[i] = -1
	}
	p.stats.BudgetBytes = int64(n) * ChunkSize
	return p
}

func orderOf(n int) int {
	blocks := (n + MinBlock - 1) / MinBlock
	return bits.Len(uint(blocks - 1))
}

// Get lends n bytes of registered memory from the upper layer's share of
// the budget, for a long-lived buffer (a READ destination, a write-back
// buffer). It never waits: when the share is used up it returns
// ErrNoMemory, and the caller uses ordinary memory, which the transport
// then copies through buffers of its own.
func (p *Pool) Get(n int) (*Buffer, error) {
	return p.get(n, true)
}

// GetWait returns n bytes of registered memory for a buffer that lives for
// one call (or for a connection: a transport's receive and send
// buffers), waiting for memory to be freed if the budget is used up.
func (p *Pool) GetWait(ctx context.Context, n int) (*Buffer, error) {
	for {
		b, err := p.get(n, false)
		if !errors.Is(err, ErrNoMemory) {
			return b, err
		}
		p.mu.Lock()
		p.waiters++
		freed := p.freed
		p.mu.Unlock()
		// Memory freed between get and here closed an earlier channel;
		// try once more before waiting on this one.
		if b, err := p.get(n, false); !errors.Is(err, ErrNoMemory) {
			p.unwait()
			return b, err
		}
		select {
		case <-freed:
			p.unwait()
		case <-ctx.Done():
			p.unwait()
			return nil, fmt.Errorf("mrcache: wait for %d bytes of registered memory: %w", n, ctx.Err())
		}
	}
}

func (p *Pool) unwait() {
	p.mu.Lock()
	p.waiters--
	p.mu.Unlock()
}

// wakeLocked tells GetWait callers that memory was freed.
func (p *Pool) wakeLocked() {
	if p.waiters > 0 {
		close(p.freed)
		p.freed = make(chan struct{})
	}
}

func (p *Pool) get(n int, upper bool) (*Buffer, error) {
	mem, ci, off, b, err := p.alloc(n, upper)
	if err != nil {
		return nil, err
	}
	if b == nil {
		return &Buffer{pool: p, ci: ci, off: off, mem: mem}, nil
	}
	b.mu.Lock()
	b.ci, b.off, b.mem = ci, off, mem
	b.mu.Unlock()
	return b, nil
}

// maxSpare bounds the handles the pool keeps for reuse.
const maxSpare = 256

// Recycle is Put for a buffer whose handle its caller alone holds (a
// transport's send or receive buffer, which never leaves it): the pool
// keeps the handle for a later Get or GetWait, which then allocates
// none. The caller must not use the handle afterwards, not even to
// release it: it may name another buffer by then.
func (p *Pool) Recycle(b *Buffer) error {
	if err := p.Put(b); err != nil {
		return err
	}
	p.mu.Lock()
	if len(p.spare) < maxSpare {
		p.spare = append(p.spare, b)
	}
	p.mu.Unlock()
	return nil
}

// alloc allocates n bytes and returns them with the chunk index and the
// offset in it of the memory (what a Buffer keeps to expose and free it
// without a search), and a recycled handle for them if there is one.
func (p *Pool) alloc(n int, upper bool) (mem []byte, ci int, off uint64, spare *Buffer, err error) {
	if n <= 0 || n > ChunkSize {
		return nil, 0, 0, nil, fmt.Errorf("mrcache: allocate %d bytes (1..%d): %w", n, ChunkSize, verbs.ErrInvalidWR)
	}
	order := orderOf(n)
	size := int64(MinBlock) << order
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, 0, 0, nil, ErrClosed
	}
	if upper && p.upperInUse+size > p.upperMax {
		p.stats.AllocFailures++
		return nil, 0, 0, nil, ErrNoMemory
	}
	k := order
	for k <= maxOrder && p.heads[k] < 0 {
		k++
	}
	if k > maxOrder {
		if len(p.chunks) >= p.maxChunks {
			if upper {
				p.stats.AllocFailures++
			}
			return nil, 0, 0, nil, ErrNoMemory
		}
		if err := p.growLocked(); err != nil {
			return nil, 0, 0, nil, err
		}
		k = maxOrder
	}
	g := p.heads[k]
	p.unlinkLocked(g)
	for k > order {
		k--
		p.pushLocked(g+1<<k, k) // the upper half stays free
	}
	p.allocOrder[g] = int8(order)
	p.upper[g] = upper
	p.inUse += size
	if upper {
		p.upperInUse += size
	}
	p.stats.Allocs++
	ci = int(g / blocksPerChunk)
	at := int(g%blocksPerChunk) * MinBlock
	if k := len(p.spare); k > 0 {
		spare, p.spare = p.spare[k-1], p.spare[:k-1]
	}
	return p.chunks[ci].mem[at : at+n : at+n], ci, uint64(at), spare, nil
}

// growLocked maps and registers one more chunk.
func (p *Pool) growLocked() error {
	mem, err := syscall.Mmap(-1, 0, ChunkSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("mrcache: map a %d-byte slab chunk: %w", ChunkSize, err)
	}
	// RFC 8166 s8.1: the chunk itself grants local access only; peers
	// reach it through per-call fast registrations.
	mr, err := p.pd.RegisterMemory(mem, verbs.AccessLocalWrite)
	if err != nil {
		_ = syscall.Munmap(mem)
		return fmt.Errorf("mrcache: register a slab chunk: %w", err)
	}
	c := &chunk{mem: mem, mr: mr}
	first := int32(len(p.chunks) * blocksPerChunk)
	p.chunks = append(p.chunks, c)
	for range blocksPerChunk {
		p.freeOrder = append(p.freeOrder, -1)
		p.allocOrder = append(p.allocOrder, -1)
		p.upper = append(p.upper, false)
		p.next = append(p.next, -1)
		p.prev = append(p.prev, -1)
	}
	p.pushLocked(first, maxOrder)
	p.stats.Chunks++
	p.stats.BytesRegistered += ChunkSize
	return nil
}

func (p *Pool) pushLocked(g int32, order int) {
	p.freeOrder[g] = int8(order)
	p.prev[g] = -1
	p.next[g] = p.heads[order]
	if h := p.heads[order]; h >= 0 {
		p.prev[h] = g
	}
	p.heads[order] = g
}

func (p *Pool) unlinkLocked(g int32) {
	order := p.freeOrder[g]
	if p.prev[g] >= 0 {
		p.next[p.prev[g]] = p.next[g]
	} else {
		p.heads[order] = p.next[g]
	}
	if p.next[g] >= 0 {
		p.prev[p.next[g]] = p.prev[g]
	}
	p.freeOrder[g] = -1
}

// CountsPlacement reports whether the provider reports the bytes the peer
// placed in an exposure (InvalidatePlaced's ok); see
// verbs.ProtectionDomain.CountsPlacement.
func (p *Pool) CountsPlacement() bool { return p.pd.CountsPlacement() }

// Put gives back a buffer that Get or GetWait returned (Buffer.Release):
// a buffer of another pool, or one given back already, is an error, not
// a free.
func (p *Pool) Put(b *Buffer) error {
	if b == nil || b.pool != p {
		return fmt.Errorf("mrcache: put of another pool's buffer: %w", ErrNotRegistered)
	}
	return b.Release()
}

// putLocked frees the block at off in chunk ci.
func (p *Pool) putLocked(ci int, off uint64) error {
	g := int32(ci*blocksPerChunk) + int32(off/MinBlock)
	order := int(p.allocOrder[g])
	if order < 0 {
		return fmt.Errorf("mrcache: put of a block that is not allocated: %w", ErrNotRegistered)
	}
	size := int64(MinBlock) << order
	p.allocOrder[g] = -1
	p.inUse -= size
	if p.upper[g] {
		p.upperInUse -= size
		p.upper[g] = false
	}
	// Buddy coalescing: a free buddy of the same order merges.
	base := int32(ci * blocksPerChunk)
	for order < maxOrder {
		buddy := base + (g - base) ^ (1 << order)
		if p.freeOrder[buddy] != int8(order) {
			break
		}
		p.unlinkLocked(buddy)
		g = min(g, buddy)
		order++
	}
	p.pushLocked(g, order)
	p.wakeLocked()
	p.maybeUnmapLocked()
	return nil
}

// Stats returns the pool's counters.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.BytesInUse = p.inUse
	for _, c := range p.chunks {
		if c.pinned {
			s.QuarantinedBytes += ChunkSize
		}
	}
	return s
}

// Close deregisters the idle fast-registration regions and the slab.
// Chunks are unmapped once every buffer is back (Put); exposures still
// live are deregistered when they are invalidated.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	for _, r := range p.idleFR {
		p.deregisterLocked(r)
		p.stats.FastRegions--
	}
	p.idleFR = nil
	close(p.freed) // waiters see ErrClosed
	p.freed = make(chan struct{})
	p.maybeUnmapLocked()
}

// deregisterLocked releases a fast-registration region. If that fails the
// device may still reach the chunk the region was bound in last: the chunk
// is pinned, never unmapped.
func (p *Pool) deregisterLocked(r *Registration) {
	if err := r.mr.Deregister(); err != nil && r.target != nil {
		r.target.pinned = true
	}
}

// maybeUnmapLocked releases the slab after Close once nothing is in use.
// Registered memory is never unmapped: a chunk whose deregistration
// failed, or that a region which failed to deregister was bound in, stays
// mapped (QuarantinedBytes), since the device may still write it.
func (p *Pool) maybeUnmapLocked() {
	if !p.closed || p.inUse != 0 {
		return
	}
	kept := p.chunks[:0]
	for _, c := range p.chunks {
		if !c.pinned {
			if err := c.mr.Deregister(); err != nil {
				c.pinned = true
			}
		}
		if c.pinned {
			kept = append(kept, c)
			continue
		}
		_ = syscall.Munmap(c.mem)
		p.stats.Chunks--
		p.stats.BytesRegistered -= ChunkSize
	}
	clear(p.chunks[len(kept):])
	p.chunks = kept
}
