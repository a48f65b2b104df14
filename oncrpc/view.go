package oncrpc

// View is the one way data-path bytes travel between the layers (from the
// FUSE buffer through nfsclient and Call to the transport): Len bytes at
// an offset in registered memory a transport lent (the owner), or bytes
// of ordinary memory, which has no owner and which a transport copies.
// The bytes and the owner cannot disagree: a view is made from its owner
// (Lent) and narrowed by Slice, never assembled from a slice and an owner
// found apart.
//
// The zero View is no data at all; Plain of an empty, non-nil slice is
// data of length zero (an NFS WRITE of nothing still has its opaque).
type View struct {
	owner Registered // nil: ordinary memory
	off   int        // of data in owner's memory
	data  []byte
}

// Registered is memory a transport registered for direct access by its
// peer: an RPC-over-RDMA transport's slab buffer (mrcache.Buffer), lent
// to the layers above and handed back in the views of the calls that use
// it, so the transport knows its memory by type, not by address.
type Registered interface {
	Bytes() []byte
}

// Plain returns a view of ordinary memory: a transport that moves
// registered memory only copies it.
func Plain(b []byte) View { return View{data: b} }

// Lent returns a view of all of owner's memory.
func Lent(owner Registered) View { return View{owner: owner, data: owner.Bytes()} }

// Slice returns the view of v's bytes [i:j], in the same owner; it panics
// as a slice expression does when the bounds are out of range.
func (v View) Slice(i, j int) View {
	return View{owner: v.owner, off: v.off + i, data: v.data[i:j:j]}
}

// Bytes returns the view's bytes.
func (v View) Bytes() []byte { return v.data }

// Len returns the number of bytes in view.
func (v View) Len() int { return len(v.data) }

// IsZero reports whether v is the zero View: no data at all.
func (v View) IsZero() bool { return v.owner == nil && v.data == nil }

// Owner returns the registered memory the view lies in and the view's
// offset in it; owner is nil for ordinary memory.
func (v View) Owner() (owner Registered, off int) { return v.owner, v.off }

// ViewHandler is a CallHandler whose replies may lie in registered memory
// a transport lent it (the RPC-over-RDMA responder's Buffers, wrapped with
// Lent): a server that knows it calls HandleCallView instead of
// HandleCall, moves the reply from where it is when the memory is its
// own, and gives it back with ReleaseView once nothing of it is
// referenced any more (as ReplyReleaser does for HandleCall's replies).
type ViewHandler interface {
	CallHandler
	HandleCallView(msg []byte) View
	ReleaseView(reply View)
}
