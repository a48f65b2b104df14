package verbs

import (
	"context"
	"fmt"
	"sync"
)

// maxIndex bounds the 24-bit STag index (the high bits of an STag).
const maxIndex = 1 << 24

// RegistrationHook lets a provider that registers memory with hardware
// (verbs/ibverbs) mirror the registrations of a ProtectionDomain. Each
// method returns the STag the hardware assigned. The pure-Go provider needs
// no hook.
//
// The methods run with the domain's lock held: they read the region
// through HookBytes, HookAccess and IsFast, never through the locking
// accessors. Register of a fast-registration region may return STag 0
// ("no key yet"): such a region gets its key from Reregister
// (FastRegister). Hardware assigns STag indexes itself and may reuse the
// index of an invalidated region; the domain then forgets the stale
// region's index.
type RegistrationHook interface {
	Register(mr *MemoryRegion) (stag uint32, err error)
	Reregister(mr *MemoryRegion) (stag uint32, err error)
	Invalidate(mr *MemoryRegion) error
	Deregister(mr *MemoryRegion) error
}

// RemoteAddresser is implemented by a RegistrationHook whose hardware
// names the first byte of a region by an address other than 0 (ibv_reg_mr
// regions are addressed by virtual address). It runs with the domain's
// lock held.
type RemoteAddresser interface {
	RemoteAddr(mr *MemoryRegion) uint64
}

// ProtectionDomain owns memory regions and the queue pairs that may use
// them. It is safe for concurrent use.
type ProtectionDomain struct {
	hook RegistrationHook

	mu        sync.Mutex
	idle      sync.Cond                // signalled when a region's provider accesses end
	regions   map[uint32]*MemoryRegion // by STag index (stag >> 8)
	nextIndex uint32
	liveRem   int // valid regions with remote access
}

// NewProtectionDomain returns an empty protection domain.
func NewProtectionDomain() *ProtectionDomain {
	pd := &ProtectionDomain{regions: make(map[uint32]*MemoryRegion), nextIndex: 1}
	pd.idle.L = &pd.mu
	return pd
}

// NewProtectionDomainWithHook returns a protection domain whose
// registrations are mirrored by hook.
func NewProtectionDomainWithHook(hook RegistrationHook) *ProtectionDomain {
	pd := NewProtectionDomain()
	pd.hook = hook
	return pd
}

// HookOf returns the registration hook of pd (nil for a software domain),
// so that a provider can tell its own domains.
func HookOf(pd *ProtectionDomain) RegistrationHook { return pd.hook }

// MemoryRegion is registered memory. Its STag (the iWARP name; lkey and
// rkey in InfiniBand terms) is index<<8 | key; the 8-bit key changes on
// every Reregister and FastRegister so a stale STag never matches again.
// When a region has used all 256 keys of its index, the software domain
// moves it to a fresh index (indexes are handed out round robin), so an
// STag comes back only after some 2^32 bindings (RFC 8166 s8.1.2:
// unpredictable, not reused handles).
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
	access  Access
	stag    uint32
	valid   bool
	dead    bool
	fast    bool          // allocated by AllocFastReg
	parent  *MemoryRegion // a fast-registration region's current target
	offset  uint64        // where buf starts in parent
	busy    int           // provider accesses in progress (Begin .. End)
	waiters int           // Invalidate calls waiting for busy to drop
	// aborters are the accesses in progress that an invalidation can
	// stop (BeginAccess with an Aborter).
	aborters []Aborter
	// placed is how many bytes from the start the peer has written
	// without a gap since the region was bound (EndAccess).
	placed uint64
}

