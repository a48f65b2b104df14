package verbs

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmafs/rdmafs/verbs/internal/spi"
)

// registrationHook is a provider's side of a protection domain (see
// package verbs/internal/spi).
type registrationHook = spi.Hook[*MemoryRegion]

// ProtectionDomain owns memory regions and the queue pairs that may use
// them. It keeps the provider-neutral state of each region (its rights,
// its STag, valid or not, what a fast-registration region is bound to);
// the provider keeps the rest (its registration hook, see
// verbs/internal/spi). A provider makes its domains (DomainProvider). It
// is safe for concurrent use.
type ProtectionDomain struct {
	hook registrationHook

	mu      sync.Mutex
	regions map[uint32]*MemoryRegion // by STag index (stag >> 8)
	liveRem int                      // valid regions with remote access
}

// NewProtectionDomain returns a protection domain that no provider backs:
// regions get STags from a counter, and no queue pair can use them. It is
// for bookkeeping; a transport makes its domain with its provider's
// NewProtectionDomain (DomainProvider).
func NewProtectionDomain() *ProtectionDomain {
	return newDomain(&counterHook{})
}

// newDomain returns a protection domain whose registrations are mirrored
// by hook: a provider's domain (spi.Link.NewDomain).
func newDomain(hook registrationHook) *ProtectionDomain {
	return &ProtectionDomain{hook: hook, regions: make(map[uint32]*MemoryRegion)}
}

// counterHook names the regions of a domain no provider backs.
type counterHook struct{ next atomic.Uint32 }

func (h *counterHook) Register(*MemoryRegion) (uint32, error) {
	return h.next.Add(1) << 8, nil
}
func (h *counterHook) Reregister(mr *MemoryRegion) (uint32, error) { return h.Register(mr) }
func (h *counterHook) Invalidate(*MemoryRegion) error              { return nil }
func (h *counterHook) Deregister(*MemoryRegion) error              { return nil }

// MemoryRegion is registered memory. Its STag (the iWARP name; lkey and
// rkey in InfiniBand terms) is index<<8 | key; the provider changes the
// key on every Reregister and FastRegister so a stale STag never matches
// again (RFC 8166 s8.1.2: unpredictable, not reused handles).
//
// A region is either registered memory of its own (RegisterMemory: the
// transport's slab chunks, as ibv_reg_mr) or a fast-registration region
// (AllocFastReg, as ibv_alloc_mr) that FastRegister binds to exactly a
// part of a registered region for one use and Invalidate unbinds, the way
// FRWR work requests do (RFC 8166 s8.1 relies on this to expose exactly
// the bytes of one call).
type MemoryRegion struct {
	pd  *ProtectionDomain
	buf []byte

	// Guarded by pd.mu.
	access Access
	stag   uint32
	valid  bool
	dead   bool
	fast   bool          // allocated by AllocFastReg
	parent *MemoryRegion // a fast-registration region's current target
	offset uint64        // where buf starts in parent
	// binding: FastRegister is binding the region, without the domain's
	// lock; other changes to the region are refused meanwhile.
	binding bool

	// local is what resolveLocal checks, republished under pd.mu whenever it
	// changes, so that posting a work request (every SGE is checked)
	// takes no lock shared by all the domain's queue pairs.
	local atomic.Pointer[localView]
	// hookData is the registration hook's own record of the region
	// (spi.Link.SetData), read by the provider on its data path without
	// a lock.
	hookData atomic.Pointer[any]
}

// localView is a registered region as Local sees it.
type localView struct {
	buf    []byte
	access Access
	stag   uint32
	dead   bool
}

// publishLocked makes the region's current state what Local sees.
func (mr *MemoryRegion) publishLocked() {
	mr.local.Store(&localView{buf: mr.buf, access: mr.access, stag: mr.stag, dead: mr.dead})
}

