package nfsclient

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/rpcrdma"
	"github.com/rdmafs/rdmafs/test/soak"
	"github.com/rdmafs/rdmafs/test/testpeer"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// peer is a real NFSv4.1 server for integration tests.
type peer struct {
	name   string
	addr   string
	export string
	knfsd  *testpeer.Knfsd
	rdma   bool // RPC-over-RDMA (iWARP) instead of TCP
	v2     bool // insist on RPC-over-RDMA version 2
	// nconnect, above 1, is the number of connections of an
	// oncrpc.MultiTransport (nconnect_integration_test.go).
	nconnect int
	// offers names the optional NFSv4.2 operations the server (and the
	// file system it exports) carries out; a test of such an operation
	// runs where it is offered and checks the clean refusal elsewhere
	// (requireOffered).
	offers map[string]bool
}

// forEachPeer runs f against the matrix (test/testpeer): knfsd (kpeer)
// over TCP and over RPC-over-RDMA, nfs-ganesha over TCP and over
// RPC-over-RDMA version 2 through a relay, as subtests named after each.
func forEachPeer(t *testing.T, f func(t *testing.T, p peer)) {
	ways := []testpeer.Way{testpeer.KnfsdTCP, testpeer.KnfsdRDMA, testpeer.GaneshaTCP, testpeer.GaneshaRDMAv2(requireV2Relay)}
	testpeer.Each(t, ways, func(t *testing.T, s testpeer.Server) {
		f(t, peer{name: s.Name, addr: s.Addr, export: s.Export, knfsd: s.Knfsd, rdma: s.RDMA, v2: s.V2, offers: s.Offers})
	})
}

// v2Relay is an RPC-over-RDMA version-2 responder (no public server
// speaks version 2) relaying to ganesha over TCP, with the NFSv4
// upper-layer binding, started once per test binary.
var v2Relay struct {
	once sync.Once
	addr string
	err  error
}

func requireV2Relay(t testing.TB) string {
	g := testpeer.RequireGanesha(t)
	v2Relay.once.Do(func() {
		tcp := oncrpc.NewTCPTransport(g.Addr, oncrpc.TCPOptions{})
		resp, err := rpcrdma.Listen("127.0.0.1:0", rpcrdma.ResponderConfig{
			Provider: &iwarp.Provider{}, Handler: oncrpc.Relay(tcp, time.Minute), ReplyBulk: ReplyBulk,
			MaxVersion: rpcrdma.Version2, XChars: true, RemoteInvalidate: true, Credits: 64,
		})
		if err != nil {
			v2Relay.err = err
			return
		}
		v2Relay.addr = resp.Addr()
	})
	if v2Relay.err != nil {
		t.Fatalf("version-2 relay: %v", v2Relay.err)
	}
	return v2Relay.addr
}

// transport makes the peer's transport. For RPC-over-RDMA only
// topts.Dial applies: it makes the TCP connection under iWARP.
func (p peer) transport(topts oncrpc.TCPOptions) oncrpc.Transport {
	if p.nconnect > 1 {
		return p.multiTransport(topts)
	}
	if p.rdma {
		pv := &iwarp.Provider{}
		if dial := topts.Dial; dial != nil {
			pv.DialConn = func(ctx context.Context, addr string) (net.Conn, error) { return dial(ctx, "tcp", addr) }
		}
		cfg := rpcrdma.Config{Provider: pv, AcceptInvalidate: true, Tracer: testTracer()}
		if p.v2 {
			cfg.Version, cfg.XChars = rpcrdma.Version2, true
		}
		return rpcrdma.NewTransport(p.addr, cfg)
	}
	return oncrpc.NewTCPTransport(p.addr, topts)
}

// lockedBuffer is a bytes.Buffer for concurrent trace writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// testTracer traces to stderr the categories in $RDMAFS_TEST_TRACE
// (e.g. "rdma,nfs"), for debugging a failing test.
func testTracer() *trace.Tracer {
	cats, err := trace.Parse(os.Getenv("RDMAFS_TEST_TRACE"))
	if err != nil || cats == 0 {
		return nil
	}
	return trace.New(os.Stderr, cats)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func dial(t *testing.T, p peer, topts oncrpc.TCPOptions) *Client {
	t.Helper()
	tr := p.transport(topts)
	c, err := Dial(testCtx(t), Config{Transport: tr, Tracer: testTracer(), Export: p.export, RPC: oncrpc.ClientOptions{Timeout: 30 * time.Second, Retrans: 5}})
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

var rootCred = oncrpc.AuthSys{MachineName: "test"}.Credential()

// testDir makes a fresh directory for one test under the export root.
// createFile creates name in dir (GUARDED: an existing file is an error)
// and opens it for reading and writing.
func createFile(ctx context.Context, t *testing.T, c *Client, dir []byte, name string) *OpenFile {
	t.Helper()
	of, err := c.Open(ctx, rootCred, dir, name, OpenArgs{Access: ShareAccessBoth, Create: Guarded})
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return of
}

func testDir(t *testing.T, c *Client) []byte {
	t.Helper()
	name := fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), rand.Uint32())
	m, err := c.Mkdir(testCtx(t), rootCred, c.RootFH(), name, &SetAttr{Mode: ptr(uint32(0o777))})
	if err != nil {
		t.Fatalf("mkdir %s: %v", name, err)
	}
	if m.Attr.Type != TypeDir {
		t.Fatalf("mkdir made type %d", m.Attr.Type)
	}
	return m.FH
}