// Aborter is implemented by a provider whose access to a region can wait
// for the peer: a placement whose payload the peer stalls, a Read
// Response the peer does not take. An invalidation of the region calls
// AbortAccess of each such access in progress, with the domain's lock
// held; the provider then stops the transfer at once (and breaks the
// connection, RFC 8166 s8.1.4) and ends the access, instead of letting the
// invalidation wait for the peer. AbortAccess must not block and must not
// call into the domain.
type Aborter interface {
	AbortAccess()
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
	if pd.hook != nil {
		stag, err := pd.hook.Register(mr)
		if err != nil {
			return err
		}
		mr.stag = stag
		if stag == 0 {
			return nil // no key yet: indexed when Reregister gives one
		}
		return pd.indexLocked(mr)
	} else {
		idx, err := pd.allocIndex()
		if err != nil {
			return err
		}
		mr.stag = idx << 8
	}
	pd.regions[mr.stag>>8] = mr
	return nil
}

// indexLocked records mr under its hardware-assigned STag index. An
// invalid region holding the index is forgotten (its key is dead and the
// hardware reused the index); a valid one is an error.
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

// allocIndex finds a free STag index; called with pd.mu held.
func (pd *ProtectionDomain) allocIndex() (uint32, error) {
	for range maxIndex {
		idx := pd.nextIndex
		pd.nextIndex++
		if pd.nextIndex >= maxIndex {
			pd.nextIndex = 1
		}
		if pd.regions[idx] == nil {
			return idx, nil
		}
	}
	return 0, fmt.Errorf("all %d STag indexes in use", maxIndex-1)
}

// LiveRemoteRegions returns how many valid regions grant remote access: an
// upper layer checks it is zero between calls (RFC 8166 s8.1: invalidate
// every region before handing a reply up).
func (pd *ProtectionDomain) LiveRemoteRegions() int {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	return pd.liveRem
}

// Resolve checks an access to [off, off+n) of the region named by stag
// with the rights need, and returns that part of the region's memory.
// Errors wrap ErrInvalidSTag, ErrAccess or ErrBounds. A provider that
// then reads or writes the memory uses Begin instead, so that an
// invalidation waits for it.
func (pd *ProtectionDomain) Resolve(stag uint32, need Access, off, n uint64) ([]byte, error) {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	mr, err := pd.lookupLocked(stag, need, off, n)
	if err != nil {
		return nil, err
	}
	return mr.buf[off : off+n : off+n], nil
}

// Begin is for providers: it checks an access like Resolve and marks the
// region busy until End. Invalidating or deregistering the region waits
// for End, so once Invalidate has returned no byte of the region can be
// read or written for the peer any more, even by a placement that had
// already started (RFC 8166 s8.1).
func (pd *ProtectionDomain) Begin(stag uint32, need Access, off, n uint64) ([]byte, *MemoryRegion, error) {
	return pd.BeginAccess(stag, need, off, n, nil)
}

// BeginAccess is Begin for an access that an invalidation may stop: until
// EndAccess, invalidating the region calls a.AbortAccess (see Aborter).
// A nil a makes it Begin.
func (pd *ProtectionDomain) BeginAccess(stag uint32, need Access, off, n uint64, a Aborter) ([]byte, *MemoryRegion, error) {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	mr, err := pd.lookupLocked(stag, need, off, n)
	if err != nil {
		return nil, nil, err
	}
	mr.busy++
	if a != nil {
		mr.aborters = append(mr.aborters, a)
	}
	return mr.buf[off : off+n : off+n], mr, nil
}

// Place is for providers: it checks an access like Begin and calls place
// with the region's bytes while holding the domain's lock, for a
// placement that cannot wait (a copy of bytes already received): an
// invalidation cannot overlap it, and it costs one lock where Begin and
// End take two. place must be short, must not block and must not call
// into the domain; it returns how many bytes it placed at off (see
// EndAccess and Placed), 0 if it failed. Place returns the lookup's
// error, or place's.
func (pd *ProtectionDomain) Place(stag uint32, need Access, off, n uint64, place func([]byte) (uint64, error)) error {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	mr, err := pd.lookupLocked(stag, need, off, n)
	if err != nil {
		return err
	}
	placed, err := place(mr.buf[off : off+n : off+n])
	mr.notePlacedLocked(off, placed)
	return err
}

