package fuse_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// guardEnv marks the test process that runs inside its own mount
// namespace.
const guardEnv = "RDMAFS_FUSE_TEST_GUARDED"

// guarded is the host file the tests could reach through a symlink on
// the mount: posixtest's OpenSymlinkRace swaps a symlink to /etc/passwd
// in and out of place and creates the same name with O_TRUNC. A client
// that ever answered that create from a stale name would truncate the
// host's /etc/passwd (it happened once, with code under development).
const guarded = "/etc/passwd"

// TestMain runs the package's tests in a private mount namespace in which
// guarded is a bind-mounted copy, and fails the run if the copy changed:
// a write through the mount that reached it is a bug, and it never
// reaches the real file.
func TestMain(m *testing.M) {
	if os.Getenv(guardEnv) == "" {
		os.Exit(reexecGuarded())
	}
	orig, err := os.ReadFile(guarded)
	if err != nil {
		fmt.Fprintf(os.Stderr, "guard: %v\n", err)
		os.Exit(2)
	}
	copyPath := filepath.Join(os.TempDir(), fmt.Sprintf("rdmafs-guard-%d", os.Getpid()))
	if err := os.WriteFile(copyPath, orig, 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "guard: %v\n", err)
		os.Exit(2)
	}
	defer os.Remove(copyPath)
	if err := unix.Mount(copyPath, guarded, "", unix.MS_BIND, ""); err != nil {
		fmt.Fprintf(os.Stderr, "guard: bind %s over %s: %v\n", copyPath, guarded, err)
		os.Exit(2)
	}
	code := testpeer.Run(m)
	if now, err := os.ReadFile(guarded); err != nil || !bytes.Equal(now, orig) {
		fmt.Fprintf(os.Stderr, "FAIL: a test wrote to %s through the mount (%d bytes before, %d after, err %v): a symlink was followed from a stale name\n", guarded, len(orig), len(now), err)
		code = 1
	}
	os.Exit(code)
}

// reexecGuarded runs this test binary again in a new mount namespace
// with private propagation (unshare(1)), and returns its exit code.
func reexecGuarded() int {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		fmt.Fprintf(os.Stderr, "guard: unshare(1) is needed (util-linux, make deps): %v\n", err)
		return 2
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "guard: %v\n", err)
		return 2
	}
	cmd := exec.Command(unshare, append([]string{"--mount", "--propagation", "private", "--", exe}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), guardEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "guard: %v\n", err)
		return 2
	}
	// unshare execs the test binary in place: pass it the signals go
	// test sends (SIGQUIT on a timeout), so it stops its servers.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT)
	go func() {
		for sig := range sigs {
			cmd.Process.Signal(sig)
		}
	}()
	err = cmd.Wait()
	signal.Stop(sigs)
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "guard: run the tests in a private mount namespace (needs root): %v\n", err)
		return 2
	}
	return 0
}
