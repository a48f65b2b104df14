package oncrpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmafs/rdmafs/internal/wait"
)

// MaxConnections bounds a MultiTransport's connections, as Linux bounds
// nfs(5)'s nconnect (NFS_MAX_CONNECTIONS).
const MaxConnections = 16

// Redialer is a Transport that can be told to connect now and says how
// many connections it has made. TCPTransport and the RPC-over-RDMA
// transport are Redialers; MultiTransport uses it to notice that a
// connection was replaced, so it can be bound again before it carries
// calls.
type Redialer interface {
	Transport
	// Connect makes the connection now if there is none.
	Connect(ctx context.Context) error
	// Generation counts the connections made so far (1 for the first).
	Generation() uint64
}

// BindFunc readies connection i of a MultiTransport for calls, sending
// over tr, the connection's own transport: an NFSv4.1 client sends
// BIND_CONN_TO_SESSION there (RFC 8881 s18.34).
type BindFunc func(ctx context.Context, i int, tr Transport) error

// MultiOptions configure a MultiTransport.
type MultiOptions struct {
	// RDMA says the connections are RPC-over-RDMA ones (NFSv4.1 binds
	// them in RDMA mode).
	RDMA bool
	// BindTimeout bounds one background redial and bind. Zero means 30 s.
	BindTimeout time.Duration
	// OnEvent, if set, is told of connections lost and bound again.
	OnEvent func(i int, event string, err error)
}

// MultiTransport spreads calls over several connections to one server,
// as nfs(5)'s nconnect: round robin per call. A call whose connection
// breaks is sent again at once, same XID and bytes, on another one (for
// NFSv4.1 the same slot and sequence ID, so the server's reply cache
// answers it if it ran: RFC 8881 s2.10.6.2); the broken connection is
// redialled in the background and bound again (BindFunc) before it
// carries calls.
//
// Until Bind is called every call goes over the first connection (it
// carries CREATE_SESSION, which binds it to the session).
type MultiTransport struct {
	conns []*multiConn
	opts  MultiOptions
	next  atomic.Uint32

	ctx    context.Context // ends at Close
	cancel context.CancelFunc

	mu      sync.Mutex
	bind    BindFunc      // nil until Bind
	changed chan struct{} // closed and replaced when a connection comes up
	closed  bool
}

type multiConn struct {
	tr       Transport
	up       atomic.Bool   // bound and usable
	gen      atomic.Uint64 // Generation when bound
	reviving atomic.Bool

	calls, bytesOut, bytesIn, resent, reconnects, failures atomic.Uint64
	lastErr                                                atomic.Pointer[string]
}

// NewMultiTransport returns a transport over conns, which must all lead
// to the same server. It takes ownership of them.
func NewMultiTransport(conns []Transport, opts MultiOptions) (*MultiTransport, error) {
	if len(conns) == 0 || len(conns) > MaxConnections {
		return nil, fmt.Errorf("oncrpc: %d connections: want 1 to %d", len(conns), MaxConnections)
	}
	if opts.BindTimeout <= 0 {
		opts.BindTimeout = 30 * time.Second
	}
	m := &MultiTransport{opts: opts, changed: make(chan struct{})}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	for _, tr := range conns {
		m.conns = append(m.conns, &multiConn{tr: tr})
	}
	return m, nil
}

// Len returns the number of connections.
func (m *MultiTransport) Len() int { return len(m.conns) }

// Conn returns connection i's own transport (for its statistics, and
// for tests that break it).
func (m *MultiTransport) Conn(i int) Transport { return m.conns[i].tr }

// RDMA reports MultiOptions.RDMA.
func (m *MultiTransport) RDMA() bool { return m.opts.RDMA }

// SetCallHandler registers h on every connection: the server may send
// backward-direction calls on any connection bound for them.
func (m *MultiTransport) SetCallHandler(h CallHandler) {
	for _, c := range m.conns {
		c.tr.SetCallHandler(h)
	}
}

// SetBackwardLimits sets the backward-call limits of every connection
// that has them (BackwardLimiter).
func (m *MultiTransport) SetBackwardLimits(calls, size int) {
	for _, c := range m.conns {
		if bl, ok := c.tr.(BackwardLimiter); ok {
			bl.SetBackwardLimits(calls, size)
		}
	}
}

