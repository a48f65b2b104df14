package iwarp

import (
	"context"
	"fmt"
	"sync"

	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/internal/spi"
)

// maxIndex bounds the 24-bit STag index (the high bits of an STag).
const maxIndex = 1 << 24

// STagTable is the pure-Go provider's side of a protection domain: the
// table an RNIC keeps on the adapter, mapping each STag to the memory it
// names, its rights and whether it is valid, which the provider consults
// for every tagged access of the peer (RFC 5040 s5: RDMA Write and Read
// Request sinks and sources, Send With Invalidate). It also counts the
// bytes the peer places in each region (spi.PlacementCounter) and makes
// an invalidation wait for accesses in progress (spi.Quiescer).
//
// It is the domain's registration hook (spi.Hook): the domain calls Register,
// Reregister, Invalidate and Deregister with its lock held, which is
// taken before the table's own. The provider's data path (Begin, Place,
// Resolve) takes only the table's lock.
//
// An STag is index<<8 | key. The table hands out indexes round robin and
// rotates a region's key on every Reregister and FastRegister; when a
// region has used all 256 keys of its index it moves to a fresh index, so
// an STag comes back only after some 2^32 bindings (RFC 8166 s8.1.2:
// unpredictable, not reused handles).
type STagTable struct {
	pd    *verbs.ProtectionDomain
	inner DeviceStandIn // hardware stand-in: keys come from it

	mu        sync.Mutex
	idle      sync.Cond                       // signalled when a region's accesses end
	regions   map[uint32]*Region              // by STag index
	byMR      map[*verbs.MemoryRegion]*Region // the entry of each region
	nextIndex uint32
}

// link is package verbs's provider side (see verbs/internal/spi).
var link = spi.Get[*verbs.MemoryRegion, *verbs.ProtectionDomain, verbs.Access]()

var (
	_ spi.Hook[*verbs.MemoryRegion]             = (*STagTable)(nil)
	_ spi.Quiescer[*verbs.MemoryRegion]         = (*STagTable)(nil)
	_ spi.PlacementCounter[*verbs.MemoryRegion] = (*STagTable)(nil)
	_ spi.RemoteAddresser[*verbs.MemoryRegion]  = (*STagTable)(nil)
	_ verbs.DomainProvider                      = (*Provider)(nil)
)

// DeviceStandIn is what a test puts in the place of a hardware device's
// memory translation (NewProtectionDomainWithHook): it sees every
// registration of the domain, with the domain's lock held, and assigns
// the STags, as a device does. Register of a fast-registration region may
// return STag 0 (no key until it is bound). A stand-in whose regions are
// addressed by address also has RemoteAddr(*verbs.MemoryRegion) uint64.
type DeviceStandIn interface {
	Register(mr *verbs.MemoryRegion) (stag uint32, err error)
	Reregister(mr *verbs.MemoryRegion) (stag uint32, err error)
	Invalidate(mr *verbs.MemoryRegion) error
	Deregister(mr *verbs.MemoryRegion) error
}

// Region is the table's entry for one memory region: what a tagged access
// of the peer reaches.
type Region struct {
	t      *STagTable
	mr     *verbs.MemoryRegion
	buf    []byte
	access verbs.Access
	stag   uint32
	valid  bool
	// busy counts accesses in progress (Begin .. End); waiters the
	// Quiesce calls waiting for busy to drop.
	busy, waiters int
	// aborters are the accesses in progress that an invalidation can
	// stop (BeginAccess with an Aborter).
	aborters []Aborter
	// placed is how many bytes from the start the peer has written
	// without a gap since the region was bound (EndAccess, Place).
	placed uint64
}

// Aborter is an access of the provider that can wait for the peer: a
// placement whose payload the peer stalls, a Read Response the peer does
// not take. An invalidation of the region calls AbortAccess of each such
// access in progress, with the table's lock held; the provider then stops
// the transfer at once (and breaks the connection, RFC 8166 s8.1.4) and
// ends the access, instead of letting the invalidation wait for the peer.
// AbortAccess must not block and must not call into the table or domain.
type Aborter interface {
	AbortAccess()
}

