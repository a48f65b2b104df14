package fuse_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fuse"
)

// TestURing serves mounts over FUSE-over-io_uring (make deps turns the
// kernel's enable_uring on) and checks that the requests really came
// through the rings and that the file system works the same: data both
// ways, metadata, a mapping, and an interrupted request (INTERRUPT
// comes on /dev/fuse and must find a request that came by a ring).
func TestURing(t *testing.T) {
	tcpPeers(t, func(t *testing.T, p peer) {
		mnt, m := mountPeer(t, p, fuse.Options{URing: fuse.URingOn})
		if got := m.FS.FUSETransport(); got != "io_uring" {
			t.Fatalf("FUSE transport %q, want io_uring", got)
		}
		d := freshDir(t, mnt)
		defer os.RemoveAll(d)
		before := m.FS.RingRequests()

		// Data: larger than one request both ways, buffered and direct.
		want := make([]byte, 5<<20+123)
		r := rand.New(rand.NewPCG(7, 7))
		for i := range want {
			want[i] = byte(r.Uint32())
		}
		name := filepath.Join(d, "data")
		if err := os.WriteFile(name, want, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("read back %d bytes that differ from the %d written", len(got), len(want))
		}
		f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_DIRECT, 0)
		if err != nil {
			t.Fatal(err)
		}
		al := alignedBlock(make([]byte, 1<<20+4096), 1<<20)
		if n, err := f.ReadAt(al, 1<<20); err != nil || n != len(al) || !bytes.Equal(al, want[1<<20:2<<20]) {
			t.Fatalf("O_DIRECT read: %d bytes, %v, equal %v", n, err, bytes.Equal(al[:n], want[1<<20:1<<20+n]))
		}
		f.Close()

		// A mapping of the file.
		mf, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		mem, err := unix.Mmap(int(mf.Fd()), 0, 1<<20, unix.PROT_READ, unix.MAP_SHARED)
		mf.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(mem, want[:1<<20]) {
			t.Error("mapped bytes differ")
		}
		unix.Munmap(mem)

		// Metadata.
		sub := filepath.Join(d, "sub")
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range 50 {
			if err := os.WriteFile(filepath.Join(sub, "f"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+string(rune('a'+i/26))), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		ents, err := os.ReadDir(sub)
		if err != nil || len(ents) != 50 {
			t.Fatalf("readdir: %d entries, %v", len(ents), err)
		}
		if err := os.Rename(name, filepath.Join(sub, "moved")); err != nil {
			t.Fatal(err)
		}
		if st, err := os.Stat(filepath.Join(sub, "moved")); err != nil || st.Size() != int64(len(want)) {
			t.Fatalf("stat after rename: %v, %v", st, err)
		}
		if err := os.RemoveAll(sub); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(sub); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("stat of a removed directory: %v", err)
		}

		// The requests came over the rings.
		if n := m.FS.RingRequests() - before; n < 100 {
			t.Errorf("%d requests over io_uring for all that; want most of them", n)
		}

		// An interrupted request: a child blocked in a lock wait is
		// killed; the kernel sends INTERRUPT on /dev/fuse for the
		// SETLKW that came over a ring.
		lockName := filepath.Join(d, "lock")
		if err := os.WriteFile(lockName, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		holder, err := os.OpenFile(lockName, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close()
		if err := unix.Flock(int(holder.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("flock", "-x", lockName, "true")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case err := <-exited:
			t.Fatalf("flock(1) ended (%v) while another open file holds the lock", err)
		case <-time.After(time.Second):
		}
		cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-exited:
		case <-time.After(2 * time.Minute):
			t.Fatal("the killed waiter did not go away: the INTERRUPT was lost")
		}
	})
}

// alignedBlock returns n bytes of buf that start on a 4 KiB boundary.
func alignedBlock(buf []byte, n int) []byte {
	off := 0
	for uintptr(unsafe.Pointer(&buf[off]))%4096 != 0 {
		off++
	}
	return buf[off : off+n]
}
