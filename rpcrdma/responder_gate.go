package rpcrdma

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rdmafs/rdmafs/verbs"
)

// The responder's gate: which requesters it serves and how many
// connections it holds. Each connection pins receive buffers in
// registered memory from the moment it is set up, so the checks run in
// setupQP, before any is posted: a peer that is not allowed, or a source
// that already holds its share of connections, costs nothing but the
// refusal. A connection that sends nothing is closed after IdleTimeout,
// so that silent connections do not keep their buffers (or, in a relay,
// their server connections) forever.

// Errors a refused connection is refused with (ResponderConfig.OnRefuse).
var (
	ErrNotAllowed   = errors.New("rpcrdma: peer not allowed")
	ErrTooManyConns = errors.New("rpcrdma: too many connections")
)

// connGate counts the connections held, in total and by source.
type connGate struct {
	mu    sync.Mutex
	total int
	bySrc map[string]int
}

// sourceOf names the source a connection from a counts against: its
// IPv4 address, or its IPv6 /64 (one host's share of addresses: a
// single IPv6 host may use any address of its /64).
func sourceOf(a net.Addr) string {
	if a == nil {
		return ""
	}
	var ip net.IP
	if ta, ok := a.(*net.TCPAddr); ok {
		ip = ta.IP
	} else if host, _, err := net.SplitHostPort(a.String()); err == nil {
		ip = net.ParseIP(host)
	}
	if ip == nil {
		return a.String()
	}
	if v4 := ip.To4(); v4 != nil {
		return v4.String()
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// admit checks a new connection from peer against Allow and the bounds
// and, if it may be served, counts it; the caller gives it back with
// release(src) once the connection is gone.
func (s *Responder) admit(peer net.Addr) (src string, err error) {
	if s.cfg.Allow != nil && !s.cfg.Allow(peer) {
		s.stats.notAllowed.Add(1)
		return "", s.refuse(peer, fmt.Errorf("%w: %v", ErrNotAllowed, peer))
	}
	src = sourceOf(peer)
	g := &s.gate
	g.mu.Lock()
	switch {
	case s.cfg.MaxConns > 0 && g.total >= s.cfg.MaxConns:
		err = fmt.Errorf("%w: %d connections, the most the responder serves", ErrTooManyConns, g.total)
	case s.cfg.MaxConnsPerSource > 0 && g.bySrc[src] >= s.cfg.MaxConnsPerSource:
		err = fmt.Errorf("%w: %d connections from %s, the most one source may have", ErrTooManyConns, g.bySrc[src], src)
	default:
		if g.bySrc == nil {
			g.bySrc = make(map[string]int)
		}
		g.total++
		g.bySrc[src]++
	}
	g.mu.Unlock()
	if err != nil {
		s.stats.overLimit.Add(1)
		return "", s.refuse(peer, err)
	}
	return src, nil
}

func (s *Responder) refuse(peer net.Addr, err error) error {
	if s.cfg.OnRefuse != nil {
		s.cfg.OnRefuse(peer, err)
	}
	return err
}

// release gives back the count admit took for a connection from src.
func (s *Responder) release(src string) {
	g := &s.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	g.total--
	if g.bySrc[src]--; g.bySrc[src] <= 0 {
		delete(g.bySrc, src)
	}
}

// unclaimed gives back what setupQP took for qp if the connection ends
// before acceptLoop takes it (the handshake failed after Setup, or the
// listener closed it): its receive buffers and its count.
func (s *Responder) unclaimed(qp verbs.QueuePair, cs *connSetup) {
	select {
	case <-qp.Done():
	case <-cs.taken:
		return
	}
	if _, ok := s.recvBufs.LoadAndDelete(qp); !ok {
		return // acceptLoop took it meanwhile
	}
	for _, b := range cs.bufs {
		_ = s.pool.Put(b)
	}
	s.release(cs.src)
}

// watchIdle closes the connection once it has received nothing and had
// no call in progress for IdleTimeout; the returned func stops watching.
func (c *serverConn) watchIdle() (stop func()) {
	d := c.s.cfg.IdleTimeout
	if d <= 0 {
		return func() {}
	}
	c.touch()
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		if c.ctx.Err() != nil {
			return
		}
		left := d - time.Since(time.Unix(0, c.lastRecv.Load()))
		if c.inFlight.Load() > 0 || c.backwardBusy() {
			left = d
		}
		if left > 0 {
			t.Reset(left)
			return
		}
		c.tracef("closing %v: nothing received for %v", c.qp.RemoteAddr(), d)
		c.s.stats.idleClosed.Add(1)
		c.qp.Close()
	})
	return func() { t.Stop() }
}

// touch records that a message arrived.
func (c *serverConn) touch() { c.lastRecv.Store(time.Now().UnixNano()) }

// backwardBusy reports whether a backward call waits for its reply.
func (c *serverConn) backwardBusy() bool {
	c.bcMu.Lock()
	defer c.bcMu.Unlock()
	return len(c.bcPending) > 0
}
