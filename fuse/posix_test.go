package fuse_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/posixtest"
	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/rpcrdma"
	"github.com/rdmafs/rdmafs/test/fusetest"
	"github.com/rdmafs/rdmafs/test/testpeer"
	"github.com/rdmafs/rdmafs/test/testpeer/v2relay"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// peer is a real NFSv4.1 server.
type peer struct {
	name, addr, export string
	rdma, v2           bool // RPC-over-RDMA (version 2 only when v2)
	limitsOf           string
	deleg              bool // let OPEN hand out delegations
	minor              int  // NFSv4 minor version; 0: the client's default (4.2, or 4.1)
}

// forEachPeer runs f on every server of the matrix (test/testpeer): over
// TCP (tcpPeers), then over RPC-over-RDMA: knfsd's RDMA listener
// (negotiation falls back to version 1), and version 2 through our
// responder relaying to ganesha.
func forEachPeer(t *testing.T, f func(t *testing.T, p peer)) {
	eachWay(t, []testpeer.Way{testpeer.KnfsdTCP, testpeer.GaneshaTCP, testpeer.KnfsdRDMA, testpeer.GaneshaRDMAv2(v2relay.Require)}, f)
}

// eachWay runs f on the servers of ways.
func eachWay(t *testing.T, ways []testpeer.Way, f func(t *testing.T, p peer)) {
	testpeer.Each(t, ways, func(t *testing.T, s testpeer.Server) {
		f(t, peer{name: s.Name, addr: s.Addr, export: s.Export, rdma: s.RDMA, v2: s.V2, limitsOf: s.Kind})
	})
}

// transport makes p's RPC transport.
func (p peer) transport() oncrpc.Transport {
	if !p.rdma {
		return oncrpc.NewTCPTransport(p.addr, oncrpc.TCPOptions{})
	}
	cfg := rpcrdma.Config{Provider: &iwarp.Provider{}, AcceptInvalidate: true}
	if p.v2 {
		cfg.Version, cfg.XChars = rpcrdma.Version2, true
	}
	return rpcrdma.NewTransport(p.addr, cfg)
}

// mountPeer mounts p's export in this process and unmounts it when the
// test ends, also when it fails.
func mountPeer(t *testing.T, p peer, opts fuse.Options) (string, *fuse.Mount) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := nfsclient.Dial(ctx, nfsclient.Config{
		Transport:    p.transport(),
		Export:       p.export,
		RPC:          oncrpc.ClientOptions{Timeout: 30 * time.Second, Retrans: 3},
		Tracer:       opts.Tracer,
		Delegations:  p.deleg,
		MinorVersion: p.minor,
	})
	if err != nil {
		t.Fatalf("%s: dial: %v", p.name, err)
	}
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	opts.FSName = p.addr + ":" + p.export
	if opts.URing == fuse.URingOff && os.Getenv("RDMAFS_URING") == "on" {
		// make test's second pass: every mount over io_uring.
		opts.URing = fuse.URingOn
	}
	m, err := fuse.Serve(ctx, fuse.NFSClient(c), dir, opts)
	if err != nil {
		c.Close(ctx)
		t.Fatalf("%s: mount: %v", p.name, err)
	}
	fusetest.UnmountAtCleanup(t, m, dir)
	return dir, m
}

func freshDir(t *testing.T, parent string) string {
	t.Helper()
	d := filepath.Join(parent, fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), rand.Uint32()))
	if err := os.Mkdir(d, 0o777); err != nil {
		t.Fatal(err)
	}
	return d
}

// knownFailure is a posixtest case that fails for a reason that is not
// a bug to fix here: why, and the messages it fails with (any one).
type knownFailure struct {
	why  string
	msgs []string
	// race marks a case whose failure depends on winning a race: it
	// may pass a run, but when it fails it must fail with msgs.
	race bool
}

