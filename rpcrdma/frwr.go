package rpcrdma

import (
	"cmp"
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

	// inv waits for the call's local invalidations (regwr.go); unmapped
	// is what they found, by exposure. Both are kept with the pooled req.
	inv      regWaiter
	unmapped []unmapResult
	scratch  []*mrcache.Registration // the exposures unmap ends
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
// (RFC 8166 s8.1), and adds the exposure to regs, one of f's lists. The
// fast-register work request is posted on the connection's send queue
// now, so ahead of the call's Send, and not waited for (see regwr.go:
// xprtrdma's frwr_map and frwr_send).
func (f *frwr) mapBuffer(c *conn, xid uint32, regs *[]*mrcache.Registration, src *mrcache.Buffer, off, n int, access verbs.Access) (*mrcache.Registration, error) {
	reg, err := src.Expose(off, n, access)
	if err != nil {
		return nil, fmt.Errorf("rpcrdma: xid %#x: %w", xid, err)
	}
	if err := c.qp.PostSend(reg.FastRegisterWR(c.regWRID())); err != nil {
		reg.Abandon()
		return nil, fmt.Errorf("rpcrdma: xid %#x: post fast-register of %d bytes: %w", xid, n, err)
	}
	reg.Posted()
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
// connection from another goroutine (failRx). Waiting there for the
// invalidations' completions is safe: the registration reaper polls for
// them, not this goroutine (regwr.go).
//
// It notes what the peer placed in each (RFC 8166 s3.4.6: only the bytes
// the responder wrote are data), for the reply to be checked against.
func (f *frwr) unmapWritable(c *conn, xid uint32) error {
	nw := len(f.writeRegs)
	list := append(append(f.scratch[:0], f.writeRegs...), f.replyRegs...)
	f.scratch = list
	first := f.unmap(c, xid, list, c.failRx)
	known := true // every Write chunk segment's placed count is known
	placed := f.placedBuf[:0]
	for i, res := range f.unmapped {
		if i < nw {
			placed = append(placed, res.placed) // 0 if it failed: the call fails (see unmap)
			known = known && res.known
		} else if res.err == nil {
			f.replyPlaced, f.replyKnown = res.placed, res.known
		}
	}
	f.placedBuf = placed
	if nw > 0 && known && first == nil {
		f.writePlaced = placed
	}
	clear(list)
	clear(f.writeRegs)
	clear(f.replyRegs)
	f.writeRegs, f.replyRegs = f.writeRegs[:0], f.replyRegs[:0]
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
	if f.exposures() == 0 {
		return nil
	}
	closeNow := func(err error) {
		c.qp.Close()
		go c.fail(err)
	}
	list := append(append(append(f.scratch[:0], f.writeRegs...), f.replyRegs...), f.readRegs...)
	f.scratch = list
	err := f.unmap(c, xid, list, closeNow)
	clear(list)
	for _, regs := range [...]*[]*mrcache.Registration{&f.writeRegs, &f.replyRegs, &f.readRegs} {
		clear(*regs)
		*regs = (*regs)[:0]
	}
	return err
}

// unmapResult is what ending one exposure found: the bytes the provider
// saw placed (known false: it cannot count), or why it failed.
type unmapResult struct {
	placed int
	known  bool
	err    error
}

// invalidateWait bounds how long an invalidation waits for a placement in
// progress before the connection is closed under it.
const invalidateWait = 2 * time.Second

// unmap ends the exposures regs: their local invalidations are posted on
// the connection's send queue one after the other and waited for
// together, up to invalidateWait (xprtrdma's frwr_unmap_sync: LOCAL_INVs
// chained, the wait for their completion); f.unmapped[i] is what ending
// regs[i] found. The provider may still be using a region (a Read chunk
// whose Read Response it is finishing when the reply comes): its
// invalidation completes when that access ends.
//
// An invalidation that cannot be posted, completes in error or does not
// complete in time closes the connection (closeConn), which ends the
// peer's accesses, and its exposure is then discarded: the region is
// deregistered, never reused (mrcache Discard). If even that fails the
// call's buffers are withdrawn for good and the transport refuses
// further calls (RFC 8166 s4.5.4).
func (f *frwr) unmap(c *conn, xid uint32, regs []*mrcache.Registration, closeConn func(error)) error {
	res := f.unmapped[:0]
	for range regs {
		res = append(res, unmapResult{})
	}
	f.unmapped = res
	if len(regs) == 0 {
		return nil
	}
	w := &f.inv
	c.postRegistrations(w, len(regs), func(i int, wrid uint64) verbs.SendWR { return regs[i].LocalInvalidateWR(wrid) })
	c.awaitRegistrations(w, invalidateWait)
	var first error
	for i, reg := range regs {
		err := w.errs[i]
		switch {
		case err != nil:
			err = fmt.Errorf("post local invalidation of STag %#x: %w", reg.STag, err)
		case w.status[i] == statusPending:
			err = fmt.Errorf("local invalidation of STag %#x not complete after %v", reg.STag, invalidateWait)
		case w.status[i] != verbs.StatusSuccess:
			err = fmt.Errorf("local invalidation of STag %#x completed %v", reg.STag, w.status[i])
		}
		if c.t.cfg.Tracer.On(trace.MR) {
			c.t.cfg.Tracer.Printf(trace.MR, "mr_localinv xid=%#x stag=%#x err=%v", xid, reg.STag, err)
		}
		if err == nil {
			res[i].placed, res[i].known = reg.Invalidated()
			continue
		}
		res[i].err = err
		first = cmp.Or(first, err)
	}
	if first == nil {
		return nil
	}
	c.t.tracef(trace.RDMA, "xid=%#x: %v: closing the connection", xid, first)
	closeConn(fmt.Errorf("%w: %w", oncrpc.ErrConnection, first))
	for i, reg := range regs {
		if res[i].err == nil {
			continue
		}
		if err := reg.Discard(); err != nil {
			f.exposed = true
			c.t.disable(fmt.Errorf("%w: xid %#x: %w", ErrExposed, xid, err))
		}
	}
	return first
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
