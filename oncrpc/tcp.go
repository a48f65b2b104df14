package oncrpc

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// TCPOptions configure a TCPTransport.
type TCPOptions struct {
	// Dial makes the connection; nil means a net.Dialer, or
	// DialResvPort with ResvPort. Tests wrap the connection here to
	// inject faults.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// ResvPort, when Dial is nil, connects from a reserved source port
	// (DialResvPort; nfs(5) resvport), as a server's "secure" export
	// requires. It needs root.
	ResvPort bool
	// MaxRecord bounds the size of a received record; a larger one is a
	// protocol error that closes the connection. Zero means 64 MiB.
	MaxRecord int
	// MaxFragment bounds the size of a sent record fragment. Zero means
	// one fragment per record (up to the 2^31-1 byte limit).
	MaxFragment int
	// DialTimeout bounds one connection attempt. Zero means 30 s.
	DialTimeout time.Duration
	// OnConnect, if set, is called after each new connection is made,
	// with a count of the connections made so far (1 for the first).
	OnConnect func(generation uint64)
}

// lastFragment is the record-marking bit of the last fragment of a record
// (RFC 5531 s11).
const lastFragment = 1 << 31

const maxFragmentLen = 1<<31 - 1

// TCPTransport carries RPC messages over one TCP connection with record
// marking (RFC 5531 s11). It redials after the connection breaks; calls in
// flight on the broken connection fail with an error wrapping
// ErrConnection, and Client.Do sends them again.
type TCPTransport struct {
	addr string
	opts TCPOptions

	mu     sync.Mutex // guards conn, closed; held while dialing
	conn   *tcpConn
	closed bool
	gen    uint64

	handler  atomic.Pointer[CallHandler]
	bwLimits backwardLimits // backward calls: how many at once, how large (tcpback.go)
}

// NewTCPTransport returns a transport to addr ("host:port"). It connects
// on the first call.
func NewTCPTransport(addr string, opts TCPOptions) *TCPTransport {
	if opts.MaxRecord <= 0 {
		opts.MaxRecord = 64 << 20
	}
	if opts.MaxFragment <= 0 || opts.MaxFragment > maxFragmentLen {
		opts.MaxFragment = maxFragmentLen
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 30 * time.Second
	}
	switch {
	case opts.Dial != nil:
	case opts.ResvPort:
		opts.Dial = DialResvPort
	default:
		var d net.Dialer
		opts.Dial = d.DialContext
	}
	return &TCPTransport{addr: addr, opts: opts}
}

// SetCallHandler registers the handler for backward-direction calls.
func (t *TCPTransport) SetCallHandler(h CallHandler) { t.handler.Store(&h) }

// Connect makes the connection now instead of on the first call.
func (t *TCPTransport) Connect(ctx context.Context) error {
	_, err := t.connection(ctx)
	return err
}

// Generation counts the connections made so far (1 for the first).
func (t *TCPTransport) Generation() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.gen
}

// Close closes the connection and fails calls in flight with ErrClosed.
func (t *TCPTransport) Close() error {
	t.mu.Lock()
	t.closed = true
	c := t.conn
	t.conn = nil
	t.mu.Unlock()
	if c != nil {
		c.fail(ErrClosed)
	}
	return nil
}

// Abort breaks the current connection as a network failure would, so
// that calls in flight fail with ErrConnection and the next call redials.
func (t *TCPTransport) Abort() {
	t.mu.Lock()
	c := t.conn
	t.mu.Unlock()
	if c != nil {
		c.fail(fmt.Errorf("%w: aborted", ErrConnection))
	}
}

