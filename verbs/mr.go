package verbs

import (
	"fmt"
	"sync"
)

// maxIndex bounds the 24-bit STag index (the high bits of an STag).
const maxIndex = 1 << 24

// RegistrationHook lets a provider that registers memory with hardware
// (verbs/ibverbs) mirror the registrations of a ProtectionDomain. Each
// method returns the STag the hardware assigned. The pure-Go provider needs
// no hook.
type RegistrationHook interface {
	Register(mr *MemoryRegion) (stag uint32, err error)
	Reregister(mr *MemoryRegion) (stag uint32, err error)
	Invalidate(mr *MemoryRegion) error
	Deregister(mr *MemoryRegion) error
}

// ProtectionDomain owns memory regions and the queue pairs that may use
// them. It is safe for concurrent use.
type ProtectionDomain struct {
	hook RegistrationHook

	mu        sync.Mutex
	regions   map[uint32]*MemoryRegion // by STag index (stag >> 8)
	nextIndex uint32
	liveRem   int // valid regions with remote access
}

// NewProtectionDomain returns an empty protection domain.
func NewProtectionDomain() *ProtectionDomain {
	return &ProtectionDomain{regions: make(map[uint32]*MemoryRegion), nextIndex: 1}
}

// NewProtectionDomainWithHook returns a protection domain whose
// registrations are mirrored by hook.
func NewProtectionDomainWithHook(hook RegistrationHook) *ProtectionDomain {
	pd := NewProtectionDomain()
	pd.hook = hook
	return pd
}

// MemoryRegion is a registered buffer. Its STag (the iWARP name; lkey and
// rkey in InfiniBand terms) is index<<8 | key; the 8-bit key changes on
// every Reregister so a stale STag never matches again.
type MemoryRegion struct {
	pd  *ProtectionDomain
	buf []byte

	// Guarded by pd.mu.
	access Access
	stag   uint32
	valid  bool
	dead   bool
}

// RegisterMemory registers buf with the given access rights. The region is
// valid until Invalidate, remote invalidation or Deregister.
func (pd *ProtectionDomain) RegisterMemory(buf []byte, access Access) (*MemoryRegion, error) {
	mr := &MemoryRegion{pd: pd, buf: buf, access: access}
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.hook != nil {
		stag, err := pd.hook.Register(mr)
		if err != nil {
			return nil, fmt.Errorf("verbs: register %d bytes: %w", len(buf), err)
		}
		if pd.regions[stag>>8] != nil {
			return nil, fmt.Errorf("verbs: register: provider reused STag index %#x", stag>>8)
		}
		mr.stag = stag
	} else {
		idx, err := pd.allocIndex()
		if err != nil {
			return nil, err
		}
		mr.stag = idx << 8
	}
	mr.valid = true
	pd.regions[mr.stag>>8] = mr
	if access.Remote() {
		pd.liveRem++
	}
	return mr, nil
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
	return 0, fmt.Errorf("verbs: register: all %d STag indexes in use", maxIndex-1)
}

// LiveRemoteRegions returns how many valid regions grant remote access: an
// upper layer checks it is zero between calls (RFC 8166 s8.1: invalidate
// every region before handing a reply up).
func (pd *ProtectionDomain) LiveRemoteRegions() int {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	return pd.liveRem
}

// Resolve is for providers: it checks an access to [off, off+n) of the
// region named by stag with the rights need, and returns that part of the
// region's buffer. Errors wrap ErrInvalidSTag, ErrAccess or ErrBounds.
func (pd *ProtectionDomain) Resolve(stag uint32, need Access, off, n uint64) ([]byte, error) {
	pd.mu.Lock()
	defer pd.mu.Unlock()
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
	return mr.buf[off : off+n : off+n], nil
}

// InvalidateRemote is for providers: it performs the invalidation a
// received Send With Invalidate asks for (RFC 5040 s5.3). Only a valid
// region of this domain with remote access rights can be invalidated.
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
	return nil
}

// PD returns the region's protection domain.
func (mr *MemoryRegion) PD() *ProtectionDomain { return mr.pd }

// Bytes returns the registered buffer.
func (mr *MemoryRegion) Bytes() []byte { return mr.buf }

// Len returns the size of the registered buffer.
func (mr *MemoryRegion) Len() int { return len(mr.buf) }

// STag returns the region's current STag (rkey and lkey).
func (mr *MemoryRegion) STag() uint32 {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	return mr.stag
}

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

// Invalidate invalidates the region locally: its STag stops working for
// both sides until Reregister. Invalidating an invalid region is a no-op.
func (mr *MemoryRegion) Invalidate() error {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	if mr.dead {
		return fmt.Errorf("verbs: invalidate: %w", ErrClosed)
	}
	return mr.invalidateLocked()
}

// Reregister makes the region valid again with new access rights and a new
// STag key (like a fast-register work request), and returns the new STag.
func (mr *MemoryRegion) Reregister(access Access) (uint32, error) {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	if mr.dead {
		return 0, fmt.Errorf("verbs: reregister: %w", ErrClosed)
	}
	if err := mr.invalidateLocked(); err != nil {
		return 0, err
	}
	old := mr.stag
	mr.access = access
	if mr.pd.hook != nil {
		stag, err := mr.pd.hook.Reregister(mr)
		if err != nil {
			return 0, fmt.Errorf("verbs: reregister STag %#08x: %w", old, err)
		}
		if stag>>8 != old>>8 {
			delete(mr.pd.regions, old>>8)
			mr.pd.regions[stag>>8] = mr
		}
		mr.stag = stag
	} else {
		mr.stag = old&^0xff | (old+1)&0xff
	}
	mr.valid = true
	if access.Remote() {
		mr.pd.liveRem++
	}
	return mr.stag, nil
}

// Deregister invalidates the region and releases its STag for good.
func (mr *MemoryRegion) Deregister() error {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	if mr.dead {
		return nil
	}
	if err := mr.invalidateLocked(); err != nil {
		return err
	}
	if mr.pd.hook != nil {
		if err := mr.pd.hook.Deregister(mr); err != nil {
			return fmt.Errorf("verbs: deregister STag %#08x: %w", mr.stag, err)
		}
	}
	mr.dead = true
	delete(mr.pd.regions, mr.stag>>8)
	return nil
}
