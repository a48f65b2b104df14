package rpcrdma

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
)

// frwr is what one call exposed to the peer, whatever the provider
// (fast registration, a registration of exactly the bytes, a memory
// window), and the one owner of those exposures, as a request owns its
// MRs in Linux xprtrdma's frwr_ops.c. Its life has three steps, each
// taken from one place:
//
//   - mapBuffer, while the call is marshalled (conn.marshal), offers
//     bytes of a slab buffer for a Read, Write or Reply chunk;
//   - unmapWritable, when the reply comes (conn.receiveReply), ends what
//     the peer may write before the reply is looked at (RFC 8166 s3.4.5,
//     s4.4.1; xprtrdma's frwr_unmap_sync) and notes what it placed;
//   - unmapAll, when the call ends for any reason (conn.send: a reply,
//     a timeout, a lost connection), ends the rest, the Read chunk's,
//     before the call returns (RFC 8166 s8.1).
//
// An exposure that cannot be ended in time closes the connection before
// the call completes (RFC 8166 s4.5.4).
type frwr struct {
	// One list per chunk kind (RFC 8166 s3.4), in the order of the
	// chunk's segments.
	writeRegs, replyRegs, readRegs []*mrcache.Registration

	binds []*verbs.MemoryRegion // backs bindList, kept with the pooled req
	// writePlaced is what the provider saw placed in each Write chunk
	// segment, counted by unmapWritable (mrcache InvalidatePlaced); nil
	// when it cannot know (a hardware provider).
	writePlaced []int
	placedBuf   []int // backs writePlaced, kept with the pooled req
	// replyPlaced is what the provider saw placed in the Reply chunk;
	// replyKnown is false when it cannot know.
	replyPlaced int
	replyKnown  bool
	// exposed: an exposure could not be ended even with the connection
	// closed, so the call's buffers are withdrawn for good.
	exposed bool
}

// mapBuffer offers the n bytes at off in src (an upper-layer buffer or
// one the transport took for the call) to the peer with the given access
// (RFC 8166 s8.1), and adds the exposure to regs, one of f's lists.
func (f *frwr) mapBuffer(c *conn, xid uint32, regs *[]*mrcache.Registration, src *mrcache.Buffer, off, n int, access verbs.Access) (*mrcache.Registration, error) {
	reg, err := src.Expose(off, n, access)
	if err != nil {
		return nil, fmt.Errorf("rpcrdma: xid %#x: %w", xid, err)
	}
	*regs = append(*regs, reg)
	if c.t.cfg.Tracer.On(trace.MR) {
		c.t.cfg.Tracer.Printf(trace.MR, "mr_map xid=%#x stag=%#x len=%d access=%v", xid, reg.STag, reg.Len, access)
	}
	return reg, nil
}

// exposures returns how many exposures of f are live.
func (f *frwr) exposures() int {
	return len(f.writeRegs) + len(f.replyRegs) + len(f.readRegs)
}

// bindList returns the regions of the call's exposures, for its Send to
// bind (verbs.SendWR.Bind), or nil if it has none.
func (f *frwr) bindList() []*verbs.MemoryRegion {
	if f.exposures() == 0 {
		return nil
	}
	binds := f.binds[:0]
	for _, regs := range [...][]*mrcache.Registration{f.writeRegs, f.replyRegs, f.readRegs} {
		for _, reg := range regs {
			binds = append(binds, reg.MR())
		}
	}
	f.binds = binds
	return binds
}

// offered reports whether stag is one of the call's exposures.
func (f *frwr) offered(stag uint32) bool {
	for _, regs := range [...][]*mrcache.Registration{f.writeRegs, f.replyRegs, f.readRegs} {
		for _, reg := range regs {
			if reg.STag == stag {
				return true
			}
		}
	}
	return false
}

// unmapWritable ends the exposures the peer may write, the Write and
// Reply chunks', before the reply is looked at. It runs on the receive
// path, maybe in the provider's receiving goroutine (verbs.RecvHandlerSetter),
// which closing the queue pair would wait for: a failure fails the
// connection from another goroutine (failRx).
//
// It notes what the peer placed in each (RFC 8166 s3.4.6: only the bytes
// the responder wrote are data), for the reply to be checked against.
func (f *frwr) unmapWritable(c *conn, xid uint32) error {
	var first error
	known := true // every Write chunk segment's placed count is known
	placed := f.placedBuf[:0]
	for i, reg := range f.writeRegs {
		n, ok, err := f.end(c, xid, reg, c.failRx)
		if err != nil {
			n = 0 // the call fails: see unmapAll
			first = cmp.Or(first, err)
		}
		placed = append(placed, n)
		known = known && ok
		f.writeRegs[i] = nil
	}
	f.placedBuf = placed
	if len(f.writeRegs) > 0 && known {
		f.writePlaced = placed
	}
	f.writeRegs = f.writeRegs[:0]
	for i, reg := range f.replyRegs {
		n, ok, err := f.end(c, xid, reg, c.failRx)
		if err != nil {
			first = cmp.Or(first, err)
		} else {
			f.replyPlaced, f.replyKnown = n, ok
		}
		f.replyRegs[i] = nil
	}
	f.replyRegs = f.replyRegs[:0]
	return first
}

