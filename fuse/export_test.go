package fuse_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fuse"
)

// dropCaches makes the kernel forget the mount's unused inodes and
// dentries (as xfstests' open_by_handle -d does): FUSE sends FORGET.
func dropCaches(t *testing.T) {
	t.Helper()
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0o644); err != nil {
		t.Fatalf("drop caches (needs root): %v", err)
	}
}

// TestOpenByHandle is xfstests generic/426 and 467 in short: handles
// from name_to_handle_at of files and directories still open after the
// kernel dropped its inodes (the node is made again from the NFS file
// handle), a directory's handle reconnects to the tree (LOOKUP ".."),
// and the handle of a removed file fails with ESTALE.
func TestOpenByHandle(t *testing.T) {
	tcpPeers(t, func(t *testing.T, p peer) {
		mnt, _ := mountPeer(t, p, fuse.Options{})
		top := freshDir(t, mnt)
		sub := filepath.Join(top, "sub", "subsub")
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		data := []byte("open_by_handle_at through rdmafs\n")
		file := filepath.Join(sub, "file")
		gone := filepath.Join(top, "gone")
		for _, name := range []string{file, gone} {
			if err := os.WriteFile(name, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		handle := func(path string) unix.FileHandle {
			h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, path, 0)
			if err != nil {
				t.Fatalf("name_to_handle_at %s: %v", path, err)
			}
			return h
		}
		hFile, hDir, hGone := handle(file), handle(sub), handle(gone)
		if err := os.Remove(gone); err != nil {
			t.Fatal(err)
		}
		mfd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(mfd)

		dropCaches(t)
		fd, err := unix.OpenByHandleAt(mfd, hFile, unix.O_RDONLY)
		if err != nil {
			t.Fatalf("open_by_handle_at of a file after drop_caches: %v", err)
		}
		got := make([]byte, 100)
		n, err := unix.Read(fd, got)
		unix.Close(fd)
		if err != nil || !bytes.Equal(got[:n], data) {
			t.Errorf("read through the handle: %q, %v; want %q", got[:n], err, data)
		}

		dropCaches(t)
		fd, err = unix.OpenByHandleAt(mfd, hDir, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			t.Fatalf("open_by_handle_at of a directory after drop_caches: %v", err)
		}
		d := os.NewFile(uintptr(fd), "dir")
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil || len(names) != 1 || names[0] != "file" {
			t.Errorf("directory opened by handle lists %v, %v; want [file]", names, err)
		}

		dropCaches(t)
		fd, err = unix.OpenByHandleAt(mfd, hGone, unix.O_RDONLY)
		if err == nil {
			unix.Close(fd)
			t.Errorf("open_by_handle_at of a removed file succeeded, want ESTALE")
		} else if !errors.Is(err, unix.ESTALE) {
			t.Errorf("open_by_handle_at of a removed file: %v, want ESTALE", err)
		}
	})
}
