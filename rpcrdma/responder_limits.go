package rpcrdma

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rdmafs/rdmafs/mrcache"
)

// Limits of the responder per connection, so that one requester, broken
// or hostile, cannot take what the others need: its calls in progress
// are bounded by the credits we grant it (RFC 8166 s3.3.1: a requester
// exceeding the grant may have its connection terminated), its
// registered memory by a share of the slab, and the time it may leave an
// RDMA Read of its Read chunks unanswered by a deadline. A connection
// that breaks a limit is closed; the others go on.

// Defaults of the limits.
const (
	defaultMemory      = 256 << 20 // the slab
	defaultShareDiv    = 8         // a connection may hold 1/8 of it
	defaultReadTimeout = 30 * time.Second
	// setupWait bounds how long a new connection waits for the
	// registered memory of its receive buffers before it is refused.
	setupWait = 10 * time.Second
)

// connBudget bounds the registered memory a connection holds.
type connBudget struct {
	mu    sync.Mutex
	total int64
	used  int64
	freed chan struct{} // closed when memory is given back
}

func newConnBudget(total int64) *connBudget {
	return &connBudget{total: total, freed: make(chan struct{})}
}

// acquire takes n bytes of the budget, waiting until enough is given
// back or ctx ends. A request larger than the whole budget is granted
// when nothing else is held, so that it cannot wait forever.
func (b *connBudget) acquire(ctx context.Context, n int64) error {
	for {
		b.mu.Lock()
		if b.used+n <= b.total || b.used == 0 {
			b.used += n
			b.mu.Unlock()
			return nil
		}
		freed := b.freed
		b.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return fmt.Errorf("rpcrdma: responder: wait for %d bytes of the connection's %d-byte share of registered memory: %w", n, b.total, ctx.Err())
		}
	}
}

// release gives back n bytes.
func (b *connBudget) release(n int64) {
	b.mu.Lock()
	b.used -= n
	close(b.freed)
	b.freed = make(chan struct{})
	b.mu.Unlock()
}

// getBuf returns n bytes of registered memory from the connection's
// share, waiting while the share or the slab is used up, until the
// connection ends: from the inbound half (in) for a buffer the peer fills
// (a receive buffer, an RDMA Read sink), else from the outbound half (a
// Send, an RDMA Write source).
//
// Stale bytes: a receive buffer is cleared (zero), as a Send may place
// fewer bytes than the buffer holds and the length the provider reports
// is all that is handed up, but whatever an earlier connection left in it
// must never pass for this one's. An RDMA Read sink is not: a Read
// completes successfully only once every byte of it is placed (RFC 5040
// s5.2: the Read Response's last segment ends exactly at its size), and
// the call rebuilt around it is written whole (inline parts, the Read,
// the padding). What we send from, we fill ourselves.
func (c *serverConn) getBuf(n int, in, zero bool) (*mrcache.Buffer, error) {
	if in {
		return c.s.getBuf(c.ctx, c.mem, n, zero)
	}
	return c.s.getBuf(c.ctx, c.out, n, zero)
}

func (s *Responder) getBuf(ctx context.Context, mem *connBudget, n int, zero bool) (*mrcache.Buffer, error) {
	n = max(n, 1)
	if err := mem.acquire(ctx, int64(n)); err != nil {
		return nil, err
	}
	b, err := s.pool.GetWait(ctx, n)
	if err != nil {
		mem.release(int64(n))
		return nil, err
	}
	if zero {
		clear(b.Bytes())
	}
	return b, nil
}

// putBuf gives back a buffer getBuf returned with the same in.
func (c *serverConn) putBuf(b *mrcache.Buffer, in bool) {
	size := int64(len(b.Bytes())) // what getBuf took: its n, at least 1
	if in {
		_ = c.s.pool.Put(b)
		c.mem.release(size)
	} else {
		// A Send or RDMA Write source never left the connection: its
		// handle is reused.
		_ = c.s.pool.Recycle(b)
		c.out.release(size)
	}
}

// enter takes one of the connection's call slots for a message that
// arrived; it reports false when every slot the grant allows is taken:
// the requester sent more than it was granted.
func (c *serverConn) enter() bool {
	select {
	case c.slots <- struct{}{}:
	default:
		return false
	}
	depth := c.inFlight.Add(1)
	for {
		m := c.s.maxInFlight.Load()
		if depth <= m || c.s.maxInFlight.CompareAndSwap(m, depth) {
			return true
		}
	}
}

// leave gives back the slot enter took.
func (c *serverConn) leave() {
	c.inFlight.Add(-1)
	<-c.slots
}
