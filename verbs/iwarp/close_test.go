package iwarp

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

// gateConn holds writes while armed: a held Write blocks until release
// or Close. It records whether Close came while a write was held.
type gateConn struct {
	net.Conn
	mu       sync.Mutex
	armed    bool
	open     chan struct{} // closed by release or Close
	held     chan struct{} // closed when a write is first held
	heldOnce sync.Once
	pending  int  // writes held now
	cutUnder bool // Close came while a write was held
	closed   bool
}

func newGateConn(c net.Conn) *gateConn {
	return &gateConn{Conn: c, open: make(chan struct{}), held: make(chan struct{})}
}

func (g *gateConn) arm() {
	g.mu.Lock()
	g.armed = true
	g.mu.Unlock()
}

func (g *gateConn) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.armed {
		g.armed = false
		close(g.open)
	}
}

func (g *gateConn) Write(b []byte) (int, error) {
	g.mu.Lock()
	if g.armed {
		g.pending++
		g.mu.Unlock()
		g.heldOnce.Do(func() { close(g.held) })
		<-g.open
		g.mu.Lock()
		g.pending--
		closed := g.closed
		g.mu.Unlock()
		if closed {
			return 0, net.ErrClosed
		}
		return g.Conn.Write(b)
	}
	g.mu.Unlock()
	return g.Conn.Write(b)
}

func (g *gateConn) CloseWrite() error {
	if cw, ok := g.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (g *gateConn) Close() error {
	g.mu.Lock()
	if g.pending > 0 {
		g.cutUnder = true
	}
	g.closed = true
	if g.armed {
		g.armed = false
		close(g.open)
	}
	g.mu.Unlock()
	return g.Conn.Close()
}

// TestCloseLetsTerminateOut: a queue pair closed while it is writing a
// Terminate (here for an RDMA Write to an STag it never offered) lets the
// Terminate out before it closes the connection, so the peer learns why
// the stream ends (RFC 5040 s5.3) instead of finding it cut.
func TestCloseLetsTerminateOut(t *testing.T) {
	var gc *gateConn
	pv := &Provider{DialConn: func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		gc = newGateConn(conn)
		return gc, nil
	}}
	c, s := pairWith(t, pv, nil, nil)
	gc.arm()
	// The server writes to an STag the client never offered: the
	// client's Terminate is held at its connection.
	if err := s.PostSend(verbs.SendWR{WRID: 1, Opcode: verbs.OpRDMAWrite, SGL: gather(t, s.PD(), make([]byte, 16)), RemoteSTag: 0x00dead01}); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	wait(ctx, t, gc.held, "the Terminate write")
	closed := make(chan struct{})
	go func() {
		c.Close()
		close(closed)
	}()
	wait(ctx, t, c.closing, "Close")
	gc.release()
	wait(ctx, t, closed, "Close to return")
	gc.mu.Lock()
	cut := gc.cutUnder
	gc.mu.Unlock()
	if cut {
		t.Fatal("Close closed the connection under the Terminate write")
	}
	wait(ctx, t, s.Done(), "the server's queue pair to fail")
	var te *TerminateError
	if err := s.Err(); !errors.As(err, &te) || te.Sent || te.Layer != LayerDDP || te.EType != DDPEtypeTaggedBuf || te.Code != DDPCodeTInvalidSTag {
		t.Fatalf("server: %v; want the client's Terminate for an invalid STag", err)
	}
}