// failLocally are the posixtest cases that fail on a local tmpfs or
// ext4 directory as well (TestPosixLocal shows it): they test
// FUSE-specific behaviour of go-fuse's own file systems.
var failLocally = map[string]knownFailure{
	// POSIX locks belong to the process: a second lock by the same
	// process succeeds on ext4 and tmpfs too.
	"FcntlFlockLocksFile": {
		why:  "fcntl locks of one process do not conflict",
		msgs: []string{"FcntlFlock returned <nil>, expected EAGAIN"},
	},
	// Races a symlink swap to /etc/passwd against open, and calls it an
	// attack when the opened file is on the test directory's file
	// system: a local open follows the symlink, so the case fails where
	// the directory shares /etc/passwd's file system (ext4 /tmp), and
	// passes on any other (tmpfs).
	"OpenSymlinkRace": {
		why:  "open follows a symlink to /etc/passwd on the same file system",
		msgs: []string{"successful symlink attack"},
		race: true,
	},
}

// failOnMount are the posixtest cases that fail through the mount.
var failOnMount = map[string]knownFailure{
	// Without FUSE lock support the kernel keeps POSIX locks itself,
	// as a local file system does.
	"FcntlFlockLocksFile": failLocally["FcntlFlockLocksFile"],
	// The symlink is never followed to /etc/passwd (another file system),
	// but the race fails otherwise: an open that races the rename over
	// its file gets ESTALE (the handle it looked up is gone on the
	// server; FUSE does not redo the lookup as the kernel NFS client
	// does), and an open or create interrupted by a signal (the Go
	// runtime's preemption signal) is abandoned with EINTR, which
	// posixtest's raw syscalls do not retry.
	"OpenSymlinkRace": {
		why:  "ESTALE or EINTR from an open racing a rename over its file",
		msgs: []string{"stale file handle", "interrupted system call"},
		race: true,
	},
}

// knownSkip is a posixtest case that skips itself where it cannot run,
// for a reason that is not a bug to fix here: why, and the message the
// skip carries. Such a case runs in a child process and must skip there
// with that message: the skip is the behaviour asserted.
type knownSkip struct {
	why, msg string
	// mayPass marks a skip that depends on the server's timing: the
	// case may pass instead, but it must not fail.
	mayPass bool
}

// skipOnMount are the posixtest cases that skip themselves through the
// mount.
var skipOnMount = map[string]knownSkip{
	// No O_TMPFILE over FUSE here: the open fails with EOPNOTSUPP.
	"Tmpfile": {why: "no O_TMPFILE through the mount", msg: "FS does not support O_TMPFILE: operation not supported"},
	// A server without extended attributes (NFSv4.1 has none; RFC 8276
	// adds them to NFSv4.2): setxattr(2) and getxattr(2) fail with
	// EOPNOTSUPP. TestPosix runs them where v42Support says XATTR.
	"XAttr":      {why: "no extended attributes on the server", msg: "does not support xattrs"},
	"XAttrLarge": {why: "no extended attributes on the server", msg: "Setxattr: operation not supported"},
}

// expectSkip returns how posixtest case name skips itself in dir (through
// the mount when mounted), or nil when it must run. On a local directory
// only XAttrLarge skips, on ext4, whose extended attribute values are
// limited to one block.
func expectSkip(t *testing.T, name, dir string, mounted bool) *knownSkip {
	t.Helper()
	if mounted {
		if s, ok := skipOnMount[name]; ok {
			return &s
		}
		return nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if name == "XAttrLarge" && fs.Type == unix.EXT4_SUPER_MAGIC {
		return &knownSkip{why: "ext4 limits an extended attribute value to one block", msg: "Setxattr: no space left on device"}
	}
	return nil
}

// checkSkips runs case name in dir and asserts that it skips as s says.
func checkSkips(t *testing.T, name, dir string, s *knownSkip) {
	t.Helper()
	failed, out := runPosixCase(t, name, dir)
	if s.mayPass && !failed && strings.Contains(out, "--- PASS: TestPosixCaseChild") {
		t.Logf("%s passed; it may skip (%s): %q", name, s.why, s.msg)
		return
	}
	if failed || !strings.Contains(out, "--- SKIP: TestPosixCaseChild") || !strings.Contains(out, s.msg) {
		t.Errorf("%s: expected to skip with %q (%s); got:\n%s", name, s.msg, s.why, out)
		return
	}
	t.Logf("%s skips as expected (%s): %q", name, s.why, s.msg)
}

// expectFailure returns how posixtest case name fails in dir (through
// the mount when mounted), or nil when it must pass.
func expectFailure(t *testing.T, name, dir string, mounted bool) *knownFailure {
	t.Helper()
	if mounted {
		if f, ok := failOnMount[name]; ok {
			return &f
		}
		return nil
	}
	f, ok := failLocally[name]
	if !ok || (name == "OpenSymlinkRace" && !sameDevice(t, dir, "/etc/passwd")) {
		return nil
	}
	return &f
}

func sameDevice(t *testing.T, a, b string) bool {
	t.Helper()
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Dev == sb.Dev
}

// runPosixCase runs posixtest case name in dir, in a child process so
// that a failure can be observed rather than failing this test, and
// returns whether it failed and its output.
func runPosixCase(t *testing.T, name, dir string) (bool, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^TestPosixCaseChild$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "RDMAFS_POSIX_CASE="+name, "RDMAFS_POSIX_DIR="+dir)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s: did not finish in 5 minutes:\n%s", name, out)
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("%s: %v", name, err)
	}
	failed := err != nil
	if failed != strings.Contains(string(out), "--- FAIL: TestPosixCaseChild") || !failed && !strings.Contains(string(out), "--- PASS: TestPosixCaseChild") && !strings.Contains(string(out), "--- SKIP: TestPosixCaseChild") {
		t.Fatalf("%s: exit %v, but the output disagrees:\n%s", name, err, out)
	}
	return failed, string(out)
}

