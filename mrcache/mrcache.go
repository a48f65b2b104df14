// Package mrcache is a memory-registration cache over verbs memory
// regions. RPC-over-RDMA exposes caller buffers (FUSE read and write
// buffers, which go-fuse reuses) to the server as chunks; registering a
// buffer is costly on real hardware, so a region is registered once, found
// again by its address, and given a fresh key on every use: a stale STag
// from an earlier use never matches again (RFC 8166 s8.1). Each use is
// invalidated after its reply, and idle regions are evicted in LRU order
// once the cache holds more than its byte budget.
package mrcache

import (
	"container/list"
	"fmt"
	"sync"
	"unsafe"

	"github.com/rdmafs/rdmafs/verbs"
)

// Stats are the cache's counters.
type Stats struct {
	Hits, Misses    uint64
	Registrations   uint64 // new regions registered
	Invalidations   uint64
	Evictions       uint64
	BytesRegistered int64 // bytes in cached regions now
	Regions         int   // cached regions now
}

// Cache caches memory regions of one protection domain.
type Cache struct {
	pd       *verbs.ProtectionDomain
	maxBytes int64

	mu      sync.Mutex
	entries map[uintptr]*entry
	lru     list.List // idle entries, least recently used at the front
	stats   Stats
}

type entry struct {
	mr    *verbs.MemoryRegion
	base  uintptr
	size  int
	inUse bool
	elem  *list.Element // in lru while idle
}

// New returns a cache over pd holding at most maxBytes of idle
// registrations (0 means 256 MiB).
func New(pd *verbs.ProtectionDomain, maxBytes int64) *Cache {
	if maxBytes <= 0 {
		maxBytes = 256 << 20
	}
	return &Cache{pd: pd, maxBytes: maxBytes, entries: make(map[uintptr]*entry)}
}

// Registration is one use of a registered buffer: the STag and offset to
// put in a chunk segment. It must be released with Invalidate.
type Registration struct {
	c      *Cache
	e      *entry
	STag   uint32
	Offset uint64 // offset of the buffer within the region
	Len    int
}

// Register exposes buf to the peer with the given access rights and
// returns the registration to advertise. A buffer seen before reuses its
// region under a new key.
func (c *Cache) Register(buf []byte, access verbs.Access) (*Registration, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("mrcache: register an empty buffer")
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[base]; e != nil && !e.inUse && e.size >= len(buf) {
		stag, err := e.mr.Reregister(access)
		if err == nil {
			c.stats.Hits++
			e.inUse = true
			c.lru.Remove(e.elem)
			e.elem = nil
			return &Registration{c: c, e: e, STag: stag, Len: len(buf)}, nil
		}
		c.dropLocked(e)
	} else if e != nil && !e.inUse {
		c.dropLocked(e) // too small for this use: replace it
	}
	c.stats.Misses++
	mr, err := c.pd.RegisterMemory(buf, access)
	if err != nil {
		return nil, fmt.Errorf("mrcache: register %d bytes: %w", len(buf), err)
	}
	c.stats.Registrations++
	e := &entry{mr: mr, base: base, size: len(buf), inUse: true}
	if old := c.entries[base]; old == nil {
		// A buffer in use by another call is registered again without
		// being cached, so each region has one user at a time.
		c.entries[base] = e
		c.stats.BytesRegistered += int64(len(buf))
		c.stats.Regions++
	} else {
		e.base = 0
	}
	return &Registration{c: c, e: e, STag: mr.STag(), Len: len(buf)}, nil
}

// Invalidate ends the registration: the region's STag stops working (it
// may already have been invalidated remotely by Send With Invalidate) and
// the region goes back to the cache.
func (r *Registration) Invalidate() error {
	if r == nil || r.c == nil {
		return nil
	}
	c, e := r.c, r.e
	r.c = nil
	err := e.mr.Invalidate()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Invalidations++
	e.inUse = false
	if e.base == 0 || c.entries[e.base] != e {
		e.mr.Deregister()
		return err
	}
	e.elem = c.lru.PushBack(e)
	for c.stats.BytesRegistered > c.maxBytes && c.lru.Len() > 0 {
		c.dropLocked(c.lru.Front().Value.(*entry))
		c.stats.Evictions++
	}
	return err
}

// MR returns the region behind the registration (for RDMA Read sinks).
func (r *Registration) MR() *verbs.MemoryRegion { return r.e.mr }

func (c *Cache) dropLocked(e *entry) {
	if e.elem != nil {
		c.lru.Remove(e.elem)
		e.elem = nil
	}
	if c.entries[e.base] == e {
		delete(c.entries, e.base)
		c.stats.BytesRegistered -= int64(e.size)
		c.stats.Regions--
	}
	e.mr.Deregister()
}

// Stats returns the cache's counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Close deregisters every idle region. Regions in use are deregistered
// when their registration is invalidated.
func (c *Cache) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.lru.Len() > 0 {
		c.dropLocked(c.lru.Front().Value.(*entry))
	}
	for base, e := range c.entries {
		delete(c.entries, base)
		c.stats.BytesRegistered -= int64(e.size)
		c.stats.Regions--
		e.base = 0
	}
}
