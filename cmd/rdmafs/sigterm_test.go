package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/internal/testpeer"
)

// TestSIGTERMServerGone checks that SIGTERM ends the serving process
// even when the server has gone away with written data still buffered
// and the FUSE connection was aborted, so the unmount the signal asks for
// cannot happen: a hard mount retries its write-back for ever, and the
// signal is the user's way out. The process must exit (not hang), and
// say that data was not written.
func TestSIGTERMServerGone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := testpeer.StartGanesha(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			g.Stop()
		}
	})
	host, port := splitAddr(t, g.Addr)
	p := peer{name: "ganesha", host: host, port: port, export: g.Export}
	logFile := filepath.Join(t.TempDir(), "rdmafs.log")
	mnt := mountWith(t, p, []string{"-v", "fuse,nfs", "--log", logFile})
	pid := servingPIDOf(t, mnt)
	d := testDir(t, mnt)

	// A writer that keeps its file open, so its data stays buffered.
	writer := exec.Command("python3", "-c", `
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, b"x" * (256 << 10))
print("written", flush=True)
time.sleep(3600)
`, filepath.Join(d, "dirty"))
	out, err := writer.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	if n, err := out.Read(buf); err != nil || !strings.HasPrefix(string(buf[:n]), "written") {
		t.Fatalf("writer: %q %v", buf[:n], err)
	}

	if err := g.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		t.Fatal(err)
	}
	abortFUSE(t, st.Dev)
	writer.Process.Kill()
	writer.Wait()

	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Not a timing limit: a process that has not exited in this long has
	// hung. The shutdown's own bound is well inside it.
	deadline := time.Now().Add(3 * time.Minute)
	for !processGone(pid) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	log, _ := os.ReadFile(logFile)
	if !processGone(pid) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("rdmafs %d still running 3 minutes after SIGTERM; log:\n%s", pid, log)
	}
	t.Logf("log:\n%s", log)
	if !strings.Contains(string(log), "not written") {
		t.Errorf("log does not say that buffered data was not written:\n%s", log)
	}
	exec.Command("fusermount3", "-u", "-z", mnt).Run()
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := testpeer.StartGanesha(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Stop() })
	host, port := splitAddr(t, g.Addr)
	p := peer{name: "ganesha", host: host, port: port, export: g.Export}
	logFile := filepath.Join(t.TempDir(), "rdmafs.log")
	mnt := mountWith(t, p, []string{"-v", "fuse,nfs", "--log", logFile})
	pid := servingPIDOf(t, mnt)
	d := testDir(t, mnt)

	// A writer whose close(2) waits for the write-back.
	writer := exec.Command("python3", "-c", `
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, b"x" * (256 << 10))
print("written", flush=True)
sys.stdin.read(1)
try:
    os.close(fd)
except OSError as e:
    print(e, flush=True)
`, filepath.Join(d, "dirty"))
	in, err := writer.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := writer.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	defer writer.Process.Kill()
	buf := make([]byte, 16)
	if n, err := out.Read(buf); err != nil || !strings.HasPrefix(string(buf[:n]), "written") {
		t.Fatalf("writer: %q %v", buf[:n], err)
	}
	if err := g.Pause(); err != nil {
		t.Fatal(err)
	}
	in.Write([]byte("c"))
	// Wait until the FLUSH's WRITE has gone out (the trace logs a
	// COMPOUND when it completes, so look for the FUSE line before it).
	for !strings.Contains(readFile(logFile), "fuse WRITE ino=") {
		time.Sleep(10 * time.Millisecond)
	}

	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		t.Fatal(err)
	}
	abortFUSE(t, st.Dev)
	for range 2 {
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Not a timing limit: the shutdown's own bound is a minute.
	deadline := time.Now().Add(3 * time.Minute)
	for !processGone(pid) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	log := readFile(logFile)
	if !processGone(pid) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("rdmafs %d still running 3 minutes after two SIGTERMs; log:\n%s", pid, log)
	}
	t.Logf("log:\n%s", log)
	if !strings.Contains(log, "not written") {
		t.Errorf("log does not say that buffered data was not written:\n%s", log)
	}
	exec.Command("fusermount3", "-u", "-z", mnt).Run()
}

func readFile(name string) string {
	b, _ := os.ReadFile(name)
	return string(b)
}
