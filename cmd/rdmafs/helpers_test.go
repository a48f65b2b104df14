package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/test/soak"
	"github.com/rdmafs/rdmafs/test/testpeer"
	"github.com/rdmafs/rdmafs/test/testpeer/v2relay"
)

func TestMain(m *testing.M) {
	soak.MaybeWorker() // TestSoak's worker processes are this binary
	maybeLockChild()   // and TestLockGoneAtClose's lock holders
	flag.Parse()
	warnBeforeTimeout()
	testpeer.Main(m)
}

// peer is a real NFSv4.1 server the tests mount.
type peer struct {
	name   string
	host   string
	port   string
	export string
	knfsd  *testpeer.Knfsd
	opts   []string // extra mount options (proto=rdma, rdmavers=2)
	// restart restarts the server with its state forgotten and a grace
	// period for reclaims; nil where the server cannot (the shared
	// ganesha runs graceless).
	restart func(ctx context.Context) error
}

func (p peer) source() string { return p.host + ":" + p.export }

// forEachPeer runs f against knfsd (in qemu) and nfs-ganesha over TCP,
// as subtests named after the server (test/testpeer's matrix); knfsd's
// peer can be restarted (the shared ganesha runs graceless).
func forEachPeer(t *testing.T, f func(t *testing.T, p peer)) {
	eachWay(t, []testpeer.Way{testpeer.KnfsdTCP, testpeer.GaneshaTCP}, f)
}

// forEachKnfsd runs f against knfsd only, over TCP and, with rdma, over
// RPC-over-RDMA too: for tests that look at the server's state in its
// guest or fill its small export.
func forEachKnfsd(t *testing.T, rdma bool, f func(t *testing.T, p peer)) {
	ways := []testpeer.Way{testpeer.KnfsdTCP}
	if rdma {
		ways = append(ways, testpeer.KnfsdRDMA)
	}
	eachWay(t, ways, f)
}

// eachWay runs f on the servers of ways, mounted over RPC-over-RDMA (at
// version 2 where the way insists) for those reached so. knfsd can be
// restarted; the shared ganesha cannot.
func eachWay(t *testing.T, ways []testpeer.Way, f func(t *testing.T, p peer)) {
	testpeer.Each(t, ways, func(t *testing.T, s testpeer.Server) {
		host, port := splitAddr(t, s.Addr)
		p := peer{name: s.Name, host: host, port: port, export: s.Export, knfsd: s.Knfsd}
		if s.Knfsd != nil {
			p.restart = s.Knfsd.Restart
		}
		if s.RDMA {
			p.opts = []string{"proto=rdma"}
		}
		if s.V2 {
			p.opts = append(p.opts, "rdmavers=2")
		}
		f(t, p)
	})
}

// forEachTransport runs f like forEachPeer, and also over RPC-over-RDMA:
// against knfsd's RDMA listener (version 2 probe, fallback to version 1)
// and against an in-process version-2 responder relaying to ganesha (no
// public server speaks version 2).
func forEachTransport(t *testing.T, f func(t *testing.T, p peer)) {
	forEachPeer(t, f)
	forEachRDMAPeer(t, f)
}

// forEachRDMAPeer runs f over RPC-over-RDMA only: knfsd's RDMA listener
// and the version-2 relay to ganesha.
func forEachRDMAPeer(t *testing.T, f func(t *testing.T, p peer)) {
	eachWay(t, []testpeer.Way{testpeer.KnfsdRDMA, testpeer.GaneshaRDMAv2(v2relay.Require)}, f)
}

// graceGanesha starts a ganesha of the test's own that keeps a grace
// period (not Graceless, RecoveryBackend fs), so that it can restart with
// its clients reclaiming their state.
func graceGanesha(t *testing.T) peer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := testpeer.StartGaneshaWith(ctx, testpeer.GaneshaOptions{Grace: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Stop(); err != nil {
			t.Error(err)
		}
	})
	host, port := splitAddr(t, g.Addr)
	return peer{name: "ganesha", host: host, port: port, export: g.Export, restart: g.Restart}
}

func splitAddr(t *testing.T, addr string) (string, string) {
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		t.Fatalf("bad address %q", addr)
	}
	return addr[:i], addr[i+1:]
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// rdmafsBin builds the command once per test binary.
func rdmafsBin(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		// Next to the test binary: go test removes its work directory.
		exe, err := os.Executable()
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(filepath.Dir(exe), "rdmafs")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// runBin runs rdmafs with args and returns its combined output and exit
// code.
func runBin(t *testing.T, timeout time.Duration, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, rdmafsBin(t), args...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("rdmafs %s: did not finish within %v; output:\n%s", strings.Join(args, " "), timeout, out)
	}
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("rdmafs %s: %v", strings.Join(args, " "), err)
		}
		code = ee.ExitCode()
	}
	return string(out), code
}