// End ends an access that Begin started.
func (mr *MemoryRegion) End() { mr.EndAccess(nil, 0, 0) }

// EndAccess ends an access that BeginAccess started with a. A provider
// that wrote data of the peer into the region reports it as placed bytes
// at off (0 for a read, or a write that did not complete), so that the
// upper layer learns how much the peer really wrote (Placed).
func (mr *MemoryRegion) EndAccess(a Aborter, off, placed uint64) {
	mr.pd.mu.Lock()
	if a != nil {
		for i, x := range mr.aborters {
			if x == a {
				last := len(mr.aborters) - 1
				mr.aborters[i] = mr.aborters[last]
				mr.aborters[last] = nil
				mr.aborters = mr.aborters[:last]
				break
			}
		}
	}
	mr.notePlacedLocked(off, placed)
	mr.busy--
	if mr.busy == 0 && mr.waiters > 0 {
		mr.pd.idle.Broadcast()
	}
	mr.pd.mu.Unlock()
}

// notePlacedLocked extends the region's gapless placed prefix by the
// placed bytes at off; called with pd.mu held.
func (mr *MemoryRegion) notePlacedLocked(off, placed uint64) {
	if placed > 0 && off <= mr.placed && off+placed > mr.placed {
		mr.placed = off + placed
	}
}

// Placed returns how many bytes from the region's start the peer has
// written, without a gap, since the region was registered or bound last
// (RDMA Writes and Read Responses placed by a provider that reports them
// with EndAccess). It stays readable after invalidation, until the region
// is bound again: an upper layer checks a responder's claimed Write chunk
// length against it (RFC 8166 s3.4.6: only bytes the responder wrote are
// data). Writes that leave a gap are not counted beyond it. ok is false
// when the domain cannot know: hardware (a domain with a
// RegistrationHook) places data without the domain seeing it.
func (mr *MemoryRegion) Placed() (n uint64, ok bool) {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	return mr.placed, mr.pd.hook == nil
}

// CountsPlacement reports whether the domain learns how many bytes the
// peer placed in its regions (MemoryRegion.Placed): true for the software
// provider, false for hardware, whose device places data without the
// domain seeing it. An upper layer that cannot count placed bytes clears a
// buffer before it exposes it for remote write, so that bytes the peer
// claims but did not write are zeros, never earlier contents.
func (pd *ProtectionDomain) CountsPlacement() bool { return pd.hook == nil }

func (pd *ProtectionDomain) lookupLocked(stag uint32, need Access, off, n uint64) (*MemoryRegion, error) {
	mr := pd.regions[stag>>8]
	if mr == nil || mr.stag != stag || !mr.valid {
		return nil, fmt.Errorf("STag %#08x: %w", stag, ErrInvalidSTag)
	}
	if mr.access&need != need {
		return nil, fmt.Errorf("STag %#08x has %v, needs %v: %w", stag, mr.access, need, ErrAccess)
	}
	size := uint64(len(mr.buf))
	if off > size || n > size-off {
		return nil, fmt.Errorf("STag %#08x: [%d, +%d) outside %d bytes: %w", stag, off, n, size, ErrBounds)
	}
	return mr, nil
}

// InvalidateRemote is for providers: it performs the invalidation a
// received Send With Invalidate asks for (RFC 5040 s5.3). Only a valid
// region of this domain with remote access rights can be invalidated.
// It does not wait for accesses in progress; the upper layer's own
// Invalidate does.
func (pd *ProtectionDomain) InvalidateRemote(stag uint32) error {
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
	if mr.pd.hook != nil {
		if err := mr.pd.hook.Invalidate(mr); err != nil {
			return fmt.Errorf("verbs: invalidate STag %#08x: %w", mr.stag, err)
		}
	}
	mr.valid = false
	if mr.access.Remote() {
		mr.pd.liveRem--
	}
	// RFC 8166 s8.1.3: once invalid, no byte may be read or written for
	// the peer any more; accesses waiting for the peer stop now rather
	// than when the peer goes on.
	for _, a := range mr.aborters {
		a.AbortAccess()
	}
	return nil
}

