// Package testpeer starts the real NFS servers that rdmafs's integration
// tests talk to:
//
//   - Linux knfsd (NFSv4.1/4.2 over TCP and RPC-over-RDMA on soft-iWARP),
//     booted in a qemu guest by test/kpeer/run.sh; see test/kpeer/README.md.
//   - NFS-Ganesha (NFSv4.1/4.2 over TCP, VFS FSAL) run on the host.
//
// Every server gets free loopback ports and a private run directory, so test
// binaries of several packages can run at once. The knfsd build cache
// (test/kpeer/build) is shared and protected by a lock.
//
// A package with integration tests uses the package like this:
//
//	func TestMain(m *testing.M) { testpeer.Main(m) }
//
//	func TestKnfsdNull(t *testing.T) {
//		k := testpeer.RequireKnfsd(t) // started once per test binary
//		conn, err := net.Dial("tcp", k.TCPAddr)
//		...
//	}
//
// In -short mode RequireKnfsd and RequireGanesha skip the test. When a
// server cannot be started they fail it (never skip), with the server's log
// tail in the message.
//
// Environment:
//
//	RDMAFS_KNFSD_TCP=host:port      use this knfsd instead of starting one
//	RDMAFS_KNFSD_RDMA=host:port     its RPC-over-RDMA (iWARP) listener
//	RDMAFS_KNFSD_SHELL=host:port    its kpeer control shell (for Knfsd.Exec)
//	RDMAFS_GANESHA=host:port        use this Ganesha instead of starting one
//	RDMAFS_GANESHA_EXPORT=/path     its export's pseudo path (default /export)
//	RDMAFS_GANESHA_DIR=/dir         host dir backing that export (optional)
//	RDMAFS_TESTPEER_KEEP=1          keep run directories (logs) after Stop
//	RDMAFS_REPO_ROOT=/dir           repository root (default: found from the
//	                                working directory by walking up to go.mod)
//	KPEER_*                         passed through to test/kpeer/run.sh
//	                                (e.g. KPEER_BUILD_DIR, KPEER_TIMEOUT)
//
// Servers started through the package are stopped by [Main] (also on SIGINT
// and SIGTERM) or [StopAll]. As a last resort, when the test binary dies
// without cleaning up, run.sh's watcher kills the qemu and the kernel kills
// ganesha.nfsd (parent-death signal).
package testpeer

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const modulePath = "github.com/rdmafs/rdmafs"

// startAttempts is how often a server start is tried with fresh ports when
// the failure looks like a port collision.
const startAttempts = 3

// RepoRoot returns the root directory of the rdmafs repository: the
// RDMAFS_REPO_ROOT environment variable, or the first directory at or above
// the working directory whose go.mod declares module github.com/rdmafs/rdmafs.
func RepoRoot() (string, error) {
	if r := os.Getenv("RDMAFS_REPO_ROOT"); r != "" {
		return r, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("testpeer: repo root: %w", err)
	}
	for dir := wd; ; {
		if isModuleRoot(filepath.Join(dir, "go.mod")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("testpeer: no go.mod for module %s at or above %s (set RDMAFS_REPO_ROOT)", modulePath, wd)
		}
		dir = parent
	}
}

func isModuleRoot(gomod string) bool {
	f, err := os.Open(gomod)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "module" {
			return strings.Trim(fields[1], `"`) == modulePath
		}
	}
	return false
}

// freePorts returns n distinct free TCP ports on 127.0.0.1. The ports are
// released before returning, so a start using them can still collide with
// another process; callers retry.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("testpeer: free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func loopback(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }

// tail returns the last n lines of the named files, each headed by its name;
// unreadable files are skipped.
func tail(n int, files ...string) string {
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil || len(data) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > n {
			lines = lines[len(lines)-n:]
		}
		fmt.Fprintf(&b, "--- %s (last %d lines)\n%s\n", f, len(lines), strings.Join(lines, "\n"))
	}
	return b.String()
}

// newRunDir creates a private run directory /tmp/rdmafs-<kind>-* owned by
// this process (its PID in the file "owner"), after removing the run
// directories of earlier test processes that died without cleaning up.
func newRunDir(kind string) (string, error) {
	removeStaleRunDirs(kind)
	dir, err := os.MkdirTemp("", "rdmafs-"+kind+"-")
	if err != nil {
		return "", fmt.Errorf("testpeer: %s run dir: %w", kind, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("testpeer: %s run dir: %w", kind, err)
	}
	return dir, nil
}

// removeStaleRunDirs removes run directories whose owner process is gone
// and whose qemu (if any) is not running. RDMAFS_TESTPEER_KEEP=1 keeps them.
func removeStaleRunDirs(kind string) {
	if keepRunDirs() {
		return
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "rdmafs-"+kind+"-*"))
	for _, dir := range dirs {
		owner := readPID(filepath.Join(dir, "owner"))
		if owner == 0 || processAlive(owner) {
			continue
		}
		if q := readPID(filepath.Join(dir, "qemu.pid")); q != 0 && processAlive(q) && cmdlineContains(q, "qemu-system") {
			continue
		}
		_ = os.RemoveAll(dir)
	}
}

// readPID reads a PID file; 0 if missing or malformed.
func readPID(file string) int {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

func keepRunDirs() bool { return os.Getenv("RDMAFS_TESTPEER_KEEP") == "1" }

// processAlive reports whether pid exists (and is not a zombie we reaped).
func processAlive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

// cmdlineContains reports whether /proc/pid/cmdline contains s.
func cmdlineContains(pid int, s string) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(data, []byte(s))
}

// killAndWait sends SIGTERM to pid, waits up to grace for it to disappear,
// then SIGKILLs it. exited, when not nil, reports the exit of a child we
// wait for ourselves (a non-child can only be polled).
func killAndWait(pid int, grace time.Duration, exited <-chan struct{}) error {
	gone := func() bool {
		if exited != nil {
			select {
			case <-exited:
				return true
			default:
				return false
			}
		}
		return !processAlive(pid)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("testpeer: kill %d: %w", pid, err)
	}
	deadline := time.Now().Add(grace)
	for !gone() {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			deadline = time.Now().Add(5 * time.Second)
			for !gone() {
				if time.Now().After(deadline) {
					return fmt.Errorf("testpeer: pid %d did not exit after SIGKILL", pid)
				}
				time.Sleep(20 * time.Millisecond)
			}
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// waitTCP waits until addr accepts TCP connections, the process behind it
// exits (exited is closed), or the deadline passes.
func waitTCP(addr string, deadline time.Time, exited <-chan struct{}) error {
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("server exited before %s accepted connections", addr)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not accept connections: %w", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
