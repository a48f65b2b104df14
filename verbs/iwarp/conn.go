// Package iwarp is the pure-Go iWARP provider of package verbs: MPA
// (RFC 5044, enhanced connection setup of RFC 6581), DDP (RFC 5041) and
// RDMAP (RFC 5040) over a TCP connection. It needs no RDMA hardware and
// interoperates with Linux soft-iWARP (siw).
//
// Tagged data (RDMA Write, Read Response) is placed after the STag, access
// rights and bounds have been checked; a violation sends a Terminate and
// breaks the queue pair. The region stays busy while its data is placed
// or read for a Read Response, so an invalidation waits for the transfer
// (verbs.ProtectionDomain.BeginAccess), and stops it when it waits for the
// peer: the rest never lands or leaves, and the queue pair breaks.
// Payloads of 16 KiB and more are read from the socket straight into
// place, and the stream then stays unbuffered while the peer keeps sending
// large FPDUs; small FPDUs (Linux siw sends one per TCP segment) go through
// a buffered reader, a copy that QP.CopiedBytes counts. A work request
// posted on an idle send queue is written by the posting goroutine itself,
// with a write that does not wait (the provider's tx goroutine finishes
// what the socket does not take); queued work requests go out in batches
// of up to 32 FPDUs per vectored write. With a receive handler
// (QP.SetRecvHandler), receive completions are handed over in the
// receiving goroutine instead of through the receive completion queue.
// Having completed a work request, the receiving goroutine yields before
// it reads the socket again, so that the goroutine the completion woke
// runs at once; it answers zero-length RDMA Reads (a requester's fence)
// itself when the writer is free.
//
//	qp, err := iwarp.Dial(ctx, "127.0.0.1:20049", &verbs.ConnParams{CRC: true, PrivateData: pd})
package iwarp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rdmafs/rdmafs/verbs"
)

var (
	aLongTimeAgo = time.Unix(1, 0)
	noDeadline   time.Time
)

// defaultHandshakeTimeout bounds the passive side's MPA exchange.
const defaultHandshakeTimeout = 30 * time.Second

// maxPendingConns bounds the connections a Listener holds that are not
// yet accepted (in the MPA exchange, or established and waiting for
// Accept): each holds goroutines and buffers, and a peer that opens
// connections and stays silent must not make them grow without limit
// (RFC 5042 s6.4). Further connections are closed at once.
const maxPendingConns = 64

// params are ConnParams with defaults applied.
type params struct {
	pd        *verbs.ProtectionDomain
	scq, rcq  *verbs.SoftCQ
	err       error // a parameter this provider cannot use
	pdata     []byte
	ird, ord  int
	crc       bool
	maxULPDU  int
	onConnect func(*verbs.ConnRequest) ([]byte, error)
	setup     func(verbs.QueuePair) error
}

func newParams(p *verbs.ConnParams) *params {
	if p == nil {
		p = &verbs.ConnParams{}
	}
	r := &params{pd: p.PD, pdata: p.PrivateData, ird: p.IRD, ord: p.ORD,
		crc: p.CRC, maxULPDU: p.MaxSegment, onConnect: p.OnConnect, setup: p.Setup}
	if p.PD != nil && TableOf(p.PD) == nil {
		r.err = fmt.Errorf("iwarp: protection domain not made by this provider (iwarp.NewProtectionDomain): %w", verbs.ErrInvalidWR)
	}
	for _, cq := range []struct {
		in  verbs.CompletionQueue
		out **verbs.SoftCQ
	}{{p.SendCQ, &r.scq}, {p.RecvCQ, &r.rcq}} {
		if cq.in == nil {
			continue
		}
		soft, ok := cq.in.(*verbs.SoftCQ)
		if !ok {
			r.err = fmt.Errorf("iwarp: completion queue %T is not the provider's (*verbs.SoftCQ): %w", cq.in, verbs.ErrInvalidWR)
		}
		*cq.out = soft
	}
	if r.ird <= 0 {
		r.ird = defaultDepth
	}
	if r.ord <= 0 {
		r.ord = defaultDepth
	}
	r.ird, r.ord = clampDepth(r.ird), clampDepth(r.ord)
	if r.maxULPDU <= 0 || r.maxULPDU > defaultMaxULPDU {
		r.maxULPDU = defaultMaxULPDU
	}
	r.maxULPDU = max(r.maxULPDU, minMaxULPDU)
	return r
}

// Provider is the iWARP verbs.Provider. The zero value is ready to use.
type Provider struct {
	// DialConn, if set, replaces net.Dialer for the TCP connection
	// (tests inject faults with it).
	DialConn func(ctx context.Context, addr string) (net.Conn, error)
}

var _ verbs.Provider = (*Provider)(nil)

