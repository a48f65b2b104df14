package fuse_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/test/testpeer"
)

// TestSetattrAfterFailedWrite has the buffered write that goes out in a
// SETATTR's COMPOUND fail: the server stops there (RFC 8881 s16.2.3), so
// utimes reports the write's error and leaves the mtime alone, and the
// error is the file's, reported again at close. The write fails with
// NFS4ERR_FBIG at an offset beyond what ganesha's file system takes (ext4
// stops at 2^32-1 blocks, 16 TiB less a block): the file is first
// truncated to that size, so the write starts at its end and is buffered
// (a write that starts past the end goes to the server at once, so that
// this error would be its own: TestWriteTooFar in cmd/rdmafs).
func TestSetattrAfterFailedWrite(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	p := peer{name: "ganesha", addr: g.Addr, export: g.Export, limitsOf: "ganesha"}
	mnt, m := mountPeer(t, p, fuse.Options{})
	top := freshDir(t, mnt)
	name := filepath.Join(top, "fbig")
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var sfs unix.Statfs_t
	if err := unix.Statfs(g.Dir, &sfs); err != nil {
		t.Fatal(err)
	}
	off := (1<<32 - 1) * sfs.Bsize // ext4's s_maxbytes
	if err := f.Truncate(off); err != nil {
		t.Fatalf("truncate to %d, the export's largest file on ext4: %v", off, err)
	}
	if _, err := f.WriteAt([]byte("beyond"), off); err != nil {
		t.Fatalf("buffered write at %d: %v", off, err)
	}
	before := countOps(m)
	mtime := time.Unix(1e9, 0)
	err = os.Chtimes(name, time.Time{}, mtime)
	if err == nil {
		// Not a skip: the test must run in CI, whose ganesha exports a
		// directory on ext4 (largest file 16 TiB).
		t.Fatalf("the export's file system (under %s) took a write at %d: this test needs one whose largest file is smaller, such as ext4", g.Dir, off)
	}
	if !errors.Is(err, syscall.EFBIG) {
		t.Errorf("utimes after a write the server refuses: %v, want EFBIG", err)
	}
	if got := countOps(m).since(before); got["WRITE"] != 1 || got.total() != 1 {
		t.Errorf("utimes sent %v, want one WRITE (+SETATTR) COMPOUND", got)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(g.Dir, filepath.Base(top), "fbig"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mtim.Sec == mtime.Unix() || st.Size != off {
		t.Errorf("on the server: mtime %d size %d: the SETATTR ran after the failed WRITE, or the WRITE was done", st.Mtim.Sec, st.Size)
	}
	if err := f.Close(); !errors.Is(err, syscall.EFBIG) {
		t.Errorf("close: %v, want the write's EFBIG", err)
	}
}
