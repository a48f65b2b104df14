package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// relayProc is an "rdmafs relay" process a test started.
type relayProc struct {
	addr, port string
	cmd        *exec.Cmd
	stderr     *syncBuf
	waited     chan error
}

// syncBuf is a strings.Builder safe for the process's writes and the
// test's reads.
type syncBuf struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var relayLine = regexp.MustCompile(`serving RPC-over-RDMA on (\S+) `)

// startRelayBin runs "rdmafs relay" to the TCP server at to, on a free
// port of the loopback with the pure-Go iWARP provider, with the extra
// flags, and waits for the address it serves on. The relay is stopped
// with SIGTERM when the test ends, if the test has not stopped it.
func startRelayBin(t *testing.T, to string, flags ...string) *relayProc {
	t.Helper()
	return startRelayAt(t, "127.0.0.1:0", to, flags...)
}

// startRelayAt is startRelayBin listening on listen. The relay runs
// with --no-root-squash unless flags name a squash option: the tests
// work as root in exports owned by root.
func startRelayAt(t *testing.T, listen, to string, flags ...string) *relayProc {
	t.Helper()
	if !slices.ContainsFunc(flags, func(f string) bool { return strings.HasSuffix(f, "-squash") }) {
		flags = append([]string{"--no-root-squash"}, flags...)
	}
	args := append([]string{"relay", "--listen", listen, "--to", to, "--rdmadev", "iwarp-go"}, flags...)
	cmd := exec.Command(rdmafsBin(t), args...)
	p := &relayProc{cmd: cmd, stderr: &syncBuf{}, waited: make(chan error, 1)}
	cmd.Stderr = p.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.waited <- cmd.Wait() }()
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		lines <- line
		io.Copy(io.Discard, out)
	}()
	select {
	case line := <-lines:
		m := relayLine.FindStringSubmatch(line)
		if m == nil {
			cmd.Process.Kill()
			t.Fatalf("rdmafs %s: no address: %q; stderr:\n%s", strings.Join(args, " "), line, p.stderr)
		}
		p.addr = m[1]
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatalf("rdmafs %s: no address within a minute; stderr:\n%s", strings.Join(args, " "), p.stderr)
	}
	p.port = p.addr[strings.LastIndexByte(p.addr, ':')+1:]
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.stop(t)
		}
		if t.Failed() {
			t.Logf("relay stderr:\n%s", p.stderr)
		}
	})
	return p
}

// stop ends the relay with SIGTERM and requires it to exit 0 within the
// grace period and a margin.
func (p *relayProc) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.waited:
		if err != nil {
			t.Errorf("relay after SIGTERM: %v; stderr:\n%s", err, p.stderr)
		}
	case <-time.After(time.Minute):
		p.cmd.Process.Kill()
		t.Errorf("relay still running a minute after SIGTERM; stderr:\n%s", p.stderr)
	}
}

// stats returns "rdmafs stats --relay" of the relay.
func (p *relayProc) stats(t *testing.T) string {
	t.Helper()
	out, code := runBin(t, time.Minute, "stats", "--relay", p.port)
	if code != 0 {
		t.Fatalf("rdmafs stats --relay %s: exit %d: %s", p.port, code, out)
	}
	return out
}

// statField returns the number after "name=" (or "name: ") on the line
// of the stats that starts with line.
func statField(t *testing.T, stats, line, name string) int {
	t.Helper()
	for _, l := range strings.Split(stats, "\n") {
		if !strings.HasPrefix(l, line) {
			continue
		}
		re := regexp.MustCompile(`(?:^|\s)` + regexp.QuoteMeta(name) + `[=:] ?(\d+)`)
		if m := re.FindStringSubmatch(l); m != nil {
			return atoi(t, m[1])
		}
	}
	t.Fatalf("no %s on the %q line of the relay's stats:\n%s", name, line, stats)
	return 0
}

