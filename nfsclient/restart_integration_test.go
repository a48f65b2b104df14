package nfsclient

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/test/testpeer"
)

// Server restart recovery (RFC 8881 s8.4.2): the server restarts while a
// client has a file open, locked and unstable writes in flight; the
// client reclaims the open and the lock in the grace period, resends the
// writes the new write verifier says may be lost, and the application's
// calls go on without an error.

// dialHard is dial with a hard mount's RPC options, rdmafs's default: a
// soft client gives up after a few refused connections while the server
// restarts (oncrpc counts each as a transmission).
func dialHard(t *testing.T, p peer, topts oncrpc.TCPOptions) *Client {
	t.Helper()
	c, err := Dial(testCtx(t), Config{Transport: p.transport(topts), Tracer: testTracer(), Export: p.export,
		RPC: oncrpc.ClientOptions{Timeout: 30 * time.Second, Hard: true}})
	if err != nil {
		t.Fatalf("%s: dial: %v", p.name, err)
	}
	t.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("%s: close: %v", p.name, err)
		}
	})
	return c
}

// restartRecovery runs the scenario against p; restart restarts the
// server; observer reaches the same server over TCP for a second client.
func restartRecovery(t *testing.T, p, observer peer, restart func(context.Context) error) {
	ctx := testCtx(t)
	a := dialHard(t, p, oncrpc.TCPOptions{})
	b := dialHard(t, observer, oncrpc.TCPOptions{})
	dir := testDir(t, a)
	of, err := a.Open(ctx, rootCred, dir, "f", OpenArgs{Access: ShareAccessBoth, Create: Guarded, Attr: &SetAttr{Mode: ptr(uint32(0o666))}})
	if err != nil {
		t.Fatal(err)
	}
	l := a.NewLocker(of, 1)
	if _, err := a.Lock(ctx, rootCred, l, WriteLT, 0, 100); err != nil {
		t.Fatalf("%s: LOCK: %v", p.name, err)
	}
	if _, err := a.Lock(ctx, rootCred, l, ReadLT, 1000, 10); err != nil {
		t.Fatalf("%s: LOCK: %v", p.name, err)
	}
	data := pattern(8<<20, 42)
	half := len(data) / 2
	w := a.NewUnstableWriter(rootCred, of, 4)
	if err := w.WriteAt(ctx, oncrpc.Plain(bytes.Clone(data[:half])), 0, nil); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	pending := w.Pending()
	// The second half is written while the server restarts.
	var wg sync.WaitGroup
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		if werr = w.WriteAt(ctx, oncrpc.Plain(bytes.Clone(data[half:])), uint64(half), nil); werr == nil {
			werr = w.Flush()
		}
	}()
	if err := restart(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if werr != nil {
		t.Fatalf("%s: write across the restart: %v", p.name, werr)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatalf("%s: commit after the restart: %v", p.name, err)
	}
	rs := a.Recovery()
	t.Logf("%s: uncommitted before the restart %d bytes, resent %d writes; recovery %+v", p.name, pending, w.Resent(), rs)
	if rs.Recoveries == 0 || rs.ReclaimedOpens != 1 || rs.ReclaimedLocks != 2 || rs.LostOpens != 0 {
		t.Errorf("%s: recovery counters %+v, want a recovery reclaiming 1 open and 2 locks", p.name, rs)
	}
	if pending > 0 && w.Resent() == 0 {
		t.Errorf("%s: %d uncommitted bytes before the restart were not resent after the verifier changed", p.name, pending)
	}
	if got := readAll(ctx, t, a, of, len(data)); !bytes.Equal(got, data) {
		t.Fatalf("%s: read back %d bytes that differ from the %d written", p.name, len(got), len(data))
	}

	// The lock is still held: a second client is refused.
	bo, err := b.OpenFH(ctx, rootCred, of.FH, ShareAccessBoth, ShareDenyNone)
	if err != nil {
		t.Fatalf("%s: second client's open: %v", p.name, err)
	}
	lb := b.NewLocker(bo, 1)
	dn, err := b.TestLock(ctx, rootCred, lb, WriteLT, 50, 1)
	if err != nil || dn == nil || dn.Offset != 0 || dn.Length != 100 || dn.Type != WriteLT {
		t.Errorf("%s: LOCKT from another client after the restart: %+v %v, want the reclaimed [0,+100) write lock", p.name, dn, err)
	}
	if _, err := b.Lock(ctx, rootCred, lb, ReadLT, 1005, 1); err != nil {
		t.Errorf("%s: read lock over the reclaimed read lock: %v", p.name, err)
	}
	if _, err := b.Lock(ctx, rootCred, lb, WriteLT, 1005, 1); !errors.Is(err, ErrDenied) {
		t.Errorf("%s: write lock over the reclaimed read lock: %v, want NFS4ERR_DENIED", p.name, err)
	}
	if err := b.Unlock(ctx, rootCred, lb, 0, LengthToEOF); err != nil {
		t.Errorf("%s: second client's LOCKU: %v", p.name, err)
	}
	if err := b.CloseFile(ctx, rootCred, bo); err != nil {
		t.Errorf("%s: second client's close: %v", p.name, err)
	}
	if err := a.Unlock(ctx, rootCred, l, 0, LengthToEOF); err != nil {
		t.Errorf("%s: LOCKU with the reclaimed lock stateid: %v", p.name, err)
	}
	if err := a.CloseFile(ctx, rootCred, of); err != nil {
		t.Errorf("%s: CLOSE with the reclaimed open stateid: %v", p.name, err)
	}
}

