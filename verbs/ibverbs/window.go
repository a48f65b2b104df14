//go:build cgo && linux && !noibverbs

package ibverbs

/*
#include "helpers.h"

static struct ibv_mw *alloc_mw2(struct ibv_pd *pd) { return ibv_alloc_mw(pd, IBV_MW_TYPE_2); }
static uint32_t mw_rkey(struct ibv_mw *mw) { return mw->rkey; }
*/
import "C"

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"github.com/rdmafs/rdmafs/verbs"
)

// Memory windows. Where the device has type-2 memory windows (rxe, mlx5:
// IBV_DEVICE_MEM_WINDOW_TYPE_2A/2B), a fast-registration region is a
// window (ibv_alloc_mw, once per region) that FastRegister only prepares:
// it picks the next key (the low byte of the rkey, as ibv_inc_rkey) and
// the bytes, and the queue pair that carries the call binds it with an
// IBV_WR_BIND_MW work request posted before the call's Send (the
// consumer's verbs.OpFastRegister work request, regwr.go; in the old
// model chained with the Send, verbs.SendWR.Bind, so that one
// ibv_post_send exposed the call's bytes and sent it): no system call of its own, no page pinning, no lock shared by
// the domain's connections beyond the window's own. Invalidate posts an
// IBV_WR_LOCAL_INV on that queue pair and Quiesce waits for its
// completion (spi.Quiescer); an invalidation that cannot be posted or
// is flushed deallocates the window instead (ibv_dealloc_mw ends every
// binding), and a new one is allocated at the next bind. Slab chunks are
// registered with IBV_ACCESS_MW_BIND for that. Devices without memory
// windows (siw) keep per-call registration (ibv_reg_mr of the call's
// bytes).

// windowState is where a window is in its cycle.
type windowState uint8

const (
	winFree         windowState = iota // not bound: no peer access
	winPending                         // FastRegister prepared a bind not yet posted
	winBound                           // the bind was posted on qp
	winInvalidating                    // a local invalidation was posted on qp
)

// window is the type-2 memory window backing a fast-registration region.
// mu is the window's own: a call binds and invalidates its windows
// without a lock other connections take.
type window struct {
	owner  *hook // the domain's hook that made it (prepareWindow)
	mu     sync.Mutex
	mw     *C.struct_ibv_mw
	key    uint32 // the rkey the device knows the window by (last bind posted)
	next   uint32 // the rkey the pending bind gives
	state  windowState
	parent *C.struct_ibv_mr // the slab chunk's registration
	addr   uintptr
	n      int
	access C.int
	qp     *queuePair    // the queue pair the window was bound on
	inv    chan struct{} // closed when the local invalidation ended
}

// incKey is ibv_inc_rkey: the key byte advances, the index stays.
func incKey(k uint32) uint32 { return k&^0xff | (k+1)&0xff }

// window returns mr's window, or nil if mr is not one.
func (h *hook) window(mr *verbs.MemoryRegion) *window {
	if !h.windows || !mr.IsFast() {
		return nil
	}
	if w, _ := link.Data(mr).(*window); w != nil && w.owner == h { // no lock: see hook
		return w
	}
	return nil
}