// mount mounts p's export (a fresh directory below it, made through a
// first mount of the export root when sub is true) in the background,
// and unmounts it when the test ends, also on failure.
func mount(t *testing.T, p peer, opts ...string) string {
	t.Helper()
	return mountWith(t, p, nil, opts...)
}

// mountWith is mount with command-line flags (such as -v and --log)
// before the mount options.
func mountWith(t *testing.T, p peer, flags []string, opts ...string) string {
	t.Helper()
	dir := mountDir(t)
	o := append(append([]string{"port=" + p.port}, p.opts...), opts...)
	args := append(append([]string{"mount"}, flags...), "-o", strings.Join(o, ","), p.source(), dir)
	if v := os.Getenv("RDMAFS_TEST_TRACE"); v != "" && flags == nil {
		args = append([]string{"mount", "-v", v, "--log", filepath.Join(os.TempDir(), "rdmafs-test.log")}, args[1:]...)
	}
	start := time.Now()
	out, code := runBin(t, 2*time.Minute, args...)
	if code != 0 {
		t.Fatalf("%s: rdmafs %s: exit %d: %s", p.name, strings.Join(args, " "), code, out)
	}
	t.Logf("%s: mounted in %v", p.name, time.Since(start).Round(time.Millisecond))
	pid := servingPIDOf(t, dir)
	t.Cleanup(func() { cleanupMount(t, dir, pid) })
	return dir
}

// dumpHungMount logs what the mount on dir is doing: its goroutines'
// stacks, then its statistics (the calls in flight on the session's
// slots), last so that the end of a long log shows them.
func dumpHungMount(t *testing.T, dir string) {
	if out, code := runBin(t, time.Minute, "stats", "--stacks", dir); code == 0 {
		t.Logf("rdmafs stats --stacks %s:\n%s", dir, out)
	}
	out, _ := runBin(t, time.Minute, "stats", dir)
	t.Logf("rdmafs stats %s:\n%s", dir, out)
}

// servingPIDOf asks the mount's stats socket for the serving process.
func servingPIDOf(t *testing.T, dir string) int {
	pid, ok := servingPID(dir)
	if !ok {
		t.Fatalf("no stats socket for %s", dir)
	}
	return pid
}

// cleanupMount unmounts dir if still mounted and makes sure its process
// is gone.
func cleanupMount(t *testing.T, dir string, pid int) {
	if ok, _ := isMountpoint(dir); ok {
		start := time.Now()
		out, code := runBin(t, 2*time.Minute, "umount", dir)
		t.Logf("rdmafs umount: %v", time.Since(start).Round(time.Millisecond))
		if code != 0 {
			t.Errorf("rdmafs umount %s: exit %d: %s", dir, code, out)
			if pid > 0 && !processGone(pid) {
				dumpHungMount(t, dir) // its stats socket lives until it exits
			}
			exec.Command("fusermount3", "-u", "-z", dir).Run()
		}
	}
	if pid > 0 && !processGone(pid) {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) && !processGone(pid) {
			time.Sleep(50 * time.Millisecond)
		}
		if !processGone(pid) {
			t.Errorf("rdmafs process %d still running after unmount; killing it", pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if ok, _ := isMountpoint(dir); ok {
		t.Errorf("%s still mounted", dir)
		exec.Command("fusermount3", "-u", "-z", dir).Run()
	}
}

// testDir makes a fresh directory for one test inside the mount.
func testDir(t *testing.T, mnt string) string {
	t.Helper()
	name := fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), rand.Uint32())
	d := filepath.Join(mnt, name)
	if err := os.Mkdir(d, 0o777); err != nil {
		t.Fatalf("mkdir in mount: %v", err)
	}
	return d
}

// sh runs a shell command line and fails the test on error.
func sh(t *testing.T, timeout time.Duration, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-ec", script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("sh -c %q: %v\n%s", script, err, out.String())
	}
	return out.String()
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		t.Fatalf("not a number: %q", s)
	}
	return v
}

// startPiped starts cmd with a pipe to its standard input and one from
// its standard output. The caller kills and waits for it.
func startPiped(t *testing.T, cmd *exec.Cmd) (io.WriteCloser, io.ReadCloser) {
	t.Helper()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", cmd.Path, err)
	}
	return in, out
}