// RegisterMemory registers buf with the given access rights. The region is
// valid until Invalidate, remote invalidation or Deregister. The caller
// keeps buf alive and unchanged in place until Deregister: with a hardware
// provider the pages are pinned, so buf should be memory the caller owns
// outside the Go heap (see package mrcache).
func (pd *ProtectionDomain) RegisterMemory(buf []byte, access Access) (*MemoryRegion, error) {
	mr := &MemoryRegion{pd: pd, buf: buf, access: access}
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if err := pd.addLocked(mr); err != nil {
		return nil, fmt.Errorf("verbs: register %d bytes: %w", len(buf), err)
	}
	mr.valid = true
	if access.Remote() {
		pd.liveRem++
	}
	mr.publishLocked()
	return mr, nil
}

// AllocFastReg returns a fast-registration region: it names no memory and
// is invalid until FastRegister binds it.
func (pd *ProtectionDomain) AllocFastReg() (*MemoryRegion, error) {
	mr := &MemoryRegion{pd: pd, fast: true}
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if err := pd.addLocked(mr); err != nil {
		return nil, fmt.Errorf("verbs: allocate fast-registration region: %w", err)
	}
	return mr, nil
}

// addLocked gives mr an STag; called with pd.mu held.
func (pd *ProtectionDomain) addLocked(mr *MemoryRegion) error {
	stag, err := pd.hook.Register(mr)
	if err != nil {
		return err
	}
	mr.stag = stag
	if stag == 0 {
		return nil // no key yet: indexed when Reregister gives one
	}
	return pd.indexLocked(mr)
}

// indexLocked records mr under its STag index. An invalid region holding
// the index is forgotten (its key is dead and the provider reused the
// index); a valid one is an error.
func (pd *ProtectionDomain) indexLocked(mr *MemoryRegion) error {
	if other := pd.regions[mr.stag>>8]; other != nil && other != mr {
		if other.valid {
			return fmt.Errorf("provider reused STag index %#x of a valid region", mr.stag>>8)
		}
	}
	pd.regions[mr.stag>>8] = mr
	return nil
}

// unindexLocked forgets mr's STag index if mr holds it.
func (pd *ProtectionDomain) unindexLocked(mr *MemoryRegion) {
	if pd.regions[mr.stag>>8] == mr {
		delete(pd.regions, mr.stag>>8)
	}
}

// LiveRemoteRegions returns how many valid regions grant remote access: an
// upper layer checks it is zero between calls (RFC 8166 s8.1: invalidate
// every region before handing a reply up).
func (pd *ProtectionDomain) LiveRemoteRegions() int {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	return pd.liveRem
}

// CountsPlacement reports whether the domain learns how many bytes the
// peer placed in its regions (MemoryRegion.Placed): true for the software
// provider, false for hardware, whose device places data without the
// domain seeing it. An upper layer that cannot count placed bytes clears a
// buffer before it exposes it for remote write, so that bytes the peer
// claims but did not write are zeros, never earlier contents.
func (pd *ProtectionDomain) CountsPlacement() bool {
	pc, ok := pd.hook.(spi.PlacementCounter[*MemoryRegion])
	return ok && pc.CountsPlacement()
}

// Placed returns how many bytes from the region's start the peer has
// written, without a gap, since the region was registered or bound last,
// as the provider saw them land. It stays readable
// after invalidation, until the region is bound again: an upper layer
// checks a responder's claimed Write chunk length against it (RFC 8166
// s3.4.6: only bytes the responder wrote are data). ok is false when the
// provider cannot know: hardware places data unseen.
func (mr *MemoryRegion) Placed() (n uint64, ok bool) {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	if pc, is := mr.pd.hook.(spi.PlacementCounter[*MemoryRegion]); is && pc.CountsPlacement() {
		return pc.Placed(mr), true
	}
	return 0, false
}