func ptr[T any](v T) *T { return &v }

func pattern(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func readAll(ctx context.Context, t *testing.T, c *Client, of *OpenFile, size int) []byte {
	t.Helper()
	out := make([]byte, size+1)
	off := 0
	for {
		n, eof, err := c.Read(ctx, rootCred, of.FH, of.StateID, uint64(off), oncrpc.Plain(out[off:min(off+c.RSize(), len(out))]))
		if err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
		off += n
		if eof || n == 0 {
			break
		}
	}
	return out[:off]
}

func TestSession(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		c := dial(t, p, oncrpc.TCPOptions{})
		if len(c.RootFH()) == 0 {
			t.Fatal("no root file handle")
		}
		if c.RSize() < 4096 || c.WSize() < 4096 {
			t.Fatalf("rsize %d wsize %d", c.RSize(), c.WSize())
		}
		flavors, err := c.SecInfoNoName(testCtx(t))
		if err != nil {
			t.Fatalf("SECINFO_NO_NAME: %v", err)
		}
		hasSys := false
		for _, f := range flavors {
			hasSys = hasSys || f == oncrpc.FlavorSys
		}
		if !hasSys {
			t.Fatalf("flavors %v lack AUTH_SYS", flavors)
		}
		a, err := c.StatFS(testCtx(t), rootCred, c.RootFH())
		if err != nil || a.SpaceTotal == 0 {
			t.Fatalf("statfs: %+v %v", a, err)
		}
	})
}

func TestFileWriteReadTruncate(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		c := dial(t, p, oncrpc.TCPOptions{})
		ctx := testCtx(t)
		dir := testDir(t, c)
		for i, size := range []int{1, 4096, 1 << 20, 10 << 20} {
			name := fmt.Sprintf("f%d", size)
			of, err := c.Open(ctx, rootCred, dir, name, OpenArgs{Access: ShareAccessBoth, Create: Guarded, Attr: &SetAttr{Mode: ptr(uint32(0o644))}})
			if err != nil {
				t.Fatalf("create %s: %v", name, err)
			}
			if !of.Created || of.Attr.Type != TypeReg || of.Attr.Mode != 0o644 {
				t.Fatalf("create %s: created=%v attr=%+v", name, of.Created, of.Attr)
			}
			data := pattern(size, uint64(i))
			w := c.NewUnstableWriter(rootCred, of, 4)
			if err := w.WriteAt(ctx, oncrpc.Plain(bytes.Clone(data)), 0, nil); err != nil {
				t.Fatalf("write %s: %v", name, err)
			}
			if err := w.Commit(ctx); err != nil {
				t.Fatalf("commit %s: %v", name, err)
			}
			got := readAll(ctx, t, c, of, size)
			if !bytes.Equal(got, data) {
				t.Fatalf("%s: read back %d bytes, differs from the %d written", name, len(got), size)
			}
			a, err := c.GetAttr(ctx, rootCred, of.FH)
			if err != nil || a.Size != uint64(size) {
				t.Fatalf("%s: getattr size %d, %v", name, a.Size, err)
			}
			// Truncate to half, then check size and content.
			half := uint64(size / 2)
			a, err = c.SetAttr(ctx, rootCred, of.FH, of.StateID, &SetAttr{Size: &half})
			if err != nil || a.Size != half {
				t.Fatalf("%s: truncate to %d: size %d, %v", name, half, a.Size, err)
			}
			if got := readAll(ctx, t, c, of, size); !bytes.Equal(got, data[:half]) {
				t.Fatalf("%s: after truncate read %d bytes, want %d", name, len(got), half)
			}
			if err := c.CloseFile(ctx, rootCred, of); err != nil {
				t.Fatalf("close %s: %v", name, err)
			}
		}
	})
}