// Close closes every connection, the first one last (the others may
// share its resources, as RPC-over-RDMA connections share registered
// memory).
func (m *MultiTransport) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.cancel()
	var errs []error
	for i := len(m.conns) - 1; i >= 0; i-- {
		if err := m.conns[i].tr.Close(); err != nil {
			errs = append(errs, fmt.Errorf("connection %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// Bind readies the connections after the first with bind, now, and
// from then on spreads calls over all of them; a connection replaced
// later is bound again with it before it carries calls. The first
// connection is taken as bound already. Bind fails if any connection
// could not be made or bound.
func (m *MultiTransport) Bind(ctx context.Context, bind BindFunc) error {
	m.mu.Lock()
	m.bind = bind
	m.mu.Unlock()
	if c := m.conns[0]; !c.up.Load() {
		c.gen.Store(generation(c.tr))
		m.setUp(c)
	}
	var errs []error
	for i := 1; i < len(m.conns); i++ {
		if err := m.bindConn(ctx, i); err != nil {
			errs = append(errs, fmt.Errorf("connection %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// Rebind binds every live connection again with the BindFunc, as after
// a new session replaced the one they were bound to. A connection that
// fails is redialled and bound in the background.
func (m *MultiTransport) Rebind(ctx context.Context) {
	m.mu.Lock()
	bound := m.bind != nil
	m.mu.Unlock()
	if !bound {
		return
	}
	for i, c := range m.conns {
		if !c.up.Load() {
			continue
		}
		if err := m.bindConn(ctx, i); err != nil {
			m.lost(i, err)
		}
	}
}

func (m *MultiTransport) bindConn(ctx context.Context, i int) error {
	c := m.conns[i]
	if rd, ok := c.tr.(Redialer); ok {
		if err := rd.Connect(ctx); err != nil {
			return err
		}
	}
	m.mu.Lock()
	bind := m.bind
	m.mu.Unlock()
	gen := generation(c.tr)
	if bind != nil {
		if err := bind(ctx, i, c.tr); err != nil {
			return &bindError{err: err}
		}
	}
	c.gen.Store(gen)
	m.setUp(c)
	return nil
}

// bindError is a BindFunc's failure.
type bindError struct{ err error }

func (e *bindError) Error() string { return "bind: " + e.err.Error() }
func (e *bindError) Unwrap() error { return e.err }

// refused reports whether err is a bind the server answered and refused
// (not a connection that broke or a reply that did not come).
func refused(err error) bool {
	var be *bindError
	return errors.As(err, &be) && !errors.Is(err, ErrConnection) && !errors.Is(err, ErrTimeout) &&
		!errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}

func generation(tr Transport) uint64 {
	if rd, ok := tr.(Redialer); ok {
		return rd.Generation()
	}
	return 0
}

func (m *MultiTransport) setUp(c *multiConn) {
	c.up.Store(true)
	m.mu.Lock()
	close(m.changed)
	m.changed = make(chan struct{})
	m.mu.Unlock()
}

// lost takes connection i out of service and redials and binds it in
// the background.
func (m *MultiTransport) lost(i int, err error) {
	c := m.conns[i]
	if c.up.Swap(false) {
		c.failures.Add(1)
		s := err.Error()
		c.lastErr.Store(&s)
		if m.opts.OnEvent != nil {
			m.opts.OnEvent(i, "lost", err)
		}
	}
	if !c.reviving.CompareAndSwap(false, true) {
		return
	}
	go m.revive(i)
}

func (m *MultiTransport) revive(i int) {
	c := m.conns[i]
	for {
		m.redial(i)
		c.reviving.Store(false)
		// Lost again between coming up and the line above? Then that
		// lost saw a revival running and left the connection to it:
		// go round again.
		if c.up.Load() || m.ctx.Err() != nil || !c.reviving.CompareAndSwap(false, true) {
			return
		}
	}
}

// redial makes connection i again and binds it, until it is up or the
// MultiTransport is closed.
func (m *MultiTransport) redial(i int) {
	c := m.conns[i]
	for attempt := 0; ; attempt++ {
		// Not at once: a server that is restarting may take the
		// connection and answer nothing on it for a while (a forwarder
		// in front of it, an RDMA handshake). Each attempt is bounded
		// by a timeout that grows from 2 s to BindTimeout, so that a
		// dial that hangs is given up and made again.
		if wait.Sleep(m.ctx, min(backoff(attempt), 5*time.Second)) != nil {
			return
		}
		ctx, cancel := context.WithTimeout(m.ctx, min(2*time.Second<<min(attempt, 5), m.opts.BindTimeout))
		err := m.bindConn(ctx, i)
		cancel()
		if refused(err) {
			// The server answered on the new connection and refused
			// the bind: an NFSv4.1 server that restarted has lost the
			// session (NFS4ERR_BADSESSION). The connection carries
			// calls anyway; their SEQUENCE finds the session gone and
			// the client's recovery makes a new one and binds every
			// connection to it again (Rebind). Were it kept out, a
			// MultiTransport whose connections all broke would wait
			// for ever for one the session it lost would accept.
			if m.opts.OnEvent != nil {
				m.opts.OnEvent(i, "bind refused, in use unbound", err)
			}
			s := err.Error()
			c.lastErr.Store(&s)
			c.gen.Store(generation(c.tr))
			c.reconnects.Add(1)
			m.setUp(c)
			return
		}
		if err == nil {
			c.reconnects.Add(1)
			if m.opts.OnEvent != nil {
				m.opts.OnEvent(i, "bound", nil)
			}
			return
		}
		if m.opts.OnEvent != nil {
			m.opts.OnEvent(i, "redial", err)
		}
	}
}

// pick returns the next usable connection in round robin, waiting for
// one while none is.
func (m *MultiTransport) pick(ctx context.Context, avoid int) (int, error) {
	n := uint32(len(m.conns))
	for {
		m.mu.Lock()
		closed, changed := m.closed, m.changed
		m.mu.Unlock()
		if closed {
			return 0, ErrClosed
		}
		start := m.next.Add(1)
		fallback := -1
		for k := range n {
			i := int((start + k) % n)
			if !m.conns[i].up.Load() {
				continue
			}
			if i != avoid {
				return i, nil
			}
			fallback = i
		}
		if fallback >= 0 {
			return fallback, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return 0, fmt.Errorf("%w: no connection up: %w", ErrConnection, context.Cause(ctx))
		}
	}
}

// RoundTrip sends call on the next connection, and again on another one
// if that one breaks before the reply.
func (m *MultiTransport) RoundTrip(ctx context.Context, call *Call) (*Reply, error) {
	m.mu.Lock()
	bound := m.bind != nil
	m.mu.Unlock()
	if !bound {
		// Before Bind: the first connection only, as a single transport.
		return m.send(ctx, 0, call)
	}
	avoid := -1
	for attempt := 0; ; attempt++ {
		i, err := m.pick(ctx, avoid)
		if err != nil {
			return nil, err
		}
		c := m.conns[i]
		if attempt > 0 {
			c.resent.Add(1)
		}
		rep, err := m.send(ctx, i, call)
		if err == nil {
			if g := generation(c.tr); g != c.gen.Load() {
				// The connection was replaced under the call (it broke
				// while idle and the transport redialled it): bind the
				// new one before the next call.
				m.lost(i, fmt.Errorf("%w: connection %d replaced", ErrConnection, i))
			}
			return rep, nil
		}
		if errors.Is(context.Cause(ctx), ErrNoReply) {
			// The transport broke the connection so that the
			// retransmission goes over another (RFC 8881 s2.9.2).
			m.lost(i, context.Cause(ctx))
			return nil, err
		}
		if !errors.Is(err, ErrConnection) || ctx.Err() != nil {
			return nil, err
		}
		m.lost(i, err)
		// RFC 8881 s2.10.6.2: a request whose connection was lost may
		// be retried on another connection of the session.
		if attempt+1 >= len(m.conns) {
			return nil, err
		}
		avoid = i
	}
}

func (m *MultiTransport) send(ctx context.Context, i int, call *Call) (*Reply, error) {
	c := m.conns[i]
	c.calls.Add(1)
	c.bytesOut.Add(uint64(call.Len()))
	rep, err := c.tr.RoundTrip(ctx, call)
	if err == nil {
		c.bytesIn.Add(uint64(len(rep.Msg) + rep.BulkLen))
	}
	return rep, err
}

// ConnStats are one connection's counters.
type ConnStats struct {
	Up         bool   // bound and carrying calls
	Calls      uint64 // calls sent on it, resent ones included
	BytesSent  uint64 // call bytes, as encoded over TCP
	BytesRecv  uint64 // reply bytes, placed bulk data included
	Resent     uint64 // calls sent on it after their first connection broke
	Failures   uint64 // times it was lost
	Reconnects uint64 // times it was redialled and bound again
	LastError  string // why it was last lost
}

// Stats returns each connection's counters.
func (m *MultiTransport) Stats() []ConnStats {
	out := make([]ConnStats, len(m.conns))
	for i, c := range m.conns {
		s := ConnStats{Up: c.up.Load(), Calls: c.calls.Load(), BytesSent: c.bytesOut.Load(),
			BytesRecv: c.bytesIn.Load(), Resent: c.resent.Load(), Failures: c.failures.Load(),
			Reconnects: c.reconnects.Load()}
		if i == 0 {
			m.mu.Lock()
			if m.bind == nil {
				s.Up = true // the only connection in use before Bind
			}
			m.mu.Unlock()
		}
		if p := c.lastErr.Load(); p != nil {
			s.LastError = *p
		}
		out[i] = s
	}
	return out
}