// invalidateRemote performs the invalidation a received Send With
// Invalidate asks for (RFC 5040 s5.3; spi.Link.InvalidateRemote). Only a
// valid region of this domain with remote access rights can be
// invalidated. It does not wait for accesses in progress; the upper
// layer's own Invalidate does.
func (pd *ProtectionDomain) invalidateRemote(stag uint32) error {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	mr := pd.regions[stag>>8]
	if mr == nil || mr.stag != stag || !mr.valid {
		return fmt.Errorf("invalidate STag %#08x: %w", stag, ErrInvalidSTag)
	}
	if !mr.access.Remote() {
		return fmt.Errorf("invalidate STag %#08x without remote access: %w", stag, ErrAccess)
	}
	return mr.invalidateLocked()
}

// invalidateLocked marks mr invalid; called with pd.mu held.
func (mr *MemoryRegion) invalidateLocked() error {
	if !mr.valid {
		return nil
	}
	if err := mr.pd.hook.Invalidate(mr); err != nil {
		return fmt.Errorf("verbs: invalidate STag %#08x: %w", mr.stag, err)
	}
	mr.valid = false
	if mr.access.Remote() {
		mr.pd.liveRem--
	}
	return nil
}

// quiesce waits, without the domain's lock, until the provider's accesses
// to mr in progress have ended (spi.Quiescer), or ctx ends.
func (mr *MemoryRegion) quiesce(ctx context.Context) error {
	if q, ok := mr.pd.hook.(spi.Quiescer[*MemoryRegion]); ok {
		return q.Quiesce(ctx, mr)
	}
	return nil
}

// PD returns the region's protection domain.
func (mr *MemoryRegion) PD() *ProtectionDomain { return mr.pd }

// Bytes returns the registered memory (for a fast-registration region,
// the part it is bound to now).
func (mr *MemoryRegion) Bytes() []byte {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	return mr.buf
}

// Len returns the size of the registered memory.
func (mr *MemoryRegion) Len() int {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	return len(mr.buf)
}

// STag returns the region's current STag (rkey and lkey).
func (mr *MemoryRegion) STag() uint32 {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	return mr.stag
}

// LKey returns the key that names the region in local work requests (the
// STag for iWARP; a separate lkey on InfiniBand hardware).
func (mr *MemoryRegion) LKey() uint32 { return mr.STag() }

// Access returns the region's current access rights.
func (mr *MemoryRegion) Access() Access {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	return mr.access
}

// Valid reports whether the region's STag is currently usable.
func (mr *MemoryRegion) Valid() bool {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	return mr.valid
}

// resolveLocal resolves a local scatter/gather element of this region for a
// provider (spi.Link.Local), checking that the region is alive and has
// need, and that [off, off+n) lies inside it. Errors wrap ErrInvalidSTag,
// ErrAccess or ErrBounds.
func (mr *MemoryRegion) resolveLocal(need Access, off uint64, n uint32) ([]byte, error) {
	v := mr.local.Load() // no lock: see MemoryRegion.local
	if mr.fast || v == nil || v.dead {
		var stag uint32
		if v != nil {
			stag = v.stag
		}
		return nil, fmt.Errorf("local key %#08x: %w", stag, ErrInvalidSTag)
	}
	if v.access&need != need {
		return nil, fmt.Errorf("local key %#08x has %v, needs %v: %w", v.stag, v.access, need, ErrAccess)
	}
	size := uint64(len(v.buf))
	if off > size || uint64(n) > size-off {
		return nil, fmt.Errorf("local key %#08x: [%d, +%d) outside %d bytes: %w", v.stag, off, n, size, ErrBounds)
	}
	return v.buf[off : off+uint64(n) : off+uint64(n)], nil
}

// Invalidate invalidates the region locally: its STag stops working for
// both sides until it is registered again, and Invalidate waits until
// provider accesses already in progress have ended. An access that waits
// for the peer is stopped at once where the provider can (the iWARP
// provider does); otherwise it stalls while the peer stalls a transfer,
// and closing the queue pair ends it (see InvalidateContext).
// Invalidating an invalid region only waits.
//
// It is the old, synchronous registration model: an OpLocalInvalidate
// work request replaces it for consumers (rpcrdma uses only that); the
// providers and tests without a queue pair still use it.
func (mr *MemoryRegion) Invalidate() error {
	return mr.InvalidateContext(context.Background())
}

