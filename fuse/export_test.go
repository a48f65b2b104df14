package fuse_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
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
			var st unix.Stat_t
			serr := unix.Stat(file, &st)
			t.Fatalf("open_by_handle_at of a file after drop_caches: %v (handle type %d %x; stat now: ino %d nlink %d, %v)",
				err, hFile.Type(), hFile.Bytes(), st.Ino, st.Nlink, serr)
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

// serveAt mounts p's export on dir without unmounting it at the end of
// the test: the caller does.
func serveAt(t *testing.T, p peer, dir string, opts fuse.Options) *fuse.Mount {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := nfsclient.Dial(ctx, nfsclient.Config{
		Transport: p.transport(),
		Export:    p.export,
		RPC:       oncrpc.ClientOptions{Timeout: 30 * time.Second, Retrans: 3},
	})
	if err != nil {
		t.Fatalf("%s: dial: %v", p.name, err)
	}
	opts.FSName = p.addr + ":" + p.export
	m, err := fuse.Serve(ctx, fuse.NFSClient(c), dir, opts)
	if err != nil {
		c.Close(ctx)
		t.Fatalf("%s: mount: %v", p.name, err)
	}
	return m
}

// unmountAll unmounts m and ends its session.
func unmountAll(t *testing.T, m *fuse.Mount) {
	t.Helper()
	if err := m.Unmount(); err != nil {
		t.Errorf("unmount: %v", err)
		exec.Command("fusermount3", "-u", "-z", m.Dir).Run()
	}
	m.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// TestOpenByHandleRemount is xfstests generic/477's "cycle mount": file
// and directory handles still open after an unmount and a new mount,
// which finds the NFS file handles in the handle cache the first mount
// saved.
func TestOpenByHandleRemount(t *testing.T) {
	tcpPeers(t, func(t *testing.T, p peer) {
		dir := filepath.Join(t.TempDir(), "mnt")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		opts := fuse.Options{HandleCache: filepath.Join(t.TempDir(), "handles")}
		m := serveAt(t, p, dir, opts)
		top := freshDir(t, dir)
		sub := filepath.Join(top, "sub")
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		data := []byte("a handle across a remount\n")
		file := filepath.Join(sub, "file")
		if err := os.WriteFile(file, data, 0o644); err != nil {
			t.Fatal(err)
		}
		hFile, _, err := unix.NameToHandleAt(unix.AT_FDCWD, file, 0)
		if err != nil {
			t.Fatal(err)
		}
		hDir, _, err := unix.NameToHandleAt(unix.AT_FDCWD, sub, 0)
		if err != nil {
			t.Fatal(err)
		}
		unmountAll(t, m)

		m = serveAt(t, p, dir, opts)
		defer unmountAll(t, m)
		mfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(mfd)
		fd, err := unix.OpenByHandleAt(mfd, hFile, unix.O_RDONLY)
		if err != nil {
			t.Fatalf("open_by_handle_at of a file after a remount: %v", err)
		}
		got := make([]byte, 100)
		n, err := unix.Read(fd, got)
		unix.Close(fd)
		if err != nil || !bytes.Equal(got[:n], data) {
			t.Errorf("read through the handle: %q, %v; want %q", got[:n], err, data)
		}
		fd, err = unix.OpenByHandleAt(mfd, hDir, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			t.Fatalf("open_by_handle_at of a directory after a remount: %v", err)
		}
		unix.Close(fd)
	})
}