// checkPosixCase runs case name in dir, asserting that it fails with one
// of the expected messages where expectFailure says it fails, and passes
// elsewhere. A race (OpenSymlinkRace) may pass a run where it could
// fail: it gets three runs to show the failure, and passing all three
// is logged, not an error (on a quiet 2-core machine the race is
// sometimes never won); a failure must still carry an expected message.
func checkPosixCase(t *testing.T, name, dir string, mounted bool) {
	t.Helper()
	if s := expectSkip(t, name, dir, mounted); s != nil {
		checkSkips(t, name, dir, s)
		return
	}
	f := expectFailure(t, name, dir, mounted)
	if f == nil {
		_, local := failLocally[name]
		_, onMount := failOnMount[name]
		if !local && !onMount {
			// A skip that expectSkip does not list is an error: the
			// case did not test what it says.
			defer func() {
				if t.Skipped() {
					t.Errorf("%s skipped itself in %s, where it should run", name, dir)
				}
			}()
			posixtest.All[name](t, dir)
			return
		}
		if failed, out := runPosixCase(t, name, dir); failed || strings.Contains(out, "--- SKIP: TestPosixCaseChild") {
			t.Errorf("%s failed or skipped in %s, where it should pass:\n%s", name, dir, out)
		}
		return
	}
	checkFails(t, name, dir, f, mounted)
}

// checkFails runs case name in dir and asserts that it fails as f says.
func checkFails(t *testing.T, name, dir string, f *knownFailure, mounted bool) {
	t.Helper()
	var out string
	for i := range 3 {
		// A fresh directory per run: a run of OpenSymlinkRace ends with
		// its file a symlink to /etc/passwd, which the next run's first
		// open(O_WRONLY|O_CREAT|O_TRUNC) would follow and truncate.
		run := filepath.Join(dir, fmt.Sprintf("run%d", i))
		if err := os.Mkdir(run, 0o755); err != nil {
			t.Fatal(err)
		}
		var failed bool
		if failed, out = runPosixCase(t, name, run); failed {
			break
		}
	}
	if !strings.Contains(out, "--- FAIL: TestPosixCaseChild") {
		if f.race {
			t.Logf("%s: the race (%s) was not won in three runs", name, f.why)
			return
		}
		t.Errorf("%s: expected to fail (%s), but passed three times:\n%s", name, f.why, out)
		return
	}
	if mounted && strings.Contains(out, "successful symlink attack") {
		t.Errorf("%s: a symlink was followed through the mount:\n%s", name, out)
		return
	}
	for _, msg := range f.msgs {
		if strings.Contains(out, msg) {
			t.Logf("%s fails as expected (%s): %q", name, f.why, msg)
			return
		}
	}
	t.Errorf("%s: expected to fail with one of %q (%s); got:\n%s", name, f.msgs, f.why, out)
}