// NewProtectionDomain returns a protection domain of the pure-Go provider.
func NewProtectionDomain() *verbs.ProtectionDomain {
	return newDomain(nil)
}

// NewProtectionDomainWithHook returns a protection domain of the pure-Go
// provider that stands in for hardware: inner assigns the keys and sees
// every registration, as a device would, and the domain does not count
// placed bytes (verbs.ProtectionDomain.CountsPlacement is false), as
// hardware cannot. Tests use it to run the rdma-core provider's
// bookkeeping over the pure-Go wire.
func NewProtectionDomainWithHook(inner DeviceStandIn) *verbs.ProtectionDomain {
	return newDomain(inner)
}

// NewProtectionDomain implements verbs.DomainProvider.
func (pv *Provider) NewProtectionDomain() *verbs.ProtectionDomain { return NewProtectionDomain() }

func newDomain(inner DeviceStandIn) *verbs.ProtectionDomain {
	t := &STagTable{inner: inner, regions: make(map[uint32]*Region), byMR: make(map[*verbs.MemoryRegion]*Region), nextIndex: 1}
	t.idle.L = &t.mu
	t.pd = link.NewDomain(t)
	return t.pd
}

// TableOf returns the STag table of a protection domain of this provider,
// nil for another provider's.
func TableOf(pd *verbs.ProtectionDomain) *STagTable {
	if pd == nil {
		return nil
	}
	t, _ := link.HookOf(pd).(*STagTable)
	return t
}

// PD returns the table's protection domain.
func (t *STagTable) PD() *verbs.ProtectionDomain { return t.pd }

// Register implements spi.Hook.
func (t *STagTable) Register(mr *verbs.MemoryRegion) (uint32, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := &Region{t: t, mr: mr}
	if t.inner != nil {
		stag, err := t.inner.Register(mr)
		if err != nil {
			return 0, err
		}
		r.stag = stag
	} else {
		idx, err := t.allocIndexLocked()
		if err != nil {
			return 0, err
		}
		r.stag = idx << 8
	}
	if !mr.IsFast() {
		r.buf, r.access, r.valid = link.Bytes(mr), link.Access(mr), true
	}
	t.byMR[mr] = r
	if r.stag != 0 {
		t.indexLocked(r)
	}
	return r.stag, nil
}

// Reregister implements spi.Hook: a new key, the region's
// memory and rights as they are now, and no bytes placed yet. A region an
// access is still using cannot be bound again.
func (t *STagTable) Reregister(mr *verbs.MemoryRegion) (uint32, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.byMR[mr]
	if r == nil {
		return 0, fmt.Errorf("STag %#08x: %w", link.STag(mr), verbs.ErrInvalidSTag)
	}
	if r.busy > 0 {
		return 0, fmt.Errorf("STag %#08x: still in use by the provider: %w", r.stag, verbs.ErrInvalidWR)
	}
	old := r.stag
	switch {
	case t.inner != nil:
		stag, err := t.inner.Reregister(mr)
		if err != nil {
			return 0, err
		}
		t.unindexLocked(r)
		r.stag = stag
		t.indexLocked(r)
	case (old+1)&0xff != 0:
		r.stag = old&^0xff | (old+1)&0xff
	default:
		// Every key of this index was used: a fresh index keeps a
		// stale STag from matching again (RFC 8166 s8.1.2).
		if idx, err := t.allocIndexLocked(); err == nil {
			t.unindexLocked(r)
			r.stag = idx << 8
			t.indexLocked(r)
		} else {
			r.stag = old &^ 0xff // no free index: the key wraps
		}
	}
	r.buf, r.access, r.placed, r.valid = link.Bytes(mr), link.Access(mr), 0, true
	return r.stag, nil
}

