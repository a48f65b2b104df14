//go:build cgo && linux && !noibverbs

package ibverbs

/*
#include "helpers.h"

static struct ibv_mr *reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int access) {
	return ibv_reg_mr(pd, (void *)addr, len, access);
}
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/internal/spi"
)

// NewProtectionDomain returns a protection domain whose registrations are
// made on the device.
func (p *Provider) NewProtectionDomain() *verbs.ProtectionDomain {
	return link.NewDomain(newHook(p, cDevice{pd: p.pd}))
}

func newHook(p *Provider, dev device) *hook {
	return &hook{p: p, dev: dev, regs: make(map[*verbs.MemoryRegion]*hwMR),
		windows: p != nil && p.windows, wins: make(map[*verbs.MemoryRegion]*window)}
}

// hwMR is a device registration backing a verbs.MemoryRegion.
type hwMR struct {
	owner      *hook // the domain's hook that made it (reg)
	mr         *C.struct_ibv_mr
	addr       uintptr
	size       uint64
	lkey, rkey uint32
}

// device is what the hook asks of the RDMA device: the registration
// system calls (tests stand in a device whose calls fail on demand).
type device interface {
	regMR(addr uintptr, n int, access verbs.Access, bind bool) (*hwMR, error)
	deregMR(r *hwMR) error
}

// cDevice registers with libibverbs on a protection domain.
type cDevice struct{ pd *C.struct_ibv_pd }

func (d cDevice) regMR(addr uintptr, n int, access verbs.Access, bind bool) (*hwMR, error) {
	f := ibvAccess(access)
	if bind {
		// Memory windows are bound in it (C10-74: a window granting
		// remote write needs local write in the region).
		f |= C.IBV_ACCESS_MW_BIND | C.IBV_ACCESS_LOCAL_WRITE
	}
	m := C.reg_mr(d.pd, C.uintptr_t(addr), C.size_t(n), f)
	if m == nil {
		errno := syscall.Errno(C.errno_of())
		if errno == syscall.ENOMEM {
			return nil, fmt.Errorf("ibverbs: ibv_reg_mr %d bytes: %w (locked-memory limit: raise ulimit -l or lower rdmamem)", n, errno)
		}
		return nil, fmt.Errorf("ibverbs: ibv_reg_mr %d bytes: %w", n, errno)
	}
	return &hwMR{mr: m, addr: addr, size: uint64(n), lkey: uint32(m.lkey), rkey: uint32(m.rkey)}, nil
}

func (d cDevice) deregMR(r *hwMR) error {
	if rc := C.ibv_dereg_mr(r.mr); rc != 0 {
		return fmt.Errorf("ibverbs: ibv_dereg_mr: %w", syscall.Errno(rc))
	}
	return nil
}

// hook mirrors a ProtectionDomain's registrations on the device. Its
// methods run with the domain's lock held. Each region's device record
// (*hwMR, or *window for a fast region backed by a memory window) hangs
// on the region itself (spi.Link.SetData), where the data
// path (SGEs, binds) reads it without a lock; regs and wins, under mu,
// only let the recovery paths enumerate them.
type hook struct {
	p    *Provider
	dev  device
	mu   sync.Mutex
	regs map[*verbs.MemoryRegion]*hwMR
	// epoch counts recoveries (recoverKeys): a work request records it
	// when posted, so that its failure triggers a recovery only if no
	// recovery ran since. recMu serialises recoveries (failure path
	// only).
	epoch atomic.Uint64
	recMu sync.Mutex
	// windows: fast-registration regions are type-2 memory windows
	// (window.go), fixed when the domain is made; wins holds them
	// (guarded by mu), binds counts the binds posted.
	windows bool
	wins    map[*verbs.MemoryRegion]*window
	binds   atomic.Uint64
}

// link is package verbs's provider side (see verbs/internal/spi).
var link = spi.Get[*verbs.MemoryRegion, *verbs.ProtectionDomain, verbs.Access]()

var (
	_ spi.Hook[*verbs.MemoryRegion]            = (*hook)(nil)
	_ spi.RemoteAddresser[*verbs.MemoryRegion] = (*hook)(nil)
	_ spi.Quiescer[*verbs.MemoryRegion]        = (*hook)(nil)
)

func ibvAccess(a verbs.Access) C.int {
	var f C.int
	if a&verbs.AccessLocalWrite != 0 {
		f |= C.IBV_ACCESS_LOCAL_WRITE
	}
	if a&verbs.AccessRemoteRead != 0 {
		f |= C.IBV_ACCESS_REMOTE_READ
	}
	if a&verbs.AccessRemoteWrite != 0 {
		// Remote write requires local write (IB spec).
		f |= C.IBV_ACCESS_REMOTE_WRITE | C.IBV_ACCESS_LOCAL_WRITE
	}
	return f
}

// reg registers mr's current memory and returns its STag (rkey if the
// region grants remote access, else lkey).
func (h *hook) reg(mr *verbs.MemoryRegion) (uint32, error) {
	buf, access := link.Bytes(mr), link.Access(mr)
	if len(buf) == 0 {
		return 0, fmt.Errorf("%w: empty region", verbs.ErrInvalidWR)
	}
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	if !mr.IsFast() {
		if err := checkSlab(addr, len(buf)); err != nil {
			return 0, err
		}
	}
	// A fast region is bound inside a registered slab chunk (checked by
	// verbs.FastRegister), so it too names only slab memory.
	r, err := h.dev.regMR(addr, len(buf), access, h.windows && !mr.IsFast())
	if err != nil {
		return 0, err
	}
	r.owner = h
	h.mu.Lock()
	h.regs[mr] = r
	h.mu.Unlock()
	link.SetData(mr, r)
	if access.Remote() {
		return r.rkey, nil
	}
	return r.lkey, nil
}

// dereg drops mr's device registration, if any. The record stays until
// ibv_dereg_mr succeeds: a failed deregistration leaves the key live on
// the device, so a retry must try again rather than find nothing and
// report success (the domain then keeps the region valid, and the
// transport quarantines its memory and closes the connection, RFC 8166
// s4.5.4).
func (h *hook) dereg(mr *verbs.MemoryRegion) error {
	r := h.registration(mr)
	if r == nil {
		return nil
	}
	if err := h.dev.deregMR(r); err != nil {
		return err
	}
	link.SetData(mr, nil)
	h.mu.Lock()
	if h.regs[mr] == r {
		delete(h.regs, mr)
	}
	h.mu.Unlock()
	return nil
}

// registration returns mr's device registration, nil if it has none or
// mr is not a region of this domain.
func (h *hook) registration(mr *verbs.MemoryRegion) *hwMR {
	if r, _ := link.Data(mr).(*hwMR); r != nil && r.owner == h {
		return r
	}
	return nil
}

// recoverKeys registers the domain's own memory (the slab chunks) again
// under new keys after a peer may have killed one: siw carries out a
// received Send With Invalidate on any STag of the protection domain
// whose index matches, registered for remote access or not, before
// software can check that the STag was offered for the call (RFC 8166
// s3.4.4 lets the responder invalidate only what the call offered; siw
// checks neither that nor the key byte). A dead chunk key would fail every
// later work request that names the chunk, on every connection sharing
// the domain; the new registration ends that, and connections whose work
// requests already named the old key break and reconnect.
//
// With stag set (the device reported the invalidation) only the region
// holding that key index is registered again; with 0 (a work request
// failed with a local protection error, as when siw's userspace library
// does not report the invalidation) every one is. epoch is the hook's
// epoch when the failing request was posted: if a recovery ran since,
// the request failed on a key already replaced and nothing is done, so
// failures of requests posted before a recovery do not set off another.
// Exposures (fast-registration regions) are not touched: each belongs to
// one call, whose peer then finds its key dead.
func (h *hook) recoverKeys(epoch uint64, stag uint32) {
	h.recMu.Lock()
	defer h.recMu.Unlock()
	if h.epoch.Load() != epoch {
		return
	}
	h.mu.Lock()
	var chunks []*verbs.MemoryRegion
	for mr, r := range h.regs {
		if !mr.IsFast() && (stag == 0 || r.lkey>>8 == stag>>8 || r.rkey>>8 == stag>>8) {
			chunks = append(chunks, mr)
		}
	}
	h.mu.Unlock()
	for _, mr := range chunks {
		// A failure leaves the region invalid in the domain: work
		// requests naming it are refused when posted.
		_, _ = mr.Reregister(mr.Access())
	}
	h.epoch.Add(1)
}

// Register registers a region of memory; a fast-registration region gets
// its key when it is bound (Reregister).
func (h *hook) Register(mr *verbs.MemoryRegion) (uint32, error) {
	if mr.IsFast() {
		return 0, nil
	}
	return h.reg(mr)
}

// Reregister binds the region (again) under a new key: a window's bind
// is prepared, to be posted before the Send that offers it.
func (h *hook) Reregister(mr *verbs.MemoryRegion) (uint32, error) {
	if h.windows && mr.IsFast() {
		return h.prepareWindow(mr)
	}
	if err := h.dereg(mr); err != nil {
		return 0, err
	}
	return h.reg(mr)
}

// Invalidate ends the region's key: deregistering is the invalidation,
// or, for a window, a local invalidation posted on its queue pair.
func (h *hook) Invalidate(mr *verbs.MemoryRegion) error {
	if w := h.window(mr); w != nil {
		w.invalidate()
		return nil
	}
	return h.dereg(mr)
}

// Deregister releases the region.
func (h *hook) Deregister(mr *verbs.MemoryRegion) error {
	if h.windows && mr.IsFast() {
		h.dropWindow(mr)
		return nil
	}
	return h.dereg(mr)
}

// RemoteAddr is the virtual address the device names the region's first
// byte by.
func (h *hook) RemoteAddr(mr *verbs.MemoryRegion) uint64 {
	if w := h.window(mr); w != nil {
		w.mu.Lock()
		defer w.mu.Unlock()
		return uint64(w.addr)
	}
	if r := h.registration(mr); r != nil {
		return uint64(r.addr)
	}
	return 0
}

// sges converts a scatter/gather list to device SGEs, checking that each
// element is live registered memory of this domain with the rights need
// (AccessLocalWrite where the device places data): what the device would
// fail with a local protection error is refused at post time, with
// verbs.ErrInvalidWR, as the pure-Go provider does.
func (h *hook) sges(sgl []verbs.SGE, out []C.struct_ibv_sge, need verbs.Access) error {
	for i, s := range sgl {
		addr, lkey, err := h.sge(s, need)
		if err != nil {
			return fmt.Errorf("SGE %d: %w", i, err)
		}
		out[i] = C.struct_ibv_sge{addr: C.uint64_t(addr), length: C.uint32_t(s.Length), lkey: C.uint32_t(lkey)}
	}
	return nil
}

// sge checks one SGE (see sges) and returns the device address and lkey
// of its first byte. No lock: MR.Local and the registration read state
// the region carries.
func (h *hook) sge(s verbs.SGE, need verbs.Access) (addr uint64, lkey uint32, err error) {
	if _, err := link.Local(s.MR, need, s.Offset, s.Length); err != nil {
		return 0, 0, fmt.Errorf("%w: %w", verbs.ErrInvalidWR, err)
	}
	r := h.registration(s.MR)
	if r == nil || s.MR.IsFast() {
		return 0, 0, fmt.Errorf("%w: not registered memory of this domain: %w", verbs.ErrInvalidWR, verbs.ErrInvalidSTag)
	}
	if err := sgeRange(s.Offset, s.Length, r.size); err != nil {
		return 0, 0, fmt.Errorf("%w: %w", verbs.ErrInvalidWR, err)
	}
	return uint64(r.addr) + s.Offset, r.lkey, nil
}