func TestNamespaceOps(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		c := dial(t, p, oncrpc.TCPOptions{})
		ctx := testCtx(t)
		dir := testDir(t, c)
		made, err := c.Mkdir(ctx, rootCred, dir, "sub", &SetAttr{Mode: ptr(uint32(0o755))})
		if err != nil {
			t.Fatal(err)
		}
		sub := made.FH
		of, err := c.Open(ctx, rootCred, dir, "a", OpenArgs{Access: ShareAccessWrite, Create: Unchecked, Attr: &SetAttr{Mode: ptr(uint32(0o600))}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(ctx, rootCred, of.FH, of.StateID, 0, oncrpc.Plain([]byte("hello")), FileSync); err != nil {
			t.Fatal(err)
		}
		if err := c.CloseFile(ctx, rootCred, of); err != nil {
			t.Fatal(err)
		}

		// rename across directories
		if _, _, err := c.Rename(ctx, rootCred, dir, "a", sub, "b"); err != nil {
			t.Fatalf("rename: %v", err)
		}
		if _, _, err := c.Lookup(ctx, rootCred, dir, "a"); !errors.Is(err, ErrNoEnt) || Errno(err) != syscall.ENOENT {
			t.Fatalf("lookup of renamed source: %v", err)
		}
		bfh, battr, err := c.Lookup(ctx, rootCred, sub, "b")
		if err != nil || battr.Size != 5 {
			t.Fatalf("lookup renamed: %+v %v", battr, err)
		}
		// hard link
		la, _, err := c.Link(ctx, rootCred, bfh, dir, "hard")
		if err != nil || la.NLink != 2 {
			t.Fatalf("link: nlink=%d %v", la.NLink, err)
		}
		_, ha, err := c.Lookup(ctx, rootCred, dir, "hard")
		if err != nil || ha.FileID != battr.FileID {
			t.Fatalf("hard link fileid %d vs %d: %v", ha.FileID, battr.FileID, err)
		}
		// symlink / readlink
		lm, err := c.Symlink(ctx, rootCred, dir, "sym", "sub/b", nil)
		lfh := lm.FH
		if err != nil || lm.Attr.Type != TypeLnk {
			t.Fatalf("symlink: %+v %v", lm.Attr, err)
		}
		if target, err := c.Readlink(ctx, rootCred, lfh); err != nil || target != "sub/b" {
			t.Fatalf("readlink = %q, %v", target, err)
		}
		// rename over an existing target
		if _, _, err := c.Rename(ctx, rootCred, dir, "sym", dir, "hard"); err != nil {
			t.Fatalf("rename over existing: %v", err)
		}
		// EXCLUSIVE4_1 create (RFC 8881 s18.16.3): the same verifier again
		// finds the file it made (a retransmitted OPEN); another one is
		// EEXIST.
		verf := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
		excl := OpenArgs{Access: ShareAccessWrite, Create: Exclusive41, Verifier: verf, Attr: &SetAttr{Mode: ptr(uint32(0o600))}}
		for i := range 2 {
			of, err := c.Open(ctx, rootCred, dir, "excl", excl)
			if err != nil {
				t.Fatalf("exclusive create, try %d: %v", i, err)
			}
			c.CloseFile(ctx, rootCred, of)
		}
		excl.Verifier[0] = 9
		if _, err := c.Open(ctx, rootCred, dir, "excl", excl); Errno(err) != syscall.EEXIST {
			t.Fatalf("exclusive create with another verifier: %v", err)
		}
		if _, err := c.Remove(ctx, rootCred, dir, "excl"); err != nil {
			t.Fatal(err)
		}
		// errors map to errno
		if _, err := c.Mkdir(ctx, rootCred, dir, "sub", nil); Errno(err) != syscall.EEXIST {
			t.Fatalf("mkdir existing: %v", err)
		}
		if _, err := c.Remove(ctx, rootCred, dir, "sub"); Errno(err) != syscall.ENOTEMPTY {
			t.Fatalf("rmdir non-empty: %v", err)
		}
		// chmod and times
		mt := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
		a, err := c.SetAttr(ctx, rootCred, bfh, StateID{}, &SetAttr{Mode: ptr(uint32(0o640)), Mtime: &mt, UID: ptr(uint32(1234)), GID: ptr(uint32(567))})
		if err != nil || a.Mode != 0o640 || !a.Mtime.Equal(mt) || a.UID != 1234 || a.GID != 567 {
			t.Fatalf("setattr: mode %o mtime %v uid %d gid %d: %v", a.Mode, a.Mtime, a.UID, a.GID, err)
		}
		// remove everything
		for _, step := range []struct {
			dir  []byte
			name string
		}{{sub, "b"}, {dir, "sub"}, {dir, "hard"}} {
			if _, err := c.Remove(ctx, rootCred, step.dir, step.name); err != nil {
				t.Fatalf("remove %s: %v", step.name, err)
			}
		}
		ents, err := c.ReadDirAll(ctx, rootCred, dir)
		if err != nil || len(ents) != 0 {
			t.Fatalf("directory not empty after removes: %d entries, %v", len(ents), err)
		}
	})
}