// InvalidateContext is Invalidate with a bound on the wait. When ctx ends
// first the region is already invalid (no new access can start) but an
// access is still in progress: the caller must not reuse the memory
// before a later Invalidate returns nil (after closing the queue pair).
// Like Invalidate it is the old model (OpLocalInvalidate replaces it).
func (mr *MemoryRegion) InvalidateContext(ctx context.Context) error {
	mr.pd.mu.Lock()
	if mr.dead {
		mr.pd.mu.Unlock()
		return fmt.Errorf("verbs: invalidate: %w", ErrClosed)
	}
	err := mr.invalidateLocked()
	mr.pd.mu.Unlock()
	if err != nil {
		return err
	}
	return mr.quiesce(ctx)
}

// Reregister makes the region valid again with new access rights and a new
// STag key, and returns the new STag.
func (mr *MemoryRegion) Reregister(access Access) (uint32, error) {
	mr.pd.mu.Lock()
	if mr.dead || mr.fast {
		mr.pd.mu.Unlock()
		return 0, fmt.Errorf("verbs: reregister: %w", ErrClosed)
	}
	err := mr.invalidateLocked()
	mr.pd.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if err := mr.quiesce(context.Background()); err != nil {
		return 0, err
	}
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	if mr.dead || mr.fast {
		return 0, fmt.Errorf("verbs: reregister: %w", ErrClosed)
	}
	if err := mr.invalidateLocked(); err != nil { // bound again meanwhile
		return 0, err
	}
	return mr.rekeyLocked(access)
}

// rekeyLocked gives mr a new STag key and makes it valid with access.
func (mr *MemoryRegion) rekeyLocked(access Access) (uint32, error) {
	old := mr.stag
	mr.access = access
	stag, err := mr.pd.hook.Reregister(mr)
	if err != nil {
		return 0, fmt.Errorf("verbs: reregister STag %#08x: %w", old, err)
	}
	return mr.rekeyedLocked(old, stag)
}

// rekeyedLocked records mr's new STag from the provider and makes it
// valid with its access rights.
func (mr *MemoryRegion) rekeyedLocked(old, stag uint32) (uint32, error) {
	mr.pd.unindexLocked(mr)
	mr.stag = stag
	if err := mr.pd.indexLocked(mr); err != nil {
		return 0, fmt.Errorf("verbs: reregister STag %#08x: %w", old, err)
	}
	mr.valid = true
	if mr.access.Remote() {
		mr.pd.liveRem++
	}
	if !mr.fast { // resolveLocal refuses fast regions: nothing to publish, nothing to allocate per exposure
		mr.publishLocked()
	}
	return mr.stag, nil
}