// relayWorkload is a shell workload with checksums: files written, copied,
// compared by sha256, a tree made, renamed and removed.
func relayWorkload(local, d string) string {
	return fmt.Sprintf(`
cd %[2]s
head -c 3000000 /dev/urandom > %[1]s/big
head -c 5000 /dev/urandom > %[1]s/small
cp %[1]s/big big && cp %[1]s/small small
cp big big2
mkdir -p tree/a/b && for i in 1 2 3 4 5 6 7 8; do echo "file $i" > tree/a/b/f$i; done
mv tree/a tree/c && mv big2 tree/c/big3
want=$(cat %[1]s/big %[1]s/small %[1]s/big | sha256sum)
got=$(cat big small tree/c/big3 | sha256sum)
[ "$want" = "$got" ] || { echo "checksum mismatch: $got, want $want"; exit 1; }
[ "$(cat tree/c/b/f5)" = "file 5" ] || { echo "tree/c/b/f5 wrong"; exit 1; }
rm -r tree && rm big small
[ -z "$(ls)" ] || { echo "left over: $(ls)"; exit 1; }
echo workload ok
`, local, d)
}

// TestRelayWorkload mounts, with rdmafs over RPC-over-RDMA (the pure-Go
// iWARP provider), ganesha and knfsd's TCP listener through an "rdmafs
// relay" process, runs a shell workload with checksums, reads the relay's
// statistics and stops it with SIGTERM.
func TestRelayWorkload(t *testing.T) {
	for _, server := range []string{"ganesha", "knfsd-tcp"} {
		t.Run(server, func(t *testing.T) {
			var to, export string
			if server == "ganesha" {
				g := testpeer.RequireGanesha(t)
				to, export = g.Addr, g.Export
			} else {
				k := testpeer.RequireKnfsd(t)
				to, export = k.TCPAddr, "/"
			}
			r := startRelayBin(t, to)
			mnt := mount(t, peer{name: "relay-" + server, host: "127.0.0.1", port: r.port, export: export, opts: []string{"proto=rdma", "rdmadev=iwarp-go"}})
			d := testDir(t, mnt)
			out := sh(t, 5*time.Minute, relayWorkload(t.TempDir(), d))
			if !strings.Contains(out, "workload ok") {
				t.Fatalf("workload:\n%s", out)
			}
			st := r.stats(t)
			t.Logf("relay stats:\n%s", st)
			if n := statField(t, st, "connections:", "open"); n != 1 {
				t.Errorf("%d connections open at the relay, want the mount's 1", n)
			}
			if calls, fwd := statField(t, st, "calls:", "calls"), statField(t, st, "calls:", "forwarded"); calls < 50 || fwd != calls {
				t.Errorf("relay handled %d calls and forwarded %d; want the workload's (at least 50), all forwarded", calls, fwd)
			}
			// Over 3 MB written; the cp of one file to another in the
			// mount may be a COPY on the server (knfsd).
			if n := statField(t, st, "calls:", "bytes_in"); n < 3005000 {
				t.Errorf("relay received %d bytes of calls; the workload wrote 3 MB", n)
			}
			if n := statField(t, st, "calls:", "unanswered"); n != 0 {
				t.Errorf("%d calls the server did not answer", n)
			}
			os.RemoveAll(d)
		})
	}
}

// TestRelaySIGTERM stops a relay under a mount with SIGTERM: it exits 0
// and its stats socket goes. A new relay on the same port takes over:
// the mount reconnects through it, reads back what it wrote intact, and
// unmounts cleanly.
func TestRelaySIGTERM(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	r := startRelayBin(t, g.Addr, "--grace", "2s")
	mnt := mount(t, peer{name: "relay-ganesha", host: "127.0.0.1", port: r.port, export: g.Export, opts: []string{"proto=rdma", "rdmadev=iwarp-go"}})
	d := testDir(t, mnt)
	defer os.RemoveAll(d)
	sum := t.TempDir() + "/sum"
	sh(t, time.Minute, "head -c 1000000 /dev/urandom > "+d+"/f && sha256sum "+d+"/f > "+sum)
	r.stop(t)
	if out, code := runBin(t, time.Minute, "stats", "--relay", r.port); code == 0 {
		t.Fatalf("stats of a stopped relay: exit 0:\n%s", out)
	}
	r2 := startRelayAt(t, r.addr, g.Addr)
	sh(t, 2*time.Minute, "sha256sum -c "+sum)
	if n := statField(t, r2.stats(t), "calls:", "calls"); n == 0 {
		t.Error("the mount's calls after the relay's restart did not go through the new relay")
	}
	// Unmounted while the new relay serves: it stops before the mount's
	// cleanup (cleanups run last first).
	os.RemoveAll(d)
	if out, code := runBin(t, 2*time.Minute, "umount", mnt); code != 0 {
		t.Errorf("rdmafs umount through the new relay: exit %d: %s", code, out)
	}
}