// waitIdleLocked waits until no provider access to mr is in progress, or
// ctx ends; called with pd.mu held.
func (mr *MemoryRegion) waitIdleLocked(ctx context.Context) error {
	if mr.busy == 0 {
		return nil
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			mr.pd.mu.Lock()
			mr.pd.idle.Broadcast()
			mr.pd.mu.Unlock()
		})
		defer stop()
	}
	mr.waiters++
	defer func() { mr.waiters-- }()
	for mr.busy > 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("verbs: STag %#08x still in use by the provider: %w", mr.stag, err)
		}
		mr.pd.idle.Wait()
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

// Local is for providers: it resolves a local scatter/gather element of
// this region, checking that the region is alive and has need, and that
// [off, off+n) lies inside it. Errors wrap ErrInvalidSTag, ErrAccess or
// ErrBounds.
func (mr *MemoryRegion) Local(need Access, off uint64, n uint32) ([]byte, error) {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	if mr.dead || mr.fast {
		return nil, fmt.Errorf("local key %#08x: %w", mr.stag, ErrInvalidSTag)
	}
	if mr.access&need != need {
		return nil, fmt.Errorf("local key %#08x has %v, needs %v: %w", mr.stag, mr.access, need, ErrAccess)
	}
	size := uint64(len(mr.buf))
	if off > size || uint64(n) > size-off {
		return nil, fmt.Errorf("local key %#08x: [%d, +%d) outside %d bytes: %w", mr.stag, off, n, size, ErrBounds)
	}
	return mr.buf[off : off+uint64(n) : off+uint64(n)], nil
}

// Invalidate invalidates the region locally: its STag stops working for
// both sides until it is registered again, and Invalidate waits until
// provider accesses already in progress have ended. An access that waits
// for the peer is stopped at once if the provider registered an Aborter
// (the iWARP provider does); otherwise it stalls while the peer stalls a
// transfer, and closing the queue pair ends it (see InvalidateContext).
// Invalidating an invalid region only waits.
func (mr *MemoryRegion) Invalidate() error {
	return mr.InvalidateContext(context.Background())
}

// InvalidateContext is Invalidate with a bound on the wait. When ctx ends
// first the region is already invalid (no new access can start) but an
// access is still in progress: the caller must not reuse the memory
// before a later Invalidate returns nil (after closing the queue pair).
func (mr *MemoryRegion) InvalidateContext(ctx context.Context) error {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	if mr.dead {
		return fmt.Errorf("verbs: invalidate: %w", ErrClosed)
	}
	if err := mr.invalidateLocked(); err != nil {
		return err
	}
	return mr.waitIdleLocked(ctx)
}

// Reregister makes the region valid again with new access rights and a new
// STag key, and returns the new STag.
func (mr *MemoryRegion) Reregister(access Access) (uint32, error) {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	if mr.dead || mr.fast {
		return 0, fmt.Errorf("verbs: reregister: %w", ErrClosed)
	}
	if err := mr.invalidateLocked(); err != nil {
		return 0, err
	}
	if err := mr.waitIdleLocked(context.Background()); err != nil {
		return 0, err
	}
	return mr.rekeyLocked(access)
}