// Invalidate implements spi.Hook: no new access starts, and
// accesses waiting for the peer are stopped (RFC 8166 s8.1.3: once
// invalid, no byte may be read or written for the peer any more). It does
// not wait for accesses in progress; Quiesce does.
func (t *STagTable) Invalidate(mr *verbs.MemoryRegion) error {
	if t.inner != nil {
		if err := t.inner.Invalidate(mr); err != nil {
			return err
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.byMR[mr]; r != nil {
		r.valid = false
		for _, a := range r.aborters {
			a.AbortAccess()
		}
	}
	return nil
}

// Deregister implements spi.Hook.
func (t *STagTable) Deregister(mr *verbs.MemoryRegion) error {
	if t.inner != nil {
		if err := t.inner.Deregister(mr); err != nil {
			return err
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.byMR[mr]; r != nil {
		t.unindexLocked(r)
		delete(t.byMR, mr)
	}
	return nil
}

// Quiesce implements spi.Quiescer: it waits until no access to mr is in
// progress, or ctx ends.
func (t *STagTable) Quiesce(ctx context.Context, mr *verbs.MemoryRegion) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.byMR[mr]
	if r == nil || r.busy == 0 {
		return nil
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			t.mu.Lock()
			t.idle.Broadcast()
			t.mu.Unlock()
		})
		defer stop()
	}
	r.waiters++
	defer func() { r.waiters-- }()
	for r.busy > 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("verbs: STag %#08x still in use by the provider: %w", r.stag, err)
		}
		t.idle.Wait()
	}
	return nil
}

// CountsPlacement implements spi.PlacementCounter: true unless the table
// stands in for hardware (NewProtectionDomainWithHook).
func (t *STagTable) CountsPlacement() bool { return t.inner == nil }

// Placed implements spi.PlacementCounter.
func (t *STagTable) Placed(mr *verbs.MemoryRegion) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.byMR[mr]; r != nil {
		return r.placed
	}
	return 0
}

// RemoteAddr implements spi.RemoteAddresser: 0 (regions are zero
// based), or what the hardware stand-in says.
func (t *STagTable) RemoteAddr(mr *verbs.MemoryRegion) uint64 {
	if ra, ok := t.inner.(spi.RemoteAddresser[*verbs.MemoryRegion]); ok {
		return ra.RemoteAddr(mr)
	}
	return 0
}

// allocIndexLocked finds a free STag index.
func (t *STagTable) allocIndexLocked() (uint32, error) {
	for range maxIndex {
		idx := t.nextIndex
		t.nextIndex++
		if t.nextIndex >= maxIndex {
			t.nextIndex = 1
		}
		if t.regions[idx] == nil {
			return idx, nil
		}
	}
	return 0, fmt.Errorf("all %d STag indexes in use", maxIndex-1)
}

// indexLocked records r under its STag index; an invalid region holding
// it is forgotten (the domain refuses to reuse a valid one's index).
func (t *STagTable) indexLocked(r *Region) { t.regions[r.stag>>8] = r }

// unindexLocked forgets r's STag index if r holds it.
func (t *STagTable) unindexLocked(r *Region) {
	if t.regions[r.stag>>8] == r {
		delete(t.regions, r.stag>>8)
	}
}

func (t *STagTable) lookupLocked(stag uint32, need verbs.Access, off, n uint64) (*Region, error) {
	r := t.regions[stag>>8]
	if r == nil || r.stag != stag || !r.valid {
		return nil, fmt.Errorf("STag %#08x: %w", stag, verbs.ErrInvalidSTag)
	}
	if r.access&need != need {
		return nil, fmt.Errorf("STag %#08x has %v, needs %v: %w", stag, r.access, need, verbs.ErrAccess)
	}
	size := uint64(len(r.buf))
	if off > size || n > size-off {
		return nil, fmt.Errorf("STag %#08x: [%d, +%d) outside %d bytes: %w", stag, off, n, size, verbs.ErrBounds)
	}
	return r, nil
}

