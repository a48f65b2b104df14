package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// TestServerRestartUnderMount restarts the server while an application
// has a file open through the mount, holds a write lock on part of it and
// has written data that is still in rdmafs's write-back buffers or sent
// UNSTABLE. The application goes on writing without an error (rdmafs
// reclaims the open and the lock in the grace period and resends the
// unstable writes whose verifier changed: RFC 8881 s8.4.2, s18.32.3);
// afterwards another mount reads back exactly what was written and sees
// the lock still held.
func TestServerRestartUnderMount(t *testing.T) {
	run := func(t *testing.T, p peer) {
		mA, mB := mount(t, p), mount(t, p)
		d := testDir(t, mA)
		defer os.RemoveAll(d)
		pathA := filepath.Join(d, "f")
		pathB := filepath.Join(mB, filepath.Base(d), "f")

		data := make([]byte, 8<<20)
		rand.NewChaCha8([32]byte{1}).Read(data)
		half := len(data) / 2

		// The application is a process of its own: a fork of this test
		// process (ganesha's restart) would close a copy of its file
		// descriptor at exec, and that close's FLUSH waits for the server
		// being restarted.
		src := filepath.Join(t.TempDir(), "data")
		if err := os.WriteFile(src, data, 0o644); err != nil {
			t.Fatal(err)
		}
		app := startApp(t, pathA, src, half)
		app.step(t, "locked+written")

		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		start := time.Now()
		if err := p.restart(ctx); err != nil {
			t.Fatalf("%s: restart: %v", p.name, err)
		}
		t.Logf("%s: server restarted in %v", p.name, time.Since(start).Round(time.Millisecond))
		app.step(t, "synced")
		t.Logf("%s: application done %v after the restart", p.name, time.Since(start).Round(time.Millisecond))

		// The lock survived the restart: the other mount is refused and
		// told who holds what.
		fb, err := os.OpenFile(pathB, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer fb.Close()
		if err := setlk(fb, syscall.F_WRLCK, 100, 1, false); err != syscall.EAGAIN {
			t.Errorf("%s: F_SETLK through the other mount after the restart: %v, want EAGAIN", p.name, err)
		}
		if lk := getlk(t, fb, syscall.F_RDLCK, 0, 0); lk.Type != syscall.F_WRLCK || lk.Start != 0 || lk.Len != 4096 {
			t.Errorf("%s: F_GETLK through the other mount: type=%d start=%d len=%d, want write lock [0,+4096)", p.name, lk.Type, lk.Start, lk.Len)
		}
		got, err := os.ReadFile(pathB)
		if err != nil {
			t.Fatalf("%s: read back through the other mount: %v", p.name, err)
		}
		if !bytes.Equal(got, data) {
			t.Errorf("%s: read back %d bytes, differ from the %d written at byte %d", p.name, len(got), len(data), firstDiff(got, data))
		}
		app.step(t, "closed") // unlocks with the reclaimed lock, closes
		if err := setlk(fb, syscall.F_WRLCK, 0, 1, false); err != nil {
			t.Errorf("%s: F_SETLK through the other mount after the unlock: %v", p.name, err)
		}
		line := statsLine(t, mA, "server restarts:")
		var opens, locks, lost int
		if _, err := fmt.Sscanf(line, "server restarts: reclaimed_opens=%d reclaimed_locks=%d lost_opens=%d", &opens, &locks, &lost); err != nil {
			t.Errorf("%s: rdmafs stats: %q: %v", p.name, line, err)
		} else if opens < 1 || locks < 1 || lost != 0 {
			t.Errorf("%s: rdmafs stats: %q, want the open and the lock reclaimed, none lost", p.name, line)
		}
	}
	// Not through the v2 relay: its ganesha is shared and graceless.
	forEachPeer(t, func(t *testing.T, p peer) {
		if p.restart == nil {
			p = graceGanesha(t)
		}
		run(t, p)
	})
	eachWay(t, []testpeer.Way{testpeer.KnfsdRDMA}, run)
}

// restartApp is the application of TestServerRestartUnderMount: a
// process that opens a file, takes a write lock on its first 4 KiB,
// writes the first half of the data, then, when told, the rest, fsyncs,
// unlocks and closes, saying after each step that it is done (or why it
// failed).
type restartApp struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

const restartAppScript = `
import fcntl, os, sys
path, src, half = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = open(src, "rb").read()
def done(what):
    print(what, flush=True)
    sys.stdin.readline()
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 4096, 0)
os.pwrite(fd, data[:half], 0)
done("locked+written")
os.pwrite(fd, data[half:], half)
os.fsync(fd)
done("synced")
fcntl.lockf(fd, fcntl.LOCK_UN, 0, 0)
os.close(fd)
print("closed", flush=True)
`

func startApp(t *testing.T, path, src string, half int) *restartApp {
	t.Helper()
	cmd := exec.Command("python3", "-c", restartAppScript, path, src, strconv.Itoa(half))
	cmd.Stderr = testWriter{t, "app"}
	in, out := startPiped(t, cmd)
	a := &restartApp{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	t.Cleanup(func() {
		in.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return a
}

// step lets the application go on (after its first step) and waits until
// it says want.
func (a *restartApp) step(t *testing.T, want string) {
	t.Helper()
	if want != "locked+written" {
		if _, err := io.WriteString(a.in, "go\n"); err != nil {
			t.Fatalf("application: %v", err)
		}
	}
	if !a.out.Scan() {
		t.Fatalf("application exited before %q (its error is above): %v", want, a.cmd.Wait())
	}
	if got := a.out.Text(); got != want {
		t.Fatalf("application said %q, want %q", got, want)
	}
}

// firstDiff returns the index of the first byte where a and b differ.
func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