// TestKnfsdRestartRecovery restarts knfsd (kpeer-restart-nfsd) under a
// client on TCP and one on RPC-over-RDMA.
func TestKnfsdRestartRecovery(t *testing.T) {
	k := testpeer.RequireKnfsd(t)
	tcp := peer{name: "knfsd", addr: k.TCPAddr, export: "/", knfsd: k}
	t.Run("tcp", func(t *testing.T) { restartRecovery(t, tcp, tcp, k.Restart) })
	t.Run("rdma", func(t *testing.T) {
		p := peer{name: "knfsd-rdma", addr: k.RDMAAddr, export: "/", knfsd: k, rdma: true}
		restartRecovery(t, p, tcp, k.Restart)
	})
}

// graceGanesha starts a ganesha of the test's own that keeps a grace
// period (not Graceless, RecoveryBackend fs), so that it can restart.
func graceGanesha(t *testing.T) *testpeer.Ganesha {
	t.Helper()
	g, err := testpeer.StartGaneshaWith(testCtx(t), testpeer.GaneshaOptions{Grace: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Stop(); err != nil {
			t.Error(err)
		}
	})
	return g
}

// TestGaneshaRestartRecovery restarts ganesha.nfsd under a client.
func TestGaneshaRestartRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: needs NFS-Ganesha; skipped in -short mode")
	}
	g := graceGanesha(t)
	p := peer{name: "ganesha", addr: g.Addr, export: g.Export}
	restartRecovery(t, p, p, g.Restart)
}

// gatedDialer holds new connections back while closed, so that a test
// decides when a client reaches a restarted server.
type gatedDialer struct {
	mu   sync.Mutex
	open chan struct{}
}

func newGatedDialer() *gatedDialer {
	g := &gatedDialer{open: make(chan struct{})}
	close(g.open)
	return g
}

func (g *gatedDialer) close() {
	g.mu.Lock()
	g.open = make(chan struct{})
	g.mu.Unlock()
}

func (g *gatedDialer) reopen() {
	g.mu.Lock()
	close(g.open)
	g.mu.Unlock()
}