// rekeyLocked gives mr a new STag key and makes it valid with access.
func (mr *MemoryRegion) rekeyLocked(access Access) (uint32, error) {
	old := mr.stag
	mr.access = access
	if mr.pd.hook != nil {
		stag, err := mr.pd.hook.Reregister(mr)
		if err != nil {
			return 0, fmt.Errorf("verbs: reregister STag %#08x: %w", old, err)
		}
		mr.pd.unindexLocked(mr)
		mr.stag = stag
		if err := mr.pd.indexLocked(mr); err != nil {
			return 0, fmt.Errorf("verbs: reregister STag %#08x: %w", old, err)
		}
	} else if key := (old + 1) & 0xff; key != 0 {
		mr.stag = old&^0xff | key
	} else if idx, err := mr.pd.allocIndex(); err == nil {
		// Every key of this index was used: a fresh index keeps a
		// stale STag from matching again (RFC 8166 s8.1.2).
		mr.pd.unindexLocked(mr)
		mr.stag = idx << 8
		mr.pd.regions[idx] = mr
	} else {
		mr.stag = old &^ 0xff // no free index: the key wraps
	}
	mr.placed = 0
	mr.valid = true
	if access.Remote() {
		mr.pd.liveRem++
	}
	return mr.stag, nil
}

// FastRegister binds the fast-registration region mr to exactly the n
// bytes at off in the registered region target, with access, under a new
// STag key, and returns that STag (a fast-register work request,
// IB_WR_REG_MR). mr must be invalid: bound regions are invalidated
// before they are bound again, as FRWR requires.
func (mr *MemoryRegion) FastRegister(target *MemoryRegion, off uint64, n int, access Access) (uint32, error) {
	if target == nil || target.pd != mr.pd {
		return 0, fmt.Errorf("verbs: fast register: target of another protection domain: %w", ErrInvalidWR)
	}
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	switch {
	case !mr.fast || mr.dead:
		return 0, fmt.Errorf("verbs: fast register STag %#08x: not a fast-registration region: %w", mr.stag, ErrInvalidWR)
	case mr.valid || mr.busy > 0:
		return 0, fmt.Errorf("verbs: fast register STag %#08x: still bound: %w", mr.stag, ErrInvalidWR)
	case target.dead || target.fast:
		return 0, fmt.Errorf("verbs: fast register: target is not registered memory: %w", ErrInvalidSTag)
	case n <= 0 || off > uint64(len(target.buf)) || uint64(n) > uint64(len(target.buf))-off:
		return 0, fmt.Errorf("verbs: fast register [%d, +%d) of a %d-byte region: %w", off, n, len(target.buf), ErrBounds)
	}
	mr.parent, mr.offset = target, off
	mr.buf = target.buf[off : off+uint64(n) : off+uint64(n)]
	return mr.rekeyLocked(access)
}

// RemoteAddr returns the address a peer names the region's first byte by
// (with RemoteOffset in an RDMA Read or Write): 0 for the pure-Go
// provider's zero-based regions, the virtual address for hardware that
// registers by address (see RemoteAddresser).
func (mr *MemoryRegion) RemoteAddr() uint64 {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	if ra, ok := mr.pd.hook.(RemoteAddresser); ok && mr.valid {
		return ra.RemoteAddr(mr)
	}
	return 0
}

// HookBytes is for RegistrationHook implementations (called with the
// domain's lock held): the memory the region names now.
func (mr *MemoryRegion) HookBytes() []byte { return mr.buf }

// HookAccess is for RegistrationHook implementations (called with the
// domain's lock held): the region's access rights.
func (mr *MemoryRegion) HookAccess() Access { return mr.access }

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
	defer mr.pd.mu.Unlock()
	if mr.dead {
		return nil
	}
	if err := mr.invalidateLocked(); err != nil {
		return err
	}
	if err := mr.waitIdleLocked(context.Background()); err != nil {
		return err
	}
	if mr.pd.hook != nil {
		if err := mr.pd.hook.Deregister(mr); err != nil {
			return fmt.Errorf("verbs: deregister STag %#08x: %w", mr.stag, err)
		}
	}
	mr.dead = true
	mr.buf, mr.parent = nil, nil
	mr.pd.unindexLocked(mr)
	return nil
}
