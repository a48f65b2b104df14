package main

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// TestSIGTERMServerGone checks that SIGTERM ends the serving process
// even when the server has gone away with written data still buffered
// and the FUSE connection was aborted, so the unmount the signal asks for
// cannot happen: a hard mount retries its write-back for ever, and the
// signal is the user's way out. The process must exit (not hang), and
// say that data was not written.
func TestSIGTERMServerGone(t *testing.T) {
	g, m := mountLogged(t)
	d := testDir(t, m.dir)

	// A writer that keeps its file open, so its data stays buffered.
	writer := startWriter(t, filepath.Join(d, "dirty"))

	if err := g.Stop(); err != nil {
		t.Fatal(err)
	}
	m.abort(t)
	writer.Close() // the FUSE connection is gone: no FLUSH or RELEASE
	m.terminate(t, 1)
}

// abortFUSE aborts the FUSE connection of the mount on device dev, as
// `echo 1 > /sys/fs/fuse/connections/N/abort` does.
func abortFUSE(t *testing.T, dev uint64) {
	t.Helper()
	conns := "/sys/fs/fuse/connections"
	if _, err := os.Stat(filepath.Join(conns, "0")); err != nil {
		if ents, _ := os.ReadDir(conns); len(ents) == 0 {
			if err := unix.Mount("none", conns, "fusectl", 0, ""); err != nil && err != unix.EBUSY {
				t.Fatalf("mount fusectl: %v", err)
			}
		}
	}
	p := filepath.Join(conns, strconv.FormatUint(uint64(unix.Minor(dev)), 10), "abort")
	if err := os.WriteFile(p, []byte("1"), 0o200); err != nil {
		t.Fatalf("abort FUSE connection: %v", err)
	}
}

// TestSIGTERMServerSilent is TestSIGTERMServerGone with a server that
// stops answering (paused, its connections open) while an application
// is in close(2): the FLUSH's write-back waits for the server, so the
// FUSE request is still being served when the connection is aborted.
// The first SIGTERM asks for the unmount; the second must end the wait
// and the process, saying that data was not written.
func TestSIGTERMServerSilent(t *testing.T) {
	g, m := mountLogged(t)
	d := testDir(t, m.dir)

	// A writer whose close(2) waits for the write-back.
	writer := startWriter(t, filepath.Join(d, "dirty"))
	if err := g.Pause(); err != nil {
		t.Fatal(err)
	}
	go writer.Close()
	// Wait until the FLUSH's WRITE has gone out (the trace logs a
	// COMPOUND when it completes, so look for the FUSE line before it).
	for !strings.Contains(readFile(m.log), "fuse WRITE ino=") {
		time.Sleep(10 * time.Millisecond)
	}
	m.abort(t)
	m.terminate(t, 2)
}

// loggedMount is a mount over ganesha whose serving process traces fuse
// and nfs events to log.
type loggedMount struct {
	dir, log string
	pid      int
}

// mountLogged starts a ganesha of the test's own and mounts it.
func mountLogged(t *testing.T) (*testpeer.Ganesha, loggedMount) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := testpeer.StartGanesha(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Stop() })
	host, port := splitAddr(t, g.Addr)
	p := peer{name: "ganesha", host: host, port: port, export: g.Export}
	m := loggedMount{log: filepath.Join(t.TempDir(), "rdmafs.log")}
	m.dir = mountWith(t, p, []string{"-v", "fuse,nfs", "--log", m.log})
	m.pid = servingPIDOf(t, m.dir)
	return g, m
}

// abort aborts the mount's FUSE connection.
func (m loggedMount) abort(t *testing.T) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(m.dir, &st); err != nil {
		t.Fatal(err)
	}
	abortFUSE(t, st.Dev)
}

// terminate sends the serving process n SIGTERMs and checks that it
// exits saying that buffered data was not written.
func (m loggedMount) terminate(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		if i > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		if err := syscall.Kill(m.pid, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	// Not a timing limit: a process that has not exited in this long has
	// hung. The shutdown's own bound (a minute) is well inside it.
	deadline := time.Now().Add(3 * time.Minute)
	for !processGone(m.pid) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	log := readFile(m.log)
	if !processGone(m.pid) {
		syscall.Kill(m.pid, syscall.SIGKILL)
		t.Fatalf("rdmafs %d still running 3 minutes after %d SIGTERM; log:\n%s", m.pid, n, log)
	}
	t.Logf("log:\n%s", log)
	if !strings.Contains(log, "not written") {
		t.Errorf("log does not say that buffered data was not written:\n%s", log)
	}
	exec.Command("fusermount3", "-u", "-z", m.dir).Run()
}

// startWriter starts a process that writes 256 KiB to a new file name
// and keeps it open; Close makes it close(2) the file and exit, and waits
// for that.
func startWriter(t *testing.T, name string) io.Closer {
	t.Helper()
	cmd := exec.Command("python3", "-c", `
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, b"x" * (256 << 10))
print("written", flush=True)
sys.stdin.read(1)
try:
    os.close(fd)
except OSError as e:
    print(e, flush=True)
`, name)
	in, out := startPiped(t, cmd)
	var waited sync.Once
	wait := func() { waited.Do(func() { cmd.Wait() }) }
	t.Cleanup(func() { cmd.Process.Kill(); wait() })
	buf := make([]byte, 16)
	if n, err := out.Read(buf); err != nil || !strings.HasPrefix(string(buf[:n]), "written") {
		t.Fatalf("writer: %q %v", buf[:n], err)
	}
	return closerFunc(func() error {
		_, err := in.Write([]byte("c"))
		wait()
		return err
	})
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

func readFile(name string) string {
	b, _ := os.ReadFile(name)
	return string(b)
}