func TestReadDir1000(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		c := dial(t, p, oncrpc.TCPOptions{})
		ctx := testCtx(t)
		dir := testDir(t, c)
		const n = 1000
		var wg sync.WaitGroup
		errs := make(chan error, n)
		sem := make(chan struct{}, 16)
		for i := range n {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				name := fmt.Sprintf("entry-%04d-with-a-longer-name", i)
				var err error
				if i%2 == 0 {
					_, err = c.Mkdir(ctx, rootCred, dir, name, nil)
				} else {
					var of *OpenFile
					of, err = c.Open(ctx, rootCred, dir, name, OpenArgs{Access: ShareAccessWrite, Create: Guarded})
					if err == nil {
						err = c.CloseFile(ctx, rootCred, of)
					}
				}
				if err != nil {
					errs <- fmt.Errorf("%s: %w", name, err)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		ents, err := c.ReadDirAll(ctx, rootCred, dir)
		if err != nil {
			t.Fatal(err)
		}
		seen := make(map[string]int)
		for _, e := range ents {
			seen[e.Name]++
			wantType := TypeReg
			if strings.HasPrefix(e.Name, "entry-") {
				var i int
				fmt.Sscanf(e.Name, "entry-%04d", &i)
				if i%2 == 0 {
					wantType = TypeDir
				}
			}
			if e.Attr.Type != wantType || e.Attr.FileID == 0 {
				t.Fatalf("%s: readdir attrs type %d fileid %d", e.Name, e.Attr.Type, e.Attr.FileID)
			}
		}
		if len(seen) != n || len(ents) != n {
			t.Fatalf("readdir returned %d entries, %d distinct, want %d", len(ents), len(seen), n)
		}
		for name, k := range seen {
			if k != 1 {
				t.Fatalf("%s returned %d times", name, k)
			}
		}
	})
}

// cuttingConn cuts the connection once the client has written more than
// limit bytes over all connections, the first time only. With serverCut
// nil the client's side is cut: it writes half of the buffer that
// crosses the limit, then shuts its socket down both ways, as a network
// failure would (the peer sees the stream end in the middle of a record
// or, under iWARP, of an MPA frame). Otherwise serverCut drops the
// server's end before the buffer is written, and the client finds out
// from the socket.
// cutDialer dials TCP connections wrapped in cuttingConns that cut
// once between them all (cut) when the bytes counted by written() pass
// limit; written is called per connection, so one counter for all or
// one each. dials counts the connections made.
func cutDialer(limit int64, written func() *atomic.Int64, cut *atomic.Bool, dials *atomic.Int32, serverCut func(net.Conn)) oncrpc.TCPOptions {
	return oncrpc.TCPOptions{
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			nc, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			dials.Add(1)
			return &cuttingConn{Conn: nc, written: written(), limit: limit, cut: cut, serverCut: serverCut}, nil
		},
	}
}

type cuttingConn struct {
	net.Conn
	written   *atomic.Int64
	limit     int64
	cut       *atomic.Bool
	serverCut func(c net.Conn)
}

func (c *cuttingConn) Write(b []byte) (int, error) {
	if c.written.Add(int64(len(b))) > c.limit && c.cut.CompareAndSwap(false, true) {
		if c.serverCut != nil {
			c.serverCut(c.Conn)
			return c.Conn.Write(b)
		}
		n, _ := c.Conn.Write(b[:len(b)/2])
		if tc, ok := c.Conn.(*net.TCPConn); ok {
			tc.CloseRead()
			tc.CloseWrite()
		}
		c.Conn.Close()
		return n, errors.New("test: connection cut")
	}
	return c.Conn.Write(b)
}

// qemuCut returns a serverCut for knfsd in its kpeer guest: it shuts
// down qemu's end of the forwarded connection (soak.CutConnections:
// pidfd_getfd(2) and shutdown(2) on qemu's socket), so the guest's
// connection to knfsd, under siw for RPC-over-RDMA, is closed from the
// server's side while the client is writing.
func qemuCut(t *testing.T, k *testpeer.Knfsd) func(net.Conn) {
	return func(c net.Conn) {
		b, err := os.ReadFile(filepath.Join(k.RunDir, "qemu.pid"))
		if err != nil {
			t.Errorf("server cut: knfsd's qemu: %v", err)
			return
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Errorf("server cut: qemu.pid: %v", err)
			return
		}
		port := c.LocalAddr().(*net.TCPAddr).Port
		if n, err := soak.CutConnections(pid, port); err != nil || n != 1 {
			t.Errorf("server cut: qemu's connections from port %d: %d cut, %v", port, n, err)
		}
	}
}

