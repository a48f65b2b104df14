// Package spi is the provider side of package verbs: what a provider
// (verbs/iwarp, verbs/ibverbs) needs of protection domains and memory
// regions that a consumer of the verbs API must not see. Being internal
// to verbs, only packages under verbs/ can import it.
//
// Package verbs cannot be imported here (verbs imports spi), so the
// interfaces are generic in the region type MR, which providers
// instantiate with *verbs.MemoryRegion, and verbs hands its accessors
// over at init (Set) in a Link that providers fetch once (Get), the way
// the standard library links a package to its internal half. A
// provider's package variables are initialized after verbs's init, so
//
//	var link = spi.Get[*verbs.MemoryRegion, *verbs.ProtectionDomain, verbs.Access]()
//
// is ready before any of its code runs.
package spi

import "context"

// Hook is a provider's side of a protection domain: it mirrors the
// domain's registrations where the provider keeps them (the device for
// verbs/ibverbs, the software STag table for verbs/iwarp). Register and
// Reregister return the STag the provider assigned.
//
// The methods run with the domain's lock held, except Reregister of a
// fast-registration region (FastRegister), which runs without it so that
// one exposure's device call does not hold up the domain's other queue
// pairs; no other change to that region runs meanwhile. They read the
// region through the Link's accessors (Bytes, Access, STag, Parent, and
// the region's IsFast), never through the region's locking methods.
// Register of a fast-registration region may return STag 0 ("no key
// yet"): such a region gets its key from Reregister. Invalidate stops new
// accesses at once and must not wait; a provider whose accesses are in
// progress in software waits for them in Quiesce (see Quiescer). A
// provider may reuse the index of an invalidated region; the domain then
// forgets the stale region's index.
type Hook[MR any] interface {
	Register(mr MR) (stag uint32, err error)
	Reregister(mr MR) (stag uint32, err error)
	Invalidate(mr MR) error
	Deregister(mr MR) error
}

// RemoteAddresser is implemented by a hook whose hardware names the first
// byte of a region by an address other than 0 (ibv_reg_mr regions are
// addressed by virtual address). It runs with the domain's lock held.
// Without it regions are zero based.
type RemoteAddresser[MR any] interface {
	RemoteAddr(mr MR) uint64
}

// Quiescer is implemented by a hook whose provider reads and writes
// registered memory in software for the peer (verbs/iwarp): Quiesce waits
// until no such access to mr is in progress, or ctx ends. The domain calls
// it without its lock, after Invalidate, so that once an invalidation
// returns no byte of the region is read or written for the peer any more
// (RFC 8166 s8.1). Without it an invalidation does not wait.
type Quiescer[MR any] interface {
	Quiesce(ctx context.Context, mr MR) error
}

// PlacementCounter is implemented by a hook whose provider may see the
// peer's writes land (verbs/iwarp). CountsPlacement reports whether it
// does (not when it stands in for hardware, which places data unseen);
// Placed then returns how many bytes from the region's start the peer
// wrote, without a gap, since it was last bound. Placed runs with the
// domain's lock held. Without it the domain counts no placement.
type PlacementCounter[MR any] interface {
	CountsPlacement() bool
	Placed(mr MR) uint64
}

// Link is what package verbs gives its providers: MR, PD and A are
// *verbs.MemoryRegion, *verbs.ProtectionDomain and verbs.Access.
type Link[MR, PD any, A ~uint32] struct {
	// NewDomain returns a protection domain whose registrations hook
	// mirrors: a provider's domain.
	NewDomain func(hook Hook[MR]) PD
	// HookOf returns the hook of a domain, so that a provider can tell
	// its own domains.
	HookOf func(pd PD) Hook[MR]
	// InvalidateRemote performs the invalidation a received Send With
	// Invalidate asks for (RFC 5040 s5.3): only a valid region of the
	// domain with remote access rights can be invalidated. It does not
	// wait for accesses in progress.
	InvalidateRemote func(pd PD, stag uint32) error
	// InvalidateNow and Quiesce are the halves of a local invalidation
	// (verbs.OpLocalInvalidate): InvalidateNow makes the region's STag
	// invalid at once, without waiting; Quiesce then waits until the
	// provider's accesses in progress have ended, or ctx ends.
	InvalidateNow func(mr MR) error
	Quiesce       func(ctx context.Context, mr MR) error

	// Local resolves a local scatter/gather element of a region, checking
	// that the region is alive and has need, and that [off, off+n) lies
	// inside it, without a lock shared by the domain's queue pairs.
	// Errors wrap verbs.ErrInvalidSTag, ErrAccess or ErrBounds.
	Local func(mr MR, need A, off uint64, n uint32) ([]byte, error)

	// Bytes, Access, STag and Parent are for Hook implementations,
	// called with the domain's lock held: the memory the region names
	// now, its access rights, its STag before the call, and the
	// registered region a fast-registration region is bound in (the
	// zero MR for other regions).
	Bytes  func(mr MR) []byte
	Access func(mr MR) A
	STag   func(mr MR) uint32
	Parent func(mr MR) MR

	// SetData attaches the provider's own record of a region (a device
	// registration, a memory window), nil to drop it; Data reads what
	// was attached last without a lock, so that a provider's data path
	// (converting SGEs, binding windows) needs no lock shared by all the
	// domain's queue pairs.
	SetData func(mr MR, v any)
	Data    func(mr MR) any
}

// link is the Link package verbs set; its type is only known to Get's
// caller.
var link any

// Set is called by package verbs at init.
func Set[MR, PD any, A ~uint32](l Link[MR, PD, A]) { link = l }

// Get returns the Link package verbs set. It is the zero Link if the type
// arguments are not the ones verbs used, which a provider's first test
// shows.
func Get[MR, PD any, A ~uint32]() Link[MR, PD, A] {
	l, _ := link.(Link[MR, PD, A])
	return l
}
