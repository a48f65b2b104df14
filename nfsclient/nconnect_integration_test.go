package nfsclient

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/rpcrdma"
	"github.com/rdmafs/rdmafs/test/testpeer"
)

// multiTransport makes p.nconnect connections to p (2 to 16), spread by
// an oncrpc.MultiTransport. Over RPC-over-RDMA the others share the
// first one's registered memory (rpcrdma.Transport.Another).
func (p peer) multiTransport(topts oncrpc.TCPOptions) oncrpc.Transport {
	one := p
	one.nconnect = 0
	first := one.transport(topts)
	conns := []oncrpc.Transport{first}
	for len(conns) < p.nconnect {
		if rt, ok := first.(*rpcrdma.Transport); ok {
			conns = append(conns, rt.Another())
		} else {
			conns = append(conns, one.transport(topts))
		}
	}
	opts := oncrpc.MultiOptions{RDMA: p.rdma}
	if tr := testTracer(); tr != nil {
		opts.OnEvent = func(i int, event string, err error) {
			tr.Printf(trace.RPC, "nconnect: connection %d %s: %v", i, event, err)
		}
	}
	mt, err := oncrpc.NewMultiTransport(conns, opts)
	if err != nil {
		// Only a count outside 1..16 fails: the first connection then
		// stands alone, and the test's own checks of mt fail.
		return first
	}
	return mt
}

// TestNconnectWriteThroughCut writes 10 MiB over four connections bound
// to one session and cuts one of them (the first whose socket has
// written more than 1 MiB, on the client's side, in the middle of a
// record or iWARP frame) while the WRITEs are in flight. The cut
// connection's calls go again on the others with the same slot and
// sequence ID (RFC 8881 s2.10.6.2), the connection is redialled and
// bound again (BIND_CONN_TO_SESSION, s18.34), and the file holds exactly
// the data written. For knfsd it is cut once on the client's side and once on the
// server's (qemu's end of the forwarded connection).
func TestNconnectWriteThroughCut(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		t.Run("client-cut", func(t *testing.T) { nconnectThroughCut(t, p, nil) })
		if p.knfsd != nil {
			t.Run("server-cut", func(t *testing.T) { nconnectThroughCut(t, p, qemuCut(t, p.knfsd)) })
		}
	})
}

func nconnectThroughCut(t *testing.T, p peer, serverCut func(net.Conn)) {
	var cut atomic.Bool
	var dials atomic.Int32
	// Each socket counts its own bytes; one cut in all.
	topts := cutDialer(1<<20, func() *atomic.Int64 { return new(atomic.Int64) }, &cut, &dials, serverCut)
	p.nconnect = 4
	mt, ok := p.transport(topts).(*oncrpc.MultiTransport)
	if !ok {
		t.Fatal("no MultiTransport")
	}
	var log lockedBuffer
	ctx := testCtx(t)
	c, err := Dial(ctx, Config{Transport: mt, Export: p.export, Tracer: trace.New(&log, trace.NFS),
		RPC: oncrpc.ClientOptions{Timeout: 30 * time.Second, Retrans: 5}})
	if err != nil {
		t.Fatalf("%s: dial: %v", p.name, err)
	}
	defer c.Close(context.Background())
	// Every connection after the first was bound to the session,
	// for the fore channel only; RDMA mode over RPC-over-RDMA.
	for i := 1; i < 4; i++ {
		want := fmt.Sprintf("BIND_CONN_TO_SESSION connection %d dir=1 rdma=%v", i, p.rdma)
		if !strings.Contains(log.String(), want) {
			t.Fatalf("trace lacks %q:\n%s", want, log.String())
		}
	}
	for _, l := range strings.Split(log.String(), "\n") {
		if strings.Contains(l, "BIND_CONN_TO_SESSION") {
			t.Log(l)
		}
	}
	dir := testDir(t, c)
	of := createFile(ctx, t, c, dir, "big")
	data := pattern(10<<20, 23)
	w := c.NewUnstableWriter(rootCred, of, 8)
	if err := w.WriteAt(ctx, oncrpc.Plain(bytes.Clone(data)), 0, nil); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	var lost, resent uint64
	for _, s := range mt.Stats() {
		lost += s.Failures
		resent += s.Resent
	}
	if !cut.Load() || lost != 1 || resent == 0 {
		t.Fatalf("no connection cut mid-write and its calls resent (cut=%v lost=%d resent=%d): %+v", cut.Load(), lost, resent, mt.Stats())
	}
	if got := readAll(ctx, t, c, of, len(data)); !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes that differ from the %d written", len(got), len(data))
	}
	// The cut connection is redialled and bound again before it
	// carries calls.
	for {
		var back uint64
		for _, s := range mt.Stats() {
			back += s.Reconnects
		}
		if back == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("cut connection not bound again: %+v\n%s", mt.Stats(), log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if dials.Load() != 5 {
		t.Errorf("%d connections made, want 4 and one redial", dials.Load())
	}
	if got := readAll(ctx, t, c, of, len(data)); !bytes.Equal(got, data) {
		t.Fatalf("read over the redialled connection differs")
	}
	t.Logf("%s: connections %+v", p.name, mt.Stats())
	for i, s := range mt.Stats() {
		if !s.Up || s.Calls == 0 {
			t.Errorf("connection %d: %+v", i, s)
		}
	}
	if err := c.CloseFile(ctx, rootCred, of); err != nil {
		t.Fatal(err)
	}
}

// TestNconnectKnfsdRestartRecovery is TestKnfsdRestartRecovery with
// four connections per client: every connection breaks when knfsd
// restarts, each one's bind to the lost session is refused
// (NFS4ERR_BADSESSION), the calls' SEQUENCE starts the recovery, and
// the connections are bound to the new session (RFC 8881 s2.10.13).
func TestNconnectKnfsdRestartRecovery(t *testing.T) {
	k := testpeer.RequireKnfsd(t)
	tcp := peer{name: "knfsd", addr: k.TCPAddr, export: "/", knfsd: k}
	t.Run("tcp", func(t *testing.T) {
		p := tcp
		p.nconnect = 4
		restartRecovery(t, p, tcp, k.Restart)
	})
	t.Run("rdma", func(t *testing.T) {
		p := peer{name: "knfsd-rdma", addr: k.RDMAAddr, export: "/", knfsd: k, rdma: true, nconnect: 4}
		restartRecovery(t, p, tcp, k.Restart)
	})
}