// TestReconnectDuringWrite cuts the connection in the middle of a 10 MiB
// UNSTABLE write: over TCP in the middle of an RPC record; over
// RPC-over-RDMA (knfsd on siw, and the version-2 relay) in the middle of
// the iWARP stream that carries the Sends and the Read Responses with
// which the server pulls the WRITE data from our Read chunks. For knfsd
// it is cut once on the client's side and once on the server's (qemu's
// end of the forwarded connection). The client must reconnect, resend
// what was not acknowledged (RFC 8881 s2.10.6.2: a retry on a new
// connection with the same slot and sequence ID) and the file must hold
// exactly the data written.
func TestReconnectDuringWrite(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		t.Run("client-cut", func(t *testing.T) { writeThroughCut(t, p, nil) })
		if p.knfsd != nil {
			t.Run("server-cut", func(t *testing.T) { writeThroughCut(t, p, qemuCut(t, p.knfsd)) })
		}
	})
}

func writeThroughCut(t *testing.T, p peer, serverCut func(net.Conn)) {
	var written atomic.Int64
	var cut atomic.Bool
	var dials atomic.Int32
	topts := cutDialer(3<<20, func() *atomic.Int64 { return &written }, &cut, &dials, serverCut)
	var retrans atomic.Int32
	ctx := testCtx(t)
	c, err := Dial(ctx, Config{Transport: p.transport(topts), Tracer: testTracer(), Export: p.export,
		RPC: oncrpc.ClientOptions{Timeout: 30 * time.Second, Retrans: 5, OnRetransmit: func(uint32, int, error) { retrans.Add(1) }}})
	if err != nil {
		t.Fatalf("%s: dial: %v", p.name, err)
	}
	defer c.Close(context.Background())
	dir := testDir(t, c)
	of := createFile(ctx, t, c, dir, "big")
	data := pattern(10<<20, 99)
	w := c.NewUnstableWriter(rootCred, of, 4)
	if err := w.WriteAt(ctx, oncrpc.Plain(bytes.Clone(data)), 0, nil); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	// The cut lands in the middle of the WRITEs: calls in flight on the
	// cut connection are sent again on the new one.
	if !cut.Load() || dials.Load() < 2 || retrans.Load() == 0 {
		t.Fatalf("connection was not cut mid-write and remade (cut=%v connections=%d retransmissions=%d)", cut.Load(), dials.Load(), retrans.Load())
	}
	if got := readAll(ctx, t, c, of, len(data)); !bytes.Equal(got, data) {
		t.Fatalf("after reconnect read %d bytes that differ from the data written", len(got))
	}
	if err := c.CloseFile(ctx, rootCred, of); err != nil {
		t.Fatal(err)
	}
}