func (g *gatedDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// TestKnfsdRestartReclaimRefused restarts knfsd and ends its grace period
// before the client gets back; another client takes a conflicting lock
// meanwhile. The reclaim is refused (NFS4ERR_NO_GRACE): the file's writes
// and reads fail with EIO, never silently, and the other client keeps its
// lock.
func TestKnfsdRestartReclaimRefused(t *testing.T) {
	k := testpeer.RequireKnfsd(t)
	p := peer{name: "knfsd", addr: k.TCPAddr, export: "/", knfsd: k}
	ctx := testCtx(t)
	gate := newGatedDialer()
	a := dialHard(t, p, oncrpc.TCPOptions{Dial: gate.dial})
	b := dialHard(t, p, oncrpc.TCPOptions{})
	dir := testDir(t, a)
	of, err := a.Open(ctx, rootCred, dir, "f", OpenArgs{Access: ShareAccessBoth, Create: Guarded, Attr: &SetAttr{Mode: ptr(uint32(0o666))}})
	if err != nil {
		t.Fatal(err)
	}
	l := a.NewLocker(of, 1)
	if _, err := a.Lock(ctx, rootCred, l, WriteLT, 0, LengthToEOF); err != nil {
		t.Fatal(err)
	}
	w := a.NewUnstableWriter(rootCred, of, 4)
	if err := w.WriteAt(ctx, oncrpc.Plain(pattern(1<<20, 3)), 0, nil); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}

	gate.close()
	if err := k.RestartEndGrace(ctx); err != nil {
		t.Fatal(err)
	}
	bo, err := b.OpenFH(ctx, rootCred, of.FH, ShareAccessBoth, ShareDenyNone)
	if err != nil {
		t.Fatalf("second client's open after the restart: %v", err)
	}
	lb := b.NewLocker(bo, 1)
	if _, err := b.Lock(ctx, rootCred, lb, WriteLT, 0, 10); err != nil {
		t.Fatalf("second client's lock after the grace period: %v", err)
	}
	gate.reopen()

	err = w.Commit(ctx)
	if !errors.Is(err, ErrStateLost) || Errno(err) != syscall.EIO {
		t.Errorf("commit of unstable writes after a refused reclaim: %v (errno %v), want ErrStateLost (EIO)", err, Errno(err))
	}
	if _, err := a.Write(ctx, rootCred, of.FH, of.StateID, 0, oncrpc.Plain([]byte("x")), FileSync); !errors.Is(err, ErrStateLost) {
		t.Errorf("write after a refused reclaim: %v, want ErrStateLost", err)
	}
	if _, _, err := a.Read(ctx, rootCred, of.FH, of.StateID, 0, oncrpc.Plain(make([]byte, 10))); !errors.Is(err, ErrStateLost) {
		t.Errorf("read after a refused reclaim: %v, want ErrStateLost", err)
	}
	if rs := a.Recovery(); rs.LostOpens != 1 || rs.ReclaimedOpens != 0 {
		t.Errorf("recovery counters %+v, want one lost open", rs)
	}
	if err := a.OpenLost(of); !errors.Is(err, ErrNoGrace) {
		t.Errorf("lost open's error %v, want NFS4ERR_NO_GRACE", err)
	}
	if _, err := a.Lock(ctx, rootCred, l, WriteLT, 0, 1); !errors.Is(err, ErrStateLost) {
		t.Errorf("lock after a refused reclaim: %v, want ErrStateLost", err)
	}
	w.Discard()
	if err := a.CloseFile(ctx, rootCred, of); err != nil {
		t.Errorf("close of a lost open: %v", err)
	}
	// The client goes on: new opens work.
	of2, err := a.OpenFH(ctx, rootCred, of.FH, ShareAccessRead, ShareDenyNone)
	if err != nil {
		t.Fatalf("open after recovery: %v", err)
	}
	a.CloseFile(ctx, rootCred, of2)
	if dn, err := b.TestLock(ctx, rootCred, lb, WriteLT, 0, 1); err != nil || dn != nil {
		t.Errorf("second client's own lock: %+v %v", dn, err)
	}
	b.Unlock(ctx, rootCred, lb, 0, LengthToEOF)
	b.CloseFile(ctx, rootCred, bo)
}
