package verbs

import "fmt"

// Registration as work requests.
//
// A consumer registers and invalidates memory for the peer the way FRWR
// hardware does, with work requests on a queue pair's send queue that
// complete in its send CQ like any other (IB spec vol. 1 s10.7.2.3 fast
// registration and s10.6.7 memory windows; RFC 5040 s5.1 and RFC 5042
// s5: an STag is valid for the peer from when its registration took
// effect until it is invalidated):
//
//   - OpFastRegister binds the fast-registration region Binding.MR
//     (AllocFastReg) to exactly Binding.Length bytes at Binding.Offset of
//     the registered region Binding.Target, with Binding.Access, under a
//     new STag key. The new STag is Binding.MR.STag() once PostSend has
//     returned nil, so the Send that offers it can be built and posted
//     next; a fast-register posted before a Send is in effect when the
//     Send's peer sees the Send.
//   - OpBindWindow is the same for a memory window: a provider that
//     exposes memory with type-2 windows binds it on this queue pair, and
//     the window then works only through it; a provider without windows
//     carries it out as OpFastRegister.
//   - OpLocalInvalidate invalidates Binding.MR's STag: no new access of
//     the peer starts once PostSend has returned, and the request
//     completes only after the key is invalid and the provider's
//     accesses in progress have ended (RFC 8166 s8.1), so that the
//     memory may be reused once the completion is polled. A region is
//     bound again only after its invalidation completed.
//
// A malformed request (a region of another domain, a fast region still
// bound, bounds outside the target) fails PostSend with an error wrapping
// ErrInvalidWR, ErrInvalidSTag or ErrBounds, and nothing is posted. These
// replace the synchronous MemoryRegion.FastRegister, SendWR.Bind and
// WindowBinder, and MemoryRegion.Invalidate: the transport (rpcrdma, with
// mrcache.Registration) uses only the work requests; the providers carry
// them out with the synchronous calls, and tests without a queue pair use
// those (mrcache/mrcachetest, the conformance suite).

// MemoryBinding is the operand of a registration work request (see
// OpFastRegister, OpBindWindow, OpLocalInvalidate).
type MemoryBinding struct {
	// MR is the region the request acts on: a fast-registration region
	// to bind (OpFastRegister, OpBindWindow), or the region whose STag
	// to invalidate (OpLocalInvalidate).
	MR *MemoryRegion
	// Target, Offset, Length and Access are what MR is bound to: Length
	// bytes at Offset of the registered region Target, with Access
	// (OpFastRegister, OpBindWindow).
	Target *MemoryRegion
	Offset uint64
	Length int
	Access Access
}

// IsRegistration reports whether o is a registration work request's
// opcode, one a provider carries out on its memory rather than sends.
func (o Opcode) IsRegistration() bool {
	return o == OpFastRegister || o == OpLocalInvalidate || o == OpBindWindow
}

// CheckRegistration validates a registration work request for a queue
// pair of the domain pd: the opcode, an empty scatter/gather list and a
// region of pd. Errors wrap ErrInvalidWR. Providers call it from
// PostSend.
func CheckRegistration(wr *SendWR, pd *ProtectionDomain) error {
	b := &wr.Binding
	switch {
	case !wr.Opcode.IsRegistration():
		return fmt.Errorf("verbs: %v is not a registration: %w", wr.Opcode, ErrInvalidWR)
	case len(wr.SGL) != 0:
		return fmt.Errorf("verbs: %v with a scatter/gather list: %w", wr.Opcode, ErrInvalidWR)
	case b.MR == nil || b.MR.pd != pd:
		return fmt.Errorf("verbs: %v: no region of the queue pair's protection domain: %w", wr.Opcode, ErrInvalidWR)
	case wr.Opcode != OpLocalInvalidate && (b.Target == nil || b.Target.pd != pd):
		return fmt.Errorf("verbs: %v: no target region of the queue pair's protection domain: %w", wr.Opcode, ErrInvalidWR)
	}
	return nil
}

// invalidateNow invalidates mr without waiting for accesses in progress
// (spi.Link.InvalidateNow); quiesce waits for them.
func (mr *MemoryRegion) invalidateNow() error {
	mr.pd.mu.Lock()
	defer mr.pd.mu.Unlock()
	if mr.dead {
		return fmt.Errorf("verbs: invalidate: %w", ErrClosed)
	}
	return mr.invalidateLocked()
}
