package nfsclient

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/test/testpeer"
)

// TestCloseEndsRenewal closes a client while its lease renewal waits on a
// server that has gone silent: Close must end that SEQUENCE rather than
// wait out its deadline (a lease), and must not start another. rdmafs's
// SIGTERM after a lost server depends on it.
func TestCloseEndsRenewal(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: needs NFS-Ganesha; skipped in -short mode")
	}
	g, err := testpeer.StartGaneshaWith(testCtx(t), testpeer.GaneshaOptions{Lease: 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Stop(); err != nil {
			t.Error(err)
		}
	})
	var sent atomic.Int64
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{conn, &sent}, nil
	}
	var log lockedBuffer
	p := peer{name: "ganesha", addr: g.Addr, export: g.Export}
	c, err := Dial(testCtx(t), Config{Transport: p.transport(oncrpc.TCPOptions{Dial: dial}),
		Tracer: trace.New(&log, trace.NFS), Export: p.export,
		RPC: oncrpc.ClientOptions{Timeout: 30 * time.Second, Hard: true}})
	if err != nil {
		t.Fatal(err)
	}

	if err := g.Pause(); err != nil {
		t.Fatal(err)
	}
	defer g.Resume()
	// Make the next tick renew, and wait until its SEQUENCE is sent.
	before := sent.Load()
	c.lastRenew.Store(0)
	for sent.Load() == before {
		time.Sleep(10 * time.Millisecond)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := c.Close(ctx); err == nil {
		t.Error("Close against a silent server: no error")
	}
	out := log.String()
	if !strings.Contains(out, "lease renewal: context canceled") {
		t.Errorf("the renewal in flight did not end on Close; trace:\n%s", out)
	}
	if n := strings.Count(out, "lease renewal:"); n != 1 {
		t.Errorf("%d lease renewals, want 1; trace:\n%s", n, out)
	}
}

// countingConn counts the bytes written to a connection.
type countingConn struct {
	net.Conn
	sent *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.sent.Add(int64(n))
	return n, err
}