// FastRegister binds the fast-registration region mr to exactly the n
// bytes at off in the registered region target, with access, under a new
// STag key, and returns that STag (a fast-register work request,
// IB_WR_REG_MR). mr must be invalid, and no access of the provider to it
// may be in progress: bound regions are invalidated before they are bound
// again, as FRWR requires.
//
// It is the old, synchronous registration model: an OpFastRegister work
// request (or OpBindWindow for a memory window) replaces it for consumers
// (rpcrdma uses only those); the providers carry those requests out with
// it, and tests without a queue pair use it.
func (mr *MemoryRegion) FastRegister(target *MemoryRegion, off uint64, n int, access Access) (uint32, error) {
	if target == nil || target.pd != mr.pd {
		return 0, fmt.Errorf("verbs: fast register: target of another protection domain: %w", ErrInvalidWR)
	}
	mr.pd.mu.Lock()
	switch {
	case !mr.fast || mr.dead:
		mr.pd.mu.Unlock()
		return 0, fmt.Errorf("verbs: fast register STag %#08x: not a fast-registration region: %w", mr.stag, ErrInvalidWR)
	case mr.valid || mr.binding:
		mr.pd.mu.Unlock()
		return 0, fmt.Errorf("verbs: fast register STag %#08x: still bound: %w", mr.stag, ErrInvalidWR)
	case target.dead || target.fast:
		mr.pd.mu.Unlock()
		return 0, fmt.Errorf("verbs: fast register: target is not registered memory: %w", ErrInvalidSTag)
	case n <= 0 || off > uint64(len(target.buf)) || uint64(n) > uint64(len(target.buf))-off:
		mr.pd.mu.Unlock()
		return 0, fmt.Errorf("verbs: fast register [%d, +%d) of a %d-byte region: %w", off, n, len(target.buf), ErrBounds)
	}
	parent, offset, buf, access0 := mr.parent, mr.offset, mr.buf, mr.access
	mr.parent, mr.offset, mr.access = target, off, access
	mr.buf = target.buf[off : off+uint64(n) : off+uint64(n)]
	mr.binding = true
	old := mr.stag
	mr.pd.mu.Unlock()

	// The binding runs without the domain's lock: with a hardware
	// provider it is a device call per exposure (ibv_reg_mr, or readying
	// a window's bind), which calls on the domain's other queue pairs
	// must not wait for. binding keeps other changes to mr out
	// meanwhile; the region is invalid until the end, so no access
	// through it can start.
	stag, err := mr.pd.hook.Reregister(mr)

	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	mr.binding = false
	if err == nil {
		stag, err = mr.rekeyedLocked(old, stag)
	} else {
		err = fmt.Errorf("verbs: reregister STag %#08x: %w", old, err)
	}
	if err != nil {
		mr.parent, mr.offset, mr.buf, mr.access = parent, offset, buf, access0
		return 0, err
	}
	return stag, nil
}

// RemoteAddr returns the address a peer names the region's first byte by
// (with RemoteOffset in an RDMA Read or Write): 0 for the pure-Go
// provider's zero-based regions, the virtual address for hardware that
// registers by address.
func (mr *MemoryRegion) RemoteAddr() uint64 {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	if ra, ok := mr.pd.hook.(spi.RemoteAddresser[*MemoryRegion]); ok && mr.valid {
		return ra.RemoteAddr(mr)
	}
	return 0
}

// IsFast reports whether the region was made by AllocFastReg. It does not
// lock (the property never changes).
func (mr *MemoryRegion) IsFast() bool { return mr.fast }

// Offset returns where a fast-registration region's memory starts in the
// region it is bound to.
func (mr *MemoryRegion) Offset() uint64 {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	return mr.offset
}

// Deregister invalidates the region, waits for provider accesses in
// progress, and releases its STag for good.
func (mr *MemoryRegion) Deregister() error {
	mr.pd.mu.Lock()
	if mr.dead {
		mr.pd.mu.Unlock()
		return nil
	}
	if mr.binding {
		mr.pd.mu.Unlock()
		return fmt.Errorf("verbs: deregister STag %#08x: being bound: %w", mr.stag, ErrInvalidWR)
	}
	err := mr.invalidateLocked()
	mr.pd.mu.Unlock()
	if err != nil {
		return err
	}
	if err := mr.quiesce(context.Background()); err != nil {
		return err
	}
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	if mr.dead {
		return nil
	}
	if mr.binding {
		return fmt.Errorf("verbs: deregister STag %#08x: being bound: %w", mr.stag, ErrInvalidWR)
	}
	if err := mr.invalidateLocked(); err != nil { // bound again meanwhile
		return err
	}
	if err := mr.pd.hook.Deregister(mr); err != nil {
		return fmt.Errorf("verbs: deregister STag %#08x: %w", mr.stag, err)
	}
	mr.dead = true
	mr.buf, mr.parent = nil, nil
	mr.pd.unindexLocked(mr)
	mr.publishLocked()
	return nil
}