// unmapAll ends every exposure of the call before it returns (RFC 8166
// s4.4.1, s8.1), even those the peer already invalidated with Send With
// Invalidate: the Read chunk's, which the provider may still be reading
// for the peer when the reply comes, and whatever a call that ends
// without a reply (timeout, cancellation, connection loss,
// retransmission) left. It runs on the caller's goroutine, so a failure
// closes the queue pair at once.
//
// An error means the call's memory was not safe to use when the call
// ended: the connection is closed before unmapAll returns, so before the
// call completes (RFC 8166 s4.5.4), and the call must not deliver a
// reply. An exposure that still cannot be ended once the queue pair is
// closed stays reachable through the protection domain, which outlives
// connections: the call's buffers are withdrawn for good (f.exposed) and
// the transport refuses further calls (ErrExposed).
func (f *frwr) unmapAll(c *conn, xid uint32) error {
	closeNow := func(err error) {
		c.qp.Close()
		go c.fail(err)
	}
	first := f.unmapList(c, xid, &f.writeRegs, closeNow)
	first = cmp.Or(first, f.unmapList(c, xid, &f.replyRegs, closeNow))
	return cmp.Or(first, f.unmapList(c, xid, &f.readRegs, closeNow))
}

func (f *frwr) unmapList(c *conn, xid uint32, regs *[]*mrcache.Registration, closeConn func(error)) error {
	var first error
	for i, reg := range *regs {
		if _, _, err := f.end(c, xid, reg, closeConn); err != nil {
			first = cmp.Or(first, err)
		}
		(*regs)[i] = nil
	}
	*regs = (*regs)[:0]
	return first
}

// noWait is a context that has ended: an invalidation with it returns at
// once if a placement is in progress.
var noWait = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// invalidateWait bounds how long an invalidation waits for a placement in
// progress before the connection is closed under it.
const invalidateWait = 2 * time.Second

// end invalidates one exposure and returns what the provider saw placed
// in it (known false: it cannot count). If it cannot, closeConn closes
// the connection, which ends the placement, and end waits for it.
//
// The exposure is first invalidated without waiting, which needs no
// timer: only when the provider is still using the region (a Read chunk
// whose Read Response it is finishing when the reply comes: a few calls
// in a hundred with the responder in another process, about half with
// it in this one) does the bounded wait follow. The region is invalid
// after the first attempt either way; the second only waits.
func (f *frwr) end(c *conn, xid uint32, reg *mrcache.Registration, closeConn func(error)) (placed int, known bool, err error) {
	placed, known, err = reg.InvalidatePlaced(noWait)
	if err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), invalidateWait)
		placed, known, err = reg.InvalidatePlaced(ctx)
		cancel()
	}
	if c.t.cfg.Tracer.On(trace.MR) {
		c.t.cfg.Tracer.Printf(trace.MR, "mr_localinv xid=%#x stag=%#x err=%v", xid, reg.STag, err)
	}
	if err == nil {
		return placed, known, nil
	}
	c.t.tracef(trace.RDMA, "xid=%#x: %v: closing the connection", xid, err)
	closeConn(fmt.Errorf("%w: %w", oncrpc.ErrConnection, err))
	if err := reg.Invalidate(context.Background()); err != nil {
		f.exposed = true
		c.t.disable(fmt.Errorf("%w: xid %#x: %w", ErrExposed, xid, err))
	}
	return 0, false, err
}

// disable makes the transport refuse calls for good: memory it exposed
// could not be protected (RFC 8166 s4.5.4).
func (t *Transport) disable(err error) {
	t.tracef(trace.RDMA, "%v", err)
	t.mu.Lock()
	if t.exposed == nil {
		t.exposed = err
	}
	c := t.conn
	t.mu.Unlock()
	if c != nil {
		go c.fail(err)
	}
}
