package main

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/rdmafs/rdmafs/rpcrdma"
	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// With the pure-Go iWARP provider, a client's TCP connection is held by
// the iWARP listener through the MPA exchange (up to 30 s, 64 at once
// for every client together) before the responder's gate sees it. The
// relay therefore checks --allow and --max-connections-per-source on the
// TCP connection too, as it is accepted: a source that opens connections
// and never sends its MPA request holds no more than its share of them.

// gateCounts are the refusals of the TCP-level gate, and the log every
// refusal of the relay goes to.
type gateCounts struct {
	notAllowed, overLimit atomic.Uint64
	log                   *refusalLog
}

// gatedIWARP is the pure-Go iWARP provider behind the TCP-level gate.
type gatedIWARP struct {
	iwarp.Provider
	gate *gateConfig
}

var _ verbs.Provider = (*gatedIWARP)(nil)

// Listen implements verbs.Provider.
func (p *gatedIWARP) Listen(addr string, cp *verbs.ConnParams) (verbs.Listener, error) {
	ta, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("iwarp: listen %s: %w", addr, err)
	}
	ln, err := net.ListenTCP("tcp", ta)
	if err != nil {
		return nil, fmt.Errorf("iwarp: listen %s: %w", addr, err)
	}
	return iwarp.NewListener(&tcpGate{TCPListener: ln, gate: p.gate, bySrc: make(map[string]int)}, cp), nil
}

// tcpGate is a net.Listener that refuses, as they are accepted, the
// connections the gate does not let in.
type tcpGate struct {
	*net.TCPListener
	gate *gateConfig

	mu    sync.Mutex
	bySrc map[string]int
}

func (l *tcpGate) Accept() (net.Conn, error) {
	for {
		c, err := l.AcceptTCP()
		if err != nil {
			return nil, err
		}
		if gc, ok := l.admit(c); ok {
			return gc, nil
		}
		c.Close()
	}
}

func (l *tcpGate) admit(c *net.TCPConn) (net.Conn, bool) {
	peer, counts := c.RemoteAddr(), l.gate.counts
	if !l.gate.allows(peer) {
		counts.notAllowed.Add(1)
		counts.log.refused(peer, fmt.Errorf("%w: %v", rpcrdma.ErrNotAllowed, peer))
		return nil, false
	}
	src := sourceKey(peer)
	l.mu.Lock()
	n := l.bySrc[src]
	if n < l.gate.maxPerSource {
		l.bySrc[src]++
	}
	l.mu.Unlock()
	if n >= l.gate.maxPerSource {
		counts.overLimit.Add(1)
		counts.log.refused(peer, fmt.Errorf("%w: %d connections from %s, the most one source may have", rpcrdma.ErrTooManyConns, n, src))
		return nil, false
	}
	return &gatedConn{TCPConn: c, release: func() { l.release(src) }}, true
}

func (l *tcpGate) release(src string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bySrc[src]--; l.bySrc[src] <= 0 {
		delete(l.bySrc, src)
	}
}

// sourceKey is the source a connection counts against: its IPv4
// address or its IPv6 /64, as the responder counts them.
func sourceKey(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	if v4 := ta.IP.To4(); v4 != nil {
		return v4.String()
	}
	return ta.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// gatedConn gives its count back when it is closed. It is a
// *net.TCPConn otherwise, whose CloseWrite and SyscallConn the iWARP
// provider uses (an orderly close, vectored reads and writes).
type gatedConn struct {
	*net.TCPConn
	once    sync.Once
	release func()
}

func (c *gatedConn) Close() error {
	c.once.Do(c.release)
	return c.TCPConn.Close()
}
