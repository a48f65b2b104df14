package mrcache

import (
	"fmt"

	"github.com/rdmafs/rdmafs/verbs"
)

// Registration is one exposure of slab memory to the peer: the STag,
// offset and length to advertise in a chunk segment.
//
// It is made and ended with registration work requests on the queue pair
// that carries the peer's accesses, as FRWR hardware does (Linux
// xprtrdma's frwr_ops.c: frwr_map builds an IB_WR_REG_MR, frwr_unmap_sync
// posts IB_WR_LOCAL_INV): the pool prepares them, the transport posts
// them and reports how they went.
//
//	reg, _ := buf.Expose(0, 4096, verbs.AccessRemoteWrite|verbs.AccessLocalWrite)
//	if err := qp.PostSend(reg.FastRegisterWR(id)); err != nil {
//		reg.Abandon()
//	}
//	reg.Posted() // reg.STag, reg.Offset, reg.Len are what to advertise
//	// ... the reply came ...
//	qp.PostSend(reg.LocalInvalidateWR(id2)) // and poll its completion, then:
//	placed, ok := reg.Invalidated() // or reg.Discard() if it failed
//
// A Registration is reused by later exposures once invalidated: the
// caller drops it after Invalidated, Discard or Abandon.
type Registration struct {
	pool   *Pool
	mr     *verbs.MemoryRegion
	target *chunk // the chunk the region was bound in last (nil: never bound)
	// What Expose prepared (the fast-register's operand), and whether
	// the region existed before it (ExposureReuses).
	off    uint64
	access verbs.Access
	reused bool
	live   bool
	STag   uint32
	Offset uint64 // the advertised offset of the first byte (0, or its address with a hardware provider)
	Len    int
}

// exposeAt prepares the exposure of n bytes at off in chunk ci, which
// holds allocated memory (so stays put): it takes an idle
// fast-registration region (or allocates one) and clears the bytes if the
// peer may write them and the provider cannot count what it placed.
func (p *Pool) exposeAt(ci int, off uint64, n int, access verbs.Access) (*Registration, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, fmt.Errorf("mrcache: expose %d bytes: %w", n, ErrClosed)
	}
	c := p.chunks[ci]
	var r *Registration
	if k := len(p.idleFR); k > 0 {
		r, p.idleFR = p.idleFR[k-1], p.idleFR[:k-1]
	}
	p.mu.Unlock()
	reused := r != nil
	if !reused {
		mr, err := p.pd.AllocFastReg()
		if err != nil {
			return nil, fmt.Errorf("mrcache: expose: %w", err)
		}
		r = &Registration{pool: p, mr: mr}
		p.mu.Lock()
		p.stats.FastRegions++
		p.mu.Unlock()
	}
	if access&verbs.AccessRemoteWrite != 0 && !p.pd.CountsPlacement() {
		// RFC 8166 s3.4.6 makes only the bytes the peer wrote data,
		// which a provider that does not count placement (rdma-core:
		// the device places unseen) cannot tell; the transport then
		// takes the peer's claim, so what it claims but did not write
		// must read as zeros, never as earlier contents of the memory
		// (another call's data, another file's). CONFORMANCE.md, "What
		// the client can verify".
		clear(c.mem[off : off+uint64(n)])
	}
	r.target, r.off, r.Len, r.access, r.reused = c, off, n, access, reused
	return r, nil
}

// FastRegisterWR returns the work request that binds the registration's
// region to exactly the bytes Expose was given (verbs.OpFastRegister),
// with work request ID wrid. Post it on the queue pair the peer reaches
// the memory through, ahead of the Send that offers it; then call Posted,
// or Abandon if the post failed.
func (r *Registration) FastRegisterWR(wrid uint64) verbs.SendWR {
	return verbs.SendWR{WRID: wrid, Opcode: verbs.OpFastRegister, Binding: verbs.MemoryBinding{
		MR: r.mr, Target: r.target.mr, Offset: r.off, Length: r.Len, Access: r.access}}
}