// prepareWindow is FastRegister of a region backed by a window: it
// allocates the window on first use and readies the bind to mr's bytes
// under the next key, which it returns. Called with the domain's lock
// held; the region is invalid (its window free).
func (h *hook) prepareWindow(mr *verbs.MemoryRegion) (uint32, error) {
	buf, parent := link.Bytes(mr), link.Parent(mr)
	if len(buf) == 0 || parent == nil {
		return 0, fmt.Errorf("%w: empty window", verbs.ErrInvalidWR)
	}
	pr := h.registration(parent)
	w := h.window(mr)
	if w == nil {
		w = &window{owner: h}
		h.mu.Lock()
		h.wins[mr] = w
		h.mu.Unlock()
		link.SetData(mr, w)
	}
	if pr == nil {
		return 0, fmt.Errorf("ibverbs: bind window: %w: target not registered on the device", verbs.ErrInvalidSTag)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state == winBound || w.state == winInvalidating {
		return 0, fmt.Errorf("ibverbs: bind window %#08x: still bound: %w", w.key, verbs.ErrInvalidWR)
	}
	if w.mw == nil {
		m := C.alloc_mw2(h.p.pd)
		if m == nil {
			return 0, fmt.Errorf("ibverbs: ibv_alloc_mw: %w", syscall.Errno(C.errno_of()))
		}
		w.mw, w.key = m, uint32(C.mw_rkey(m))
	}
	w.next = incKey(w.key)
	w.parent, w.addr, w.n = pr.mr, uintptr(unsafe.Pointer(unsafe.SliceData(buf))), len(buf)
	w.access = 0
	if a := link.Access(mr); a&verbs.AccessRemoteRead != 0 {
		w.access |= C.IBV_ACCESS_REMOTE_READ
	}
	if a := link.Access(mr); a&verbs.AccessRemoteWrite != 0 {
		w.access |= C.IBV_ACCESS_REMOTE_WRITE
	}
	w.state = winPending
	return w.next, nil
}

// invalidate ends the window's binding: a pending bind is dropped, a
// posted one is invalidated by an IBV_WR_LOCAL_INV on its queue pair
// (Quiesce waits for it), or, if that cannot be posted, by deallocating
// the window. It does not wait.
func (w *window) invalidate() {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch w.state {
	case winPending:
		w.state = winFree
	case winBound:
		w.inv = make(chan struct{})
		w.state = winInvalidating
		if w.qp.postLocalInv(w) != nil {
			w.deallocLocked()
			close(w.inv)
			w.state = winFree
		}
	}
}

// invalidated ends a local invalidation: on success the window is free;
// if it was flushed or failed, the window's state is unknown and it is
// deallocated (a new one is allocated at the next bind).
func (w *window) invalidated(ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != winInvalidating {
		return
	}
	if !ok {
		w.deallocLocked()
	}
	w.state = winFree
	close(w.inv)
}

// remoteInvalidated records that the peer's Send With Invalidate ended
// the binding of key.
func (w *window) remoteInvalidated(key uint32) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != winBound || w.key != key {
		return false
	}
	w.state = winFree
	return true
}

// deallocLocked releases the window's device object; ibv_dealloc_mw ends
// any binding it has. A failure leaves the window to the device: it is
// forgotten, and so never bound again.
func (w *window) deallocLocked() {
	if w.mw != nil {
		C.ibv_dealloc_mw(w.mw)
		w.mw = nil
	}
}

// quiesce waits until the window's local invalidation has completed.
func (w *window) quiesce(ctx context.Context) error {
	w.mu.Lock()
	st, ch := w.state, w.inv
	w.mu.Unlock()
	if st != winInvalidating {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("ibverbs: local invalidation of window %#08x: %w", w.key, ctx.Err())
	}
}

// Quiesce implements spi.Quiescer: for a window, it waits for the local
// invalidation Invalidate posted.
func (h *hook) Quiesce(ctx context.Context, mr *verbs.MemoryRegion) error {
	if w := h.window(mr); w != nil {
		return w.quiesce(ctx)
	}
	return nil
}

// dropWindow deallocates mr's window for good (Deregister).
func (h *hook) dropWindow(mr *verbs.MemoryRegion) {
	w := h.window(mr)
	if w == nil {
		return
	}
	link.SetData(mr, nil)
	h.mu.Lock()
	delete(h.wins, mr)
	h.mu.Unlock()
	w.mu.Lock()
	w.deallocLocked()
	w.state = winFree
	w.mu.Unlock()
}