func TestCloseDestroysClient(t *testing.T) {
	k := testpeer.RequireKnfsd(t)
	p := peer{name: "knfsd", addr: k.TCPAddr, export: "/", knfsd: k}
	tr := oncrpc.NewTCPTransport(p.addr, oncrpc.TCPOptions{})
	ctx := testCtx(t)
	c, err := Dial(ctx, Config{Transport: tr, Export: p.export})
	if err != nil {
		t.Fatal(err)
	}
	owner := c.OwnerID()
	count := func() int {
		out, err := k.Exec(ctx, "cat /proc/fs/nfsd/clients/*/info 2>/dev/null; true")
		if err != nil {
			t.Fatalf("exec: %v", err)
		}
		return strings.Count(out, owner)
	}
	if n := count(); n != 1 {
		t.Fatalf("server lists our client %d times while mounted, want 1", n)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	if n := count(); n != 0 {
		t.Fatalf("server still lists our client after Close (%d)", n)
	}
}

func TestNonexistentExport(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	tr := oncrpc.NewTCPTransport(g.Addr, oncrpc.TCPOptions{})
	_, err := Dial(testCtx(t), Config{Transport: tr, Export: "/no/such/export"})
	if Errno(err) != syscall.ENOENT {
		t.Fatalf("dial of missing export: %v, want ENOENT", err)
	}
}

// TestKnfsdRDMAChunks checks, from the transport's counters, that data
// moves by RDMA against knfsd: Read chunks for WRITE data, Write chunks
// for READ data, a Reply chunk for a large READDIR; and that no memory
// stays exposed to the server after any call (RFC 8166 s8.1). knfsd
// speaks version 1 only, so the connection falls back from a version-2
// probe (v2 draft s5.2).
func TestKnfsdRDMAChunks(t *testing.T) {
	k := testpeer.RequireKnfsd(t)
	var traceBuf lockedBuffer
	tr := rpcrdma.NewTransport(k.RDMAAddr, rpcrdma.Config{Provider: &iwarp.Provider{}, AcceptInvalidate: true,
		InlineRecv: 1024, Tracer: trace.New(&traceBuf, trace.RDMA)})
	c, err := Dial(testCtx(t), Config{Transport: tr, Export: "/"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	// The first call went as a version-2 probe, knfsd answered ERR_VERS
	// 1..1, and the same connection went on in version 1.
	if st := tr.Stats(); st.Version != 1 || st.Fallbacks != 1 || st.Connects != 1 {
		t.Fatalf("negotiation against knfsd: %+v", st)
	}
	for _, want := range []string{"vers=2", "probe", "ERR_VERS 1..1: falling back to version 1 on this connection", "vers=1"} {
		if !strings.Contains(traceBuf.String(), want) {
			t.Fatalf("trace lacks %q:\n%s", want, traceBuf.String())
		}
	}
	checkRDMAChunks(t, c, tr)
}

// TestRelayV2Chunks runs the same checks over RPC-over-RDMA version 2
// with transport characteristics, against our responder relaying to
// ganesha.
func TestRelayV2Chunks(t *testing.T) {
	addr := requireV2Relay(t)
	tr := rpcrdma.NewTransport(addr, rpcrdma.Config{Provider: &iwarp.Provider{}, AcceptInvalidate: true,
		InlineRecv: 1024, Version: rpcrdma.Version2, XChars: true, Tracer: testTracer()})
	c, err := Dial(testCtx(t), Config{Transport: tr, Export: testpeer.RequireGanesha(t).Export})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if st := tr.Stats(); st.Version != 2 || st.Fallbacks != 0 || st.InlineSend != 4096 {
		t.Fatalf("negotiation with the version-2 relay: %+v", st)
	}
	checkRDMAChunks(t, c, tr)
	if chars, ok := tr.PeerChars(); !ok || chars.RBSize != 4096 {
		t.Fatalf("relay's characteristics: %+v announced=%v", chars, ok)
	}
}

func checkRDMAChunks(t *testing.T, c *Client, tr *rpcrdma.Transport) {
	ctx := testCtx(t)
	live := func(what string) {
		t.Helper()
		if n := tr.PD().LiveRemoteRegions(); n != 0 {
			t.Fatalf("after %s: %d memory regions still exposed to the server", what, n)
		}
	}
	dir := testDir(t, c)
	of := createFile(ctx, t, c, dir, "data")
	// WRITE and READ data in the transport's registered memory, as the
	// FUSE layer keeps it: no user-space copy in the transport.
	pool := tr.Buffers()
	before := tr.Stats()
	data := pattern(1<<20, 5)
	srcMem, err := pool.Get(c.WSize())
	if err != nil {
		t.Fatal(err)
	}
	defer srcMem.Release()
	src := srcMem.Bytes()
	copy(src, data)
	if _, err := c.Write(ctx, rootCred, of.FH, of.StateID, 0, oncrpc.Lent(srcMem), FileSync); err != nil {
		t.Fatal(err)
	}
	live("WRITE")
	st := tr.Stats()
	if st.ReadChunks != before.ReadChunks+1 {
		t.Fatalf("WRITE of %d bytes used %d Read chunks", c.WSize(), st.ReadChunks-before.ReadChunks)
	}
	if st.BytesCopied != before.BytesCopied {
		t.Fatalf("WRITE from registered memory: the transport copied %d bytes", st.BytesCopied-before.BytesCopied)
	}
	destMem, err := pool.Get(c.WSize())
	if err != nil {
		t.Fatal(err)
	}
	defer destMem.Release()
	dest := destMem.Bytes()
	n, _, err := c.Read(ctx, rootCred, of.FH, of.StateID, 0, oncrpc.Lent(destMem))
	if err != nil || n != len(dest) || !bytes.Equal(dest, data[:n]) {
		t.Fatalf("READ: n=%d err=%v (data equal: %v)", n, err, bytes.Equal(dest[:n], data[:n]))
	}
	live("READ")
	st2 := tr.Stats()
	if st2.WriteChunks != st.WriteChunks+1 || st2.BytesPlaced-st.BytesPlaced != uint64(n) {
		t.Fatalf("READ: %d Write chunks, %d bytes placed", st2.WriteChunks-st.WriteChunks, st2.BytesPlaced-st.BytesPlaced)
	}
	t.Logf("READ of %d bytes into registered memory: %d bytes copied on the way (provider's buffered reader; Linux siw sends one FPDU per TCP segment)",
		n, st2.BytesCopied-st.BytesCopied)
	// A READ of 1001 bytes with a Write chunk (the transports here
	// announce 1024-byte receive buffers, so the reply cannot come
	// inline): the chunk has no room for padding and the server
	// writes exactly 1001 (RFC 8166 s3.4.6).
	small := make([]byte, 1001)
	if n, _, err := c.Read(ctx, rootCred, of.FH, of.StateID, 3, oncrpc.Plain(small)); err != nil || n != 1001 || !bytes.Equal(small, data[3:1004]) {
		t.Fatalf("1001-byte READ: n=%d err=%v", n, err)
	}
	live("small READ")
	if st3 := tr.Stats(); st3.WriteChunks != st2.WriteChunks+1 || st3.BytesPlaced-st2.BytesPlaced != 1001 {
		t.Fatalf("1001-byte READ: %d Write chunks, %d bytes placed", st3.WriteChunks-st2.WriteChunks, st3.BytesPlaced-st2.BytesPlaced)
	}
	// Reading again into a slice of the same buffer, as FUSE's rsize
	// slices are: the exposure reuses a fast-registration region.
	mem := tr.Stats().Memory
	if _, _, err := c.Read(ctx, rootCred, of.FH, of.StateID, 4096, oncrpc.Lent(destMem).Slice(4096, 8192)); err != nil {
		t.Fatal(err)
	}
	live("second READ")
	if m := tr.Stats().Memory; m.ExposureReuses != mem.ExposureReuses+1 || m.FastRegions != mem.FastRegions {
		t.Fatalf("re-reading allocated a fast-registration region: before %+v after %+v", mem, m)
	}
	if err := c.CloseFile(ctx, rootCred, of); err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		if _, err := c.Mkdir(ctx, rootCred, dir, fmt.Sprintf("a-rather-long-directory-name-%03d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	st3 := tr.Stats()
	ents, err := c.ReadDirAll(ctx, rootCred, dir)
	if err != nil || len(ents) != 201 {
		t.Fatalf("READDIR: %d entries, %v", len(ents), err)
	}
	live("READDIR")
	if st4 := tr.Stats(); st4.ReplyChunks <= st3.ReplyChunks {
		t.Fatal("large READDIR used no Reply chunk")
	}
}

// TestKnfsdDelegationRecall drives the callback path end to end: client A
// holds a read delegation, client B opens the file for writing, knfsd
// sends CB_RECALL to A over A's back channel (over RPC-over-RDMA for the
// rdma variant: RFC 8167), A returns the delegation, and B's OPEN
// completes.
func TestKnfsdDelegationRecall(t *testing.T) {
	k := testpeer.RequireKnfsd(t)
	for _, rdma := range []bool{false, true} {
		name := map[bool]string{false: "tcp", true: "rdma"}[rdma]
		t.Run(name, func(t *testing.T) {
			pa := peer{name: "knfsd-" + name, addr: k.TCPAddr, export: "/", knfsd: k}
			if rdma {
				pa.addr, pa.rdma = k.RDMAAddr, true
			}
			ctx := testCtx(t)
			a, err := Dial(ctx, Config{Transport: pa.transport(oncrpc.TCPOptions{}), Export: "/", Delegations: true, Tracer: testTracer()})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close(context.Background())
			b := dial(t, peer{name: "knfsd", addr: k.TCPAddr, export: "/"}, oncrpc.TCPOptions{})
			dir := testDir(t, a)
			of := createFile(ctx, t, a, dir, "f")
			if err := a.CloseFile(ctx, rootCred, of); err != nil {
				t.Fatal(err)
			}
			// knfsd hands out a read delegation once its callback
			// workqueue has marked the path up, which for NFSv4.1 it does
			// without a CB_NULL: nothing the client can wait on. Open
			// again (each open a round trip) until an open is granted
			// one, or the test's context ends.
			var ro *OpenFile
			for a.Delegations() == 0 && ctx.Err() == nil {
				if ro != nil {
					a.CloseFile(ctx, rootCred, ro)
				}
				if ro, err = a.OpenFH(ctx, rootCred, of.FH, ShareAccessRead, ShareDenyNone); err != nil {
					t.Fatal(err)
				}
			}
			if a.Delegations() == 0 {
				t.Fatal("knfsd granted no read delegation (callback path down?)")
			}
			bo, err := b.OpenFH(ctx, rootCred, of.FH, ShareAccessWrite, ShareDenyNone)
			if err != nil {
				t.Fatalf("conflicting open: %v", err)
			}
			b.CloseFile(ctx, rootCred, bo)
			if a.Recalls() == 0 {
				t.Fatal("no CB_RECALL reached the delegation holder")
			}
			// The DELEGRETURN runs on its own goroutine after the
			// CB_RECALL is answered: poll until it is done or the test's
			// context ends.
			for a.Delegations() != 0 && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond) // polling interval, not synchronisation
			}
			if a.Delegations() != 0 {
				t.Fatal("recalled delegation was not returned")
			}
			if ro != nil {
				a.CloseFile(ctx, rootCred, ro)
			}
		})
	}
}

// TestSessionRecovery destroys the client's session behind its back; the
// next call gets NFS4ERR_BADSESSION, the client makes a new session
// (RFC 8881 s2.10.13) and the call succeeds.
func TestSessionRecovery(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		c := dial(t, p, oncrpc.TCPOptions{})
		ctx := testCtx(t)
		old := c.sess.Load()
		if err := c.simple(ctx, &destroySessionOp{args: destroySession4args{sessionid: old.id}}); err != nil {
			t.Fatalf("DESTROY_SESSION: %v", err)
		}
		if _, err := c.GetAttr(ctx, rootCred, c.RootFH()); err != nil {
			t.Fatalf("GETATTR after the session was destroyed: %v", err)
		}
		if _, rec := c.Snapshot(); rec != 1 || c.sess.Load() == old {
			t.Fatalf("recoveries %d, session replaced: %v", rec, c.sess.Load() != old)
		}
	})
}

// flipCommit relays to a real server and, while armed, changes the write
// verifier in COMMIT replies, as a server reboot between WRITE and COMMIT
// would: fault injection through our own responder.
type flipCommit struct {
	next  oncrpc.CallHandler
	armed atomic.Bool
}

func (f *flipCommit) HandleCall(call []byte) []byte {
	reply := f.next.HandleCall(call)
	// SEQUENCE|PUTFH|COMMIT: the call ends with COMMIT's op number, offset
	// and count; the reply ends with the verifier.
	if len(call) >= 16 && len(reply) >= 8 && binary.BigEndian.Uint32(call[len(call)-16:]) == opCommit && f.armed.CompareAndSwap(true, false) {
		reply[len(reply)-1] ^= 0xff
	}
	return reply
}

// flipCommitClient dials ganesha over RPC-over-RDMA through a relay whose
// COMMIT replies flip can change.
func flipCommitClient(t *testing.T) (*Client, *flipCommit) {
	t.Helper()
	g := testpeer.RequireGanesha(t)
	flip := &flipCommit{next: oncrpc.Relay(oncrpc.NewTCPTransport(g.Addr, oncrpc.TCPOptions{}), time.Minute)}
	resp, err := rpcrdma.Listen("127.0.0.1:0", rpcrdma.ResponderConfig{Provider: &iwarp.Provider{}, Handler: flip, ReplyBulk: ReplyBulk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Close() }) // after the client's Close (cleanups run last-first)
	return dial(t, peer{name: "ganesha-relay", addr: resp.Addr(), export: g.Export, rdma: true}, oncrpc.TCPOptions{}), flip
}

// TestCommitVerifierChangeResends checks that unstable data is written
// again when COMMIT returns another verifier (RFC 8881 s18.3.3).
func TestCommitVerifierChangeResends(t *testing.T) {
	c, flip := flipCommitClient(t)
	ctx := testCtx(t)
	dir := testDir(t, c)
	of := createFile(ctx, t, c, dir, "f")
	data := pattern(3<<20, 11)
	w := c.NewUnstableWriter(rootCred, of, 4)
	if err := w.WriteAt(ctx, oncrpc.Plain(bytes.Clone(data)), 0, nil); err != nil {
		t.Fatal(err)
	}
	flip.armed.Store(true)
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if w.Resent() == 0 || w.Pending() != 0 {
		t.Fatalf("resent %d writes, %d bytes still pending", w.Resent(), w.Pending())
	}
	if got := readAll(ctx, t, c, of, len(data)); !bytes.Equal(got, data) {
		t.Fatal("data differs after the resend")
	}
	c.CloseFile(ctx, rootCred, of)
}

// TestLeaseRenewalWhileIdle leaves a client idle for longer than a third
// of the lease: it must renew with a SEQUENCE of its own (RFC 8881 s8.3).
func TestLeaseRenewalWhileIdle(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	c := dial(t, peer{name: "ganesha", addr: g.Addr, export: g.Export}, oncrpc.TCPOptions{})
	renewals := func() uint64 {
		ops, _ := c.Snapshot()
		for _, o := range ops {
			if o.Op == "SEQUENCE" {
				return o.Count
			}
		}
		return 0
	}
	before := renewals()
	// The loop wakes every lease/6 and renews after lease/3 of silence.
	// Wait for the renewal; the lease is the limit, for the server would
	// expire the client's state after it.
	start := time.Now()
	for renewals() <= before && time.Since(start) < c.LeaseTime() {
		time.Sleep(100 * time.Millisecond) // polling interval, not synchronisation
	}
	if renewals() <= before {
		t.Fatalf("no lease renewal in a lease time (%v) of idleness", c.LeaseTime())
	}
	if _, err := c.GetAttr(testCtx(t), rootCred, c.RootFH()); err != nil {
		t.Fatal(err)
	}
}
