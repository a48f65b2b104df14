package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestDirectIOMmap maps a file opened with O_DIRECT (xfstests generic/091
// and 263: fsx mixes O_DIRECT and mmap; "domapwrite: mmap: No such
// device" before FUSE_DIRECT_IO_ALLOW_MMAP): writes through the map reach
// the file, O_DIRECT writes show in the map, and another descriptor reads
// what both wrote.
func TestDirectIOMmap(t *testing.T) {
	p := ganeshaPeer(t)
	mnt := mount(t, p)
	d := testDir(t, mnt)
	defer os.RemoveAll(d)
	name := filepath.Join(d, "f")
	const size = 64 << 10
	if err := os.WriteFile(name, bytes.Repeat([]byte{'a'}, size), 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(name, unix.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	m, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("mmap MAP_SHARED of a file opened with O_DIRECT: %v", err)
	}
	defer unix.Munmap(m)
	// Through the map, then msync: the data reaches the server.
	copy(m[4096:], bytes.Repeat([]byte{'m'}, 4096))
	if err := unix.Msync(m, unix.MS_SYNC); err != nil {
		t.Fatalf("msync: %v", err)
	}
	// O_DIRECT read of what the map wrote (aligned buffer: mmap'd).
	buf, err := unix.Mmap(-1, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	if n, err := unix.Pread(fd, buf[:4096], 4096); err != nil || n != 4096 || !bytes.Equal(buf[:4096], bytes.Repeat([]byte{'m'}, 4096)) {
		t.Errorf("O_DIRECT read of the page written through the map: %d %v %q...", n, err, buf[:8])
	}
	// O_DIRECT write; the map shows it.
	copy(buf[:4096], bytes.Repeat([]byte{'d'}, 4096))
	if n, err := unix.Pwrite(fd, buf[:4096], 8192); err != nil || n != 4096 {
		t.Fatalf("O_DIRECT write: %d %v", n, err)
	}
	if !bytes.Equal(m[8192:8192+4096], buf[:4096]) {
		t.Errorf("the map does not show the O_DIRECT write: %q...", m[8192:8200])
	}
	// A private map of the same descriptor works too.
	pm, err := unix.Mmap(fd, 0, size, unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("mmap MAP_PRIVATE of a file opened with O_DIRECT: %v", err)
	}
	defer unix.Munmap(pm)
	want := bytes.Repeat([]byte{'a'}, size)
	copy(want[4096:], bytes.Repeat([]byte{'m'}, 4096))
	copy(want[8192:], bytes.Repeat([]byte{'d'}, 4096))
	if !bytes.Equal(pm, want) {
		t.Error("private map differs from what was written")
	}
	if got, err := os.ReadFile(name); err != nil || !bytes.Equal(got, want) {
		t.Errorf("read through another descriptor: %v; equal %v", err, bytes.Equal(got, want))
	}
}