// Posted records that the fast-register work request was posted: the
// region's new STag is the exposure's from now on (verbs.OpFastRegister),
// and STag, Offset and Len are what to advertise. A registration that
// then completes in error is ended like any other (LocalInvalidateWR, and
// Discard when that fails too).
func (r *Registration) Posted() {
	r.STag, r.Offset, r.live = r.mr.STag(), r.mr.RemoteAddr(), true
	p := r.pool
	p.mu.Lock()
	p.stats.Exposures++
	if r.reused {
		p.stats.ExposureReuses++
	}
	p.stats.LiveExposures++
	p.mu.Unlock()
}

// Abandon gives up an exposure whose fast-register work request could not
// be posted. The region is deregistered rather than reused: what the
// provider did with it is unknown.
func (r *Registration) Abandon() {
	p := r.pool
	p.mu.Lock()
	p.stats.FastRegions--
	p.deregisterLocked(r)
	p.mu.Unlock()
}

// Live reports whether the exposure was posted and not ended yet.
func (r *Registration) Live() bool { return r != nil && r.live }

// LocalInvalidateWR returns the work request that ends the exposure
// (verbs.OpLocalInvalidate), with work request ID wrid: once it is posted
// no new access of the peer starts, and it completes after the accesses
// in progress ended (RFC 8166 s8.1). It is posted even if the peer already
// invalidated the STag with Send With Invalidate. When it completes
// successfully call Invalidated; if it fails, or does not complete in
// time, close the queue pair and call Discard.
func (r *Registration) LocalInvalidateWR(wrid uint64) verbs.SendWR {
	return verbs.SendWR{WRID: wrid, Opcode: verbs.OpLocalInvalidate, Binding: verbs.MemoryBinding{MR: r.mr}}
}

// Invalidated ends an exposure whose local invalidation completed
// successfully, so no placement can run any more, and returns how many
// bytes from the start of the exposed buffer the peer wrote, without a
// gap, during the exposure, as the provider saw them land
// (verbs.MemoryRegion.Placed), counted before the region is reused. ok is
// false with a hardware provider, which does not report placements. A
// responder whose Write chunk claims more than was placed left stale
// bytes in the buffer (RFC 8166 s3.4.6).
func (r *Registration) Invalidated() (placed int, ok bool) {
	if !r.Live() {
		return 0, false
	}
	n, ok := r.mr.Placed()
	r.live = false
	p := r.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.LiveExposures--
	if p.closed {
		p.stats.FastRegions--
		p.deregisterLocked(r)
	} else {
		p.idleFR = append(p.idleFR, r)
	}
	return int(n), ok
}

// Discard ends an exposure whose local invalidation failed or did not
// complete, once the caller closed the queue pair (which ends the peer's
// accesses through it): the region is deregistered, never reused, as
// xprtrdma does not reuse an MR whose LOCAL_INV did not succeed. An error
// means the device may still reach the memory: the chunk is kept mapped
// for good (QuarantinedBytes), and the caller must not reuse the buffer.
func (r *Registration) Discard() error {
	if !r.Live() {
		return nil
	}
	err := r.mr.Deregister()
	r.live = false
	p := r.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.LiveExposures--
	p.stats.FastRegions--
	if err != nil {
		if r.target != nil {
			r.target.pinned = true
		}
		return fmt.Errorf("mrcache: discard STag %#08x: %w", r.STag, err)
	}
	return nil
}

// ReserveFastRegions allocates fast-registration regions ahead of use, as
// xprtrdma creates its MRs when it connects, so calls bind and invalidate
// regions that already exist instead of allocating one while in flight.
func (p *Pool) ReserveFastRegions(n int) error {
	for range n {
		mr, err := p.pd.AllocFastReg()
		if err != nil {
			return fmt.Errorf("mrcache: reserve fast-registration regions: %w", err)
		}
		p.mu.Lock()
		p.idleFR = append(p.idleFR, &Registration{pool: p, mr: mr})
		p.stats.FastRegions++
		p.mu.Unlock()
	}
	return nil
}

// MR returns the fast-registration region (for an RDMA Read sink).
func (r *Registration) MR() *verbs.MemoryRegion { return r.mr }