// TestRelayServerConnectionLost cuts the relay's TCP connection to the
// server under a mount: the relay closes the mount's RDMA connection
// (the server's state bound to the TCP connection is gone), the mount
// reconnects through the relay to a new TCP connection, and its files
// are intact.
func TestRelayServerConnectionLost(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	proxy := newTCPProxy(t, g.Addr)
	r := startRelayBin(t, proxy.ln.Addr().String())
	mnt := mount(t, peer{name: "relay-ganesha", host: "127.0.0.1", port: r.port, export: g.Export, opts: []string{"proto=rdma", "rdmadev=iwarp-go"}})
	d := testDir(t, mnt)
	defer os.RemoveAll(d)
	sums := t.TempDir() + "/sums"
	sh(t, time.Minute, "head -c 500000 /dev/urandom > "+d+"/f1 && sha256sum "+d+"/f1 > "+sums)
	before := statField(t, r.stats(t), "connections:", "accepted")
	if n := proxy.cut(); n == 0 {
		t.Fatal("the relay has no connection to the server to cut")
	}
	sh(t, 2*time.Minute, "head -c 500000 /dev/urandom > "+d+"/f2 && sha256sum "+d+"/f2 >> "+sums+" && sha256sum -c "+sums)
	st := r.stats(t)
	t.Logf("relay stats:\n%s", st)
	if n := statField(t, st, "errors:", "server_connections_lost"); n < 1 {
		t.Errorf("relay counted %d lost server connections, want the cut one", n)
	}
	if n := statField(t, st, "connections:", "accepted"); n <= before {
		t.Errorf("%d connections accepted after the cut, %d before: the mount did not reconnect", n, before)
	}
	if n := statField(t, st, "connections:", "open"); n != 1 {
		t.Errorf("%d connections open, want the mount's new one alone", n)
	}
}

// TestRelayUsage: the relay's command line is checked before it serves:
// no server is bad usage (exit 1), a server that does not answer is exit
// 4, each with one line saying why.
func TestRelayUsage(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close() // nothing listens there now
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"relay"}, exitUsage, "--to"},
		{[]string{"relay", "--to", "127.0.0.1:2049", "--rdmavers", "3"}, exitUsage, "--rdmavers 3"},
		{[]string{"relay", "--to", "127.0.0.1:2049", "--credits", "0"}, exitUsage, "--credits 0"},
		{[]string{"relay", "--to", "127.0.0.1:2049", "--allow", "10.0.0.0/33"}, exitUsage, "--allow 10.0.0.0/33"},
		{[]string{"relay", "--to", "127.0.0.1:2049", "--root-squash", "--no-root-squash"}, exitUsage, "pick one"},
		{[]string{"relay", "--to", "127.0.0.1:2049", "--max-connections-per-source", "0"}, exitUsage, "--max-connections-per-source 0"},
		{[]string{"relay", "--listen", "127.0.0.1:0", "--to", closed}, exitServer, "cannot reach NFS server " + closed},
	} {
		out, code := runBin(t, time.Minute, c.args...)
		if code != c.code || !strings.Contains(out, c.says) {
			t.Errorf("rdmafs %s: exit %d, want %d saying %q:\n%s", strings.Join(c.args, " "), code, c.code, c.says, out)
		}
	}
}