// Resolve checks an access to [off, off+n) of the region named by stag
// with the rights need, and returns that part of the region's memory.
// Errors wrap verbs.ErrInvalidSTag, verbs.ErrAccess or verbs.ErrBounds. To
// read or write the memory, use Begin instead, so that an invalidation
// waits for it.
func (t *STagTable) Resolve(stag uint32, need verbs.Access, off, n uint64) ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, err := t.lookupLocked(stag, need, off, n)
	if err != nil {
		return nil, err
	}
	return r.buf[off : off+n : off+n], nil
}

// Begin checks an access like Resolve and marks the region busy until
// End. Invalidating or deregistering the region waits for End, so once
// Invalidate has returned no byte of the region can be read or written
// for the peer any more, even by a placement that had already started
// (RFC 8166 s8.1).
func (t *STagTable) Begin(stag uint32, need verbs.Access, off, n uint64) ([]byte, *Region, error) {
	return t.BeginAccess(stag, need, off, n, nil)
}

// BeginAccess is Begin for an access that an invalidation may stop: until
// EndAccess, invalidating the region calls a.AbortAccess (see Aborter).
// A nil a makes it Begin.
func (t *STagTable) BeginAccess(stag uint32, need verbs.Access, off, n uint64, a Aborter) ([]byte, *Region, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, err := t.lookupLocked(stag, need, off, n)
	if err != nil {
		return nil, nil, err
	}
	r.busy++
	if a != nil {
		r.aborters = append(r.aborters, a)
	}
	return r.buf[off : off+n : off+n], r, nil
}

// Place checks an access like Begin and calls place with the region's
// bytes while holding the table's lock, for a placement that cannot wait
// (a copy of bytes already received): an invalidation cannot overlap it,
// and it costs one lock where Begin and End take two. place must be
// short, must not block and must not call into the table or domain; it
// returns how many bytes it placed at off (see EndAccess), 0 if it
// failed. Place returns the lookup's error, or place's.
func (t *STagTable) Place(stag uint32, need verbs.Access, off, n uint64, place func([]byte) (uint64, error)) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, err := t.lookupLocked(stag, need, off, n)
	if err != nil {
		return err
	}
	placed, err := place(r.buf[off : off+n : off+n])
	r.notePlacedLocked(off, placed)
	return err
}

// InvalidateRemote performs the invalidation a received Send With
// Invalidate asks for (RFC 5040 s5.3), through the domain: only a valid
// region with remote access rights can be invalidated. It does not wait
// for accesses in progress; the upper layer's own Invalidate does.
func (t *STagTable) InvalidateRemote(stag uint32) error {
	return link.InvalidateRemote(t.pd, stag)
}

// End ends an access that Begin started.
func (r *Region) End() { r.EndAccess(nil, 0, 0) }

// EndAccess ends an access that BeginAccess started with a. A provider
// that wrote data of the peer into the region reports it as placed bytes
// at off (0 for a read, or a write that did not complete), so that the
// upper layer learns how much the peer really wrote
// (verbs.MemoryRegion.Placed).
func (r *Region) EndAccess(a Aborter, off, placed uint64) {
	t := r.t
	t.mu.Lock()
	if a != nil {
		for i, x := range r.aborters {
			if x == a {
				last := len(r.aborters) - 1
				r.aborters[i] = r.aborters[last]
				r.aborters[last] = nil
				r.aborters = r.aborters[:last]
				break
			}
		}
	}
	r.notePlacedLocked(off, placed)
	r.busy--
	if r.busy == 0 && r.waiters > 0 {
		t.idle.Broadcast()
	}
	t.mu.Unlock()
}

// MR returns the memory region of the entry.
func (r *Region) MR() *verbs.MemoryRegion { return r.mr }

// notePlacedLocked extends the region's gapless placed prefix by the
// placed bytes at off.
func (r *Region) notePlacedLocked(off, placed uint64) {
	if placed > 0 && off <= r.placed && off+placed > r.placed {
		r.placed = off + placed
	}
}