// Dial implements verbs.Provider.
func (pv *Provider) Dial(ctx context.Context, addr string, p *verbs.ConnParams) (verbs.QueuePair, error) {
	var conn net.Conn
	var err error
	if pv != nil && pv.DialConn != nil {
		conn, err = pv.DialConn(ctx, addr)
	} else {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("iwarp: dial %s: %w", addr, err)
	}
	qp, err := Connect(ctx, conn, p)
	if err != nil {
		return nil, err // not a nil *QP in a non-nil interface
	}
	return qp, nil
}

// Listen implements verbs.Provider.
func (pv *Provider) Listen(addr string, p *verbs.ConnParams) (verbs.Listener, error) {
	l, err := Listen(addr, p)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Dial connects to addr over TCP and runs the MPA exchange as initiator.
func Dial(ctx context.Context, addr string, p *verbs.ConnParams) (*QP, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("iwarp: dial %s: %w", addr, err)
	}
	return Connect(ctx, conn, p)
}

// Connect runs the MPA exchange as initiator on an established
// connection and returns the queue pair. On error conn is closed.
func Connect(ctx context.Context, conn net.Conn, p *verbs.ConnParams) (*QP, error) {
	pp := newParams(p)
	if pp.err != nil {
		_ = conn.Close()
		return nil, pp.err
	}
	br := bufio.NewReaderSize(conn, mpaReaderSize)
	n, err := mpaInitiate(ctx, conn, br, pp)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("iwarp: connect to %s: %w", conn.RemoteAddr(), err)
	}
	qp := newQP(conn, br, n, pp)
	if pp.setup != nil {
		if err := pp.setup(qp); err != nil {
			qp.abort(fmt.Errorf("iwarp: queue pair setup: %w", err))
			return nil, fmt.Errorf("iwarp: connect to %s: queue pair setup: %w", conn.RemoteAddr(), err)
		}
	}
	qp.start()
	return qp, nil
}

// Listener is the passive side of the iWARP provider. It implements
// verbs.Listener.
type Listener struct {
	ln      net.Listener
	p       *params
	ready   chan *QP
	done    chan struct{}
	pending chan struct{} // a slot per connection not yet accepted
	once    sync.Once
	wg      sync.WaitGroup
}

var _ verbs.Listener = (*Listener)(nil)

// Listen listens on a TCP address; Accept returns connected queue pairs.
func Listen(addr string, p *verbs.ConnParams) (*Listener, error) {
	if err := newParams(p).err; err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("iwarp: listen %s: %w", addr, err)
	}
	return NewListener(ln, p), nil
}

// NewListener serves MPA on an existing net.Listener.
func NewListener(ln net.Listener, p *verbs.ConnParams) *Listener {
	l := &Listener{ln: ln, p: newParams(p), ready: make(chan *QP), done: make(chan struct{}),
		pending: make(chan struct{}, maxPendingConns)}
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select {
			case <-l.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		select {
		case l.pending <- struct{}{}:
		default:
			_ = conn.Close() // too many connections not yet accepted
			continue
		}
		l.wg.Add(1)
		go l.handshake(conn)
	}
}

func (l *Listener) handshake(conn net.Conn) {
	defer l.wg.Done()
	defer func() { <-l.pending }()
	ctx, cancel := context.WithTimeout(context.Background(), defaultHandshakeTimeout)
	defer cancel()
	go func() {
		select {
		case <-l.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	br := bufio.NewReaderSize(conn, mpaReaderSize)
	var qp *QP
	_, err := mpaRespond(ctx, conn, br, l.p, func(n negotiated) error {
		// Like rdma_accept after ibv_post_recv: the queue pair
		// exists and Setup has posted receives before the Reply
		// lets the initiator send.
		qp = newQP(conn, br, n, l.p)
		if l.p.setup == nil {
			return nil
		}
		return l.p.setup(qp)
	})
	if err != nil {
		// The initiator sees the reject frame or the closed
		// connection; the listener goes on.
		if qp != nil {
			qp.abort(fmt.Errorf("iwarp: accept: %w", err))
		}
		_ = conn.Close()
		return
	}
	qp.start()
	select {
	case l.ready <- qp:
	case <-l.done:
		_ = qp.Close()
	}
}

// Accept implements verbs.Listener.
func (l *Listener) Accept(ctx context.Context) (verbs.QueuePair, error) {
	select {
	case qp := <-l.ready:
		return qp, nil
	case <-l.done:
		return nil, fmt.Errorf("iwarp: accept: %w", verbs.ErrClosed)
	case <-ctx.Done():
		return nil, fmt.Errorf("iwarp: accept: %w", ctx.Err())
	}
}

// AcceptQP is Accept returning the concrete type.
func (l *Listener) AcceptQP(ctx context.Context) (*QP, error) {
	qp, err := l.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return qp.(*QP), nil
}

// Addr implements verbs.Listener.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Close implements verbs.Listener. Queue pairs not yet accepted are closed.
func (l *Listener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = l.ln.Close()
		l.wg.Wait()
	})
	return err
}
