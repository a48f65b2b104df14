package fuse

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLockHandleCacheReplaced: a mount waiting for the lock of the
// handle cache while the previous mount saves it (a new file renamed
// over the old one, then the old one closed) ends up holding the new
// file, the one at the path, not the old one it first opened.
func TestLockHandleCacheReplaced(t *testing.T) {
	path := filepath.Join(t.TempDir(), "handles")
	first, err := lockHandleCache(path, time.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *os.File, 1)
	go func() {
		fd, err := lockHandleCache(path, time.Now().Add(time.Minute))
		if err != nil {
			t.Error(err)
		}
		got <- fd
	}()
	time.Sleep(100 * time.Millisecond) // let it open the old file and wait: either order passes
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	first.Close()
	var second *os.File
	select {
	case second = <-got:
	case <-time.After(time.Minute):
		t.Fatal("no lock a minute after the first was released")
	}
	if second == nil {
		return
	}
	defer second.Close()
	fi, err := second.Stat()
	if err != nil {
		t.Fatal(err)
	}
	cur, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(fi, cur) {
		t.Error("the waiting mount holds the replaced file, not the one at the path")
	}
}

// TestLockHandleCacheNotRegular: a FIFO planted at the cache's path is
// refused, not opened for reading and writing.
func TestLockHandleCacheNotRegular(t *testing.T) {
	path := filepath.Join(t.TempDir(), "handles")
	if err := mkfifo(path); err != nil {
		t.Fatal(err)
	}
	if fd, err := lockHandleCache(path, time.Now().Add(time.Second)); err == nil {
		fd.Close()
		t.Error("a FIFO was taken for the handle cache")
	}
}

func mkfifo(path string) error { return unix.Mkfifo(path, 0o600) }