// checkFallocate checks that fallocate(2), in both modes posixtest uses
// (Fallocate and FallocateKeepSize), fails with EOPNOTSUPP and leaves the
// file as it was, on a server without ALLOCATE (NFSv4.2, RFC 7862
// s15.1; NFSv4.1 has none): Linux's client fails fallocate the same way.
func checkFallocate(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "file"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, mode := range []uint32{0, unix.FALLOC_FL_KEEP_SIZE} {
		if err := unix.Fallocate(int(f.Fd()), mode, 1024, 4096); !errors.Is(err, unix.EOPNOTSUPP) {
			t.Errorf("fallocate(mode=%#x): %v, want EOPNOTSUPP", mode, err)
		}
	}
	fi, err := f.Stat()
	if err != nil || fi.Size() != 0 {
		t.Errorf("after the failed fallocates: %v, %v, want size 0", err, fi)
	}
}

// serverLimits are cases a server gets wrong whatever the client does:
// through the mount they must fail, with their message.
var serverLimits = map[string]map[string]knownFailure{
	"ganesha": {
		// SETATTR of time_modify on a symlink returns NFS4_OK and
		// leaves the time unchanged (VFS FSAL).
		"SetattrSymlink": {
			why:  "ganesha's VFS FSAL ignores times set on symlinks",
			msgs: []string{"want 43"},
		},
	},
}

func posixCases() []string {
	var names []string
	for n := range posixtest.All {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// TestPosixLocal runs go-fuse's POSIX tests on a local directory, to tell
// which failures are not ours: the cases in failLocally must fail here
// too, with their message, and every other case must pass (XAttrLarge
// skips itself on ext4, asserted by expectSkip). It runs on the test's
// temporary directory (the root file system's ext4 here) and on /dev/shm
// (tmpfs), where OpenSymlinkRace passes.
func TestPosixLocal(t *testing.T) {
	bases := map[string]string{"tmp": t.TempDir()}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		shm, err := os.MkdirTemp("/dev/shm", "rdmafs-posix-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(shm) })
		bases["shm"] = shm
	}
	for where, base := range bases {
		t.Run(where, func(t *testing.T) {
			for _, name := range posixCases() {
				t.Run(name, func(t *testing.T) {
					checkPosixCase(t, name, freshDir(t, base), false)
				})
			}
		})
	}
}

// TestPosix runs go-fuse's POSIX tests through the mount. The cases in
// failOnMount, and in serverLimits for the server, must fail with their
// messages, those in skipOnMount must skip themselves with theirs;
// Fallocate and FallocateKeepSize must fail with EOPNOTSUPP where the
// server has no ALLOCATE, and pass where it has; XAttr and XAttrLarge
// must pass where the server has xattrs (v42Support). No case is skipped
// by this test.
func TestPosix(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		mnt, _ := mountPeer(t, p, fuse.Options{})
		for _, name := range posixCases() {
			t.Run(name, func(t *testing.T) {
				d := freshDir(t, mnt)
				defer os.RemoveAll(d)
				if f, ok := serverLimits[p.limitsOf][name]; ok {
					checkFails(t, name, d, &f, true)
					return
				}
				if (name == "Fallocate" || name == "FallocateKeepSize") && !v42Support[p.limitsOf]["ALLOCATE"] {
					checkFallocate(t, d)
					return
				}
				if (name == "XAttr" || name == "XAttrLarge") && v42Support[p.limitsOf]["XATTR"] {
					// NFSv4.2 xattrs (RFC 8276): the case runs.
					mustRun(t, name, d)
					return
				}
				checkPosixCase(t, name, d, true)
			})
		}
	})
}

// mustRun runs case name in dir, which must neither fail nor skip.
func mustRun(t *testing.T, name, dir string) {
	t.Helper()
	defer func() {
		if t.Skipped() {
			t.Errorf("%s skipped itself in %s, where it should run", name, dir)
		}
	}()
	posixtest.All[name](t, dir)
}

// TestPosixCaseChild runs one posixtest case for runPosixCase, in a
// child process: RDMAFS_POSIX_CASE names it, RDMAFS_POSIX_DIR is where.
func TestPosixCaseChild(t *testing.T) {
	name, dir := os.Getenv("RDMAFS_POSIX_CASE"), os.Getenv("RDMAFS_POSIX_DIR")
	if name == "" {
		t.Skip("runs only as runPosixCase's child")
	}
	posixtest.All[name](t, dir)
}