// bindArgs resolves the windows of wr.Bind for PostSend and locks them:
// each must be a window of this domain with a prepared bind. The caller
// unlocks them (unlockWindows) after posting.
func (q *queuePair) bindArgs(mrs []*verbs.MemoryRegion, out []C.struct_bind_arg) ([]*window, error) {
	if len(mrs) > len(out) {
		return nil, fmt.Errorf("%w: %d binds, at most %d", verbs.ErrInvalidWR, len(mrs), len(out))
	}
	ws := make([]*window, 0, len(mrs))
	for i, mr := range mrs {
		w := q.h.window(mr)
		if w == nil {
			if !q.h.windows && mr.IsFast() {
				continue // bound by FastRegister (per-call registration)
			}
			unlockWindows(ws)
			return nil, fmt.Errorf("%w: bind %d: not a memory window of this domain", verbs.ErrInvalidWR, i)
		}
		w.mu.Lock()
		ws = append(ws, w)
		if w.state != winPending || w.mw == nil {
			unlockWindows(ws)
			return nil, fmt.Errorf("%w: bind %d: window %#08x has no prepared bind (FastRegister)", verbs.ErrInvalidWR, i, w.key)
		}
		out[len(ws)-1] = C.struct_bind_arg{mw: w.mw, mr: w.parent, addr: C.uint64_t(w.addr), len: C.uint64_t(w.n),
			rkey: C.uint32_t(w.next), access: w.access}
	}
	return ws, nil
}

func unlockWindows(ws []*window) {
	for _, w := range ws {
		w.mu.Unlock()
	}
}

// boundLocked records that the windows' binds were posted on q (the
// windows' locks held).
func (q *queuePair) boundLocked(ws []*window) {
	for _, w := range ws {
		w.key, w.qp, w.state = w.next, q, winBound
		C.set_mw_rkey(w.mw, C.uint32_t(w.key))
	}
}

// postLocalInv posts the local invalidation of w's key (w's lock held).
func (q *queuePair) postLocalInv(w *window) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil || q.qp == nil {
		return fmt.Errorf("ibverbs: local invalidate: %w", verbs.ErrClosed)
	}
	q.nextID++
	id := q.nextID
	if rc := C.post_local_inv(q.qp, C.uint64_t(id), C.uint32_t(w.key)); rc != 0 {
		return fmt.Errorf("%w: ibv_post_send (local invalidate): %w", verbs.ErrInvalidWR, syscall.Errno(rc))
	}
	q.wrs[id] = wrInfo{win: w}
	return nil
}

// BindWindows implements verbs.WindowBinder: it posts the prepared binds
// of mrs on the queue pair and waits until they completed.
func (q *queuePair) BindWindows(ctx context.Context, mrs ...*verbs.MemoryRegion) error {
	done, err := q.postBinds(mrs)
	if err != nil || done == nil {
		return err
	}
	return waitBinds(ctx, done)
}

// postBinds posts the prepared binds of mrs on the queue pair, alone; the
// channel it returns (nil when there was nothing to bind) reports whether
// they completed.
func (q *queuePair) postBinds(mrs []*verbs.MemoryRegion) (<-chan bool, error) {
	var args [C.MAX_BINDS]C.struct_bind_arg
	ws, err := q.bindArgs(mrs, args[:])
	if err != nil {
		return nil, fmt.Errorf("ibverbs: bind windows: %w", err)
	}
	if len(ws) == 0 {
		return nil, nil
	}
	defer unlockWindows(ws)
	done := make(chan bool, 1)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil {
		return nil, q.err
	}
	q.nextID++
	id := q.nextID
	if rc := C.post_binds(q.qp, &args[0], C.int(len(ws)), C.uint64_t(id)); rc != 0 {
		for _, w := range ws {
			w.deallocLocked()
			w.state = winFree
		}
		return nil, fmt.Errorf("%w: ibv_post_send (bind windows): %w", verbs.ErrInvalidWR, syscall.Errno(rc))
	}
	q.wrs[id] = wrInfo{bound: done}
	q.boundLocked(ws)
	q.h.binds.Add(uint64(len(ws)))
	return done, nil
}

// waitBinds waits for the binds postBinds posted.
func waitBinds(ctx context.Context, done <-chan bool) error {
	select {
	case ok := <-done:
		if !ok {
			return fmt.Errorf("ibverbs: bind windows: %w", verbs.ErrConnectionLost)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// remoteInvalidated records a received Send With Invalidate of stag on
// the window it names, if any: the device ended that binding.
func (h *hook) remoteInvalidated(stag uint32) {
	if !h.windows {
		return
	}
	h.mu.Lock()
	var ws []*window
	for _, w := range h.wins {
		ws = append(ws, w)
	}
	h.mu.Unlock()
	for _, w := range ws {
		if w.remoteInvalidated(stag) {
			return
		}
	}
}