func (t *TCPTransport) connection(ctx context.Context) (*tcpConn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	if t.conn != nil && !t.conn.isDead() {
		return t.conn, nil
	}
	dctx, cancel := context.WithTimeout(ctx, t.opts.DialTimeout)
	defer cancel()
	nc, err := t.opts.Dial(dctx, "tcp", t.addr)
	if err != nil {
		return nil, fmt.Errorf("%w: dial %s: %w", ErrConnection, t.addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c := &tcpConn{
		t:       t,
		nc:      nc,
		pending: make(map[uint32]chan tcpResult),
		dead:    make(chan struct{}),
	}
	t.conn = c
	t.gen++
	go c.readLoop()
	if t.opts.OnConnect != nil {
		t.opts.OnConnect(t.gen)
	}
	return c, nil
}

// RoundTrip sends call and waits for its reply.
func (t *TCPTransport) RoundTrip(ctx context.Context, call *Call) (*Reply, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := t.connection(ctx)
	if err != nil {
		return nil, err
	}
	ch := make(chan tcpResult, 1)
	if err := c.register(call.XID, ch); err != nil {
		return nil, err
	}
	if err := c.send(ctx, call); err != nil {
		c.unregister(call.XID)
		return nil, err
	}
	select {
	case r := <-ch:
		return r.rep, r.err
	case <-ctx.Done():
		c.unregister(call.XID)
		// A reply may have raced with the cancellation; free it.
		select {
		case r := <-ch:
			r.rep.Release()
		default:
		}
		if errors.Is(context.Cause(ctx), ErrNoReply) {
			// The retransmission must go over a new connection
			// (ErrNoReply); the other calls on this one are sent again
			// there too, as Linux does after a major timeout.
			c.fail(fmt.Errorf("%w: no reply to XID %#x: reconnecting", ErrConnection, call.XID))
		}
		return nil, ctx.Err()
	}
}

type tcpResult struct {
	rep *Reply
	err error
}

// tcpConn is one connection: a reader goroutine that owns the receive
// side, and a write lock that keeps records whole on the send side.
type tcpConn struct {
	t  *TCPTransport
	nc net.Conn

	writeMu sync.Mutex

	mu      sync.Mutex
	pending map[uint32]chan tcpResult
	err     error // set once when the connection dies
	dead    chan struct{}

	bw backwardGate // backward calls being served (tcpback.go)
}

func (c *tcpConn) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

func (c *tcpConn) register(xid uint32, ch chan tcpResult) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	c.pending[xid] = ch
	return nil
}

func (c *tcpConn) unregister(xid uint32) {
	c.mu.Lock()
	delete(c.pending, xid)
	c.mu.Unlock()
}

// fail kills the connection and completes every pending call with err.
func (c *tcpConn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	pending := c.pending
	c.pending = nil
	close(c.dead)
	c.mu.Unlock()
	c.nc.Close()
	for _, ch := range pending {
		ch <- tcpResult{err: err}
	}
}

// send writes call as one record, in fragments of at most MaxFragment
// bytes, with one vectored write.
func (c *tcpConn) send(ctx context.Context, call *Call) error {
	var pad [4]byte
	bulk := call.Bulk.Bytes()
	parts := [4][]byte{call.Head, bulk, pad[:(4-len(bulk)&3)&3], call.Tail}
	if call.Bulk.IsZero() {
		parts[2] = nil
	}
	return c.writeRecord(ctx, parts[:])
}

func (c *tcpConn) writeRecord(ctx context.Context, parts [][]byte) error {
	total := 0
	for _, p := range parts {
		total += len(p)
	}
	maxFrag := c.t.opts.MaxFragment
	nfrag := max(1, (total+maxFrag-1)/maxFrag)
	hdrs := make([]byte, 4*nfrag)
	bufs := make(net.Buffers, 0, len(parts)+2*nfrag)
	left, fi := total, 0
	// startFragment appends the next fragment header and returns the
	// number of record bytes that fragment holds.
	startFragment := func() int {
		n := min(left, maxFrag)
		left -= n
		w := uint32(n)
		if left == 0 {
			w |= lastFragment
		}
		h := hdrs[4*fi : 4*fi+4]
		binary.BigEndian.PutUint32(h, w)
		bufs = append(bufs, h)
		fi++
		return n
	}
	room := startFragment()
	for _, p := range parts {
		for len(p) > 0 {
			if room == 0 {
				room = startFragment()
			}
			n := min(len(p), room)
			bufs = append(bufs, p[:n])
			p = p[n:]
			room -= n
		}
	}

	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if c.isDead() {
		return c.deadErr()
	}
	stop := context.AfterFunc(ctx, func() { c.nc.SetWriteDeadline(time.Unix(1, 0)) })
	_, err := bufs.WriteTo(c.nc)
	if !stop() {
		// The deadline may have been set; a record may be half written,
		// so the stream is unusable either way when err != nil.
		c.nc.SetWriteDeadline(time.Time{})
	}
	if err != nil {
		err = fmt.Errorf("%w: write to %s: %w", ErrConnection, c.t.addr, err)
		c.fail(err)
		return err
	}
	return nil
}

func (c *tcpConn) deadErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *tcpConn) readLoop() {
	br := bufio.NewReaderSize(c.nc, 64<<10)
	for {
		_, maxCall := c.t.bwLimits.get()
		msg, size, err := readRecord(br, c.t.opts.MaxRecord, maxCall)
		if err != nil {
			if errors.Is(err, errRecordTooLarge) {
				c.fail(fmt.Errorf("%w: %s: %w", ErrConnection, c.t.addr, err))
			} else {
				c.fail(fmt.Errorf("%w: read from %s: %w", ErrConnection, c.t.addr, err))
			}
			return
		}
		mt, ok := MessageType(msg.buf)
		if !ok {
			putBuffer(msg)
			continue // too short to be RPC; nothing to match it to
		}
		if mt == MsgCall {
			if !c.serveBackward(msg, size) {
				return // the connection died while the call waited
			}
			continue
		}
		xid := binary.BigEndian.Uint32(msg.buf)
		c.mu.Lock()
		ch := c.pending[xid]
		delete(c.pending, xid)
		c.mu.Unlock()
		if ch == nil {
			putBuffer(msg) // a reply for a call that gave up
			continue
		}
		ch <- tcpResult{rep: &Reply{Msg: msg.buf, release: func() { putBuffer(msg) }}}
	}
}

var errRecordTooLarge = errors.New("record too large")
