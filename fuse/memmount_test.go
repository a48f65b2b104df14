package fuse_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/test/fusetest"
)

// The tests here mount a memClient: what the mount sends is counted
// exactly, the tree changes behind the mount's caches as another
// client's changes would, and operations fail on demand.

// mountMem mounts a fresh memClient and unmounts it when the test ends.
func mountMem(t *testing.T, opts fuse.Options) (string, *memClient) {
	t.Helper()
	c := newMemClient()
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	opts.FSName = "mem:/"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := fuse.Serve(ctx, c, dir, opts)
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	fusetest.UnmountAtCleanup(t, m, dir)
	return dir, c
}

// opsSince returns the counts of now minus before, without zeros.
func opsSince(now, before map[string]int) map[string]int {
	d := map[string]int{}
	for op, n := range now {
		if k := n - before[op]; k != 0 {
			d[op] = k
		}
	}
	return d
}

func size(t *testing.T, name string) int64 {
	t.Helper()
	st, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// waitClosed waits for the RELEASEs the kernel sends after close(2)
// returns: the deadline only catches a CLOSE that never comes.
func waitClosed(t *testing.T, c *memClient) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); c.openStates() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d OPEN states never CLOSEd", c.openStates())
		}
	}
}

// TestMemAttrCache: a file's attributes changed behind the mount are
// not seen while the attribute cache holds them (acregmin: the kernel
// does not even ask), and are seen after it expires; with noac at once.
func TestMemAttrCache(t *testing.T) {
	const ac = 2 * time.Second
	t.Run("acregmin", func(t *testing.T) {
		mnt, c := mountMem(t, fuse.Options{AcRegMin: ac, AcRegMax: ac, AcDirMin: ac, AcDirMax: ac})
		c.setData(t, "f", []byte("abc"))
		name := filepath.Join(mnt, "f")
		if got := size(t, name); got != 3 {
			t.Fatalf("size %d, want 3", got)
		}
		cached := time.Now()
		before := c.ops()
		c.setData(t, "f", make([]byte, 10))
		got := size(t, name)
		sent := opsSince(c.ops(), before)
		if time.Since(cached) < ac {
			// (On a machine so slow that the stat took the whole
			// timeout, the cache may rightly have expired.)
			if got != 3 || sent["GETATTR"] != 0 {
				t.Errorf("within acregmin: size %d after sending %v, want the cached 3 and no GETATTR", got, sent)
			}
		}
		time.Sleep(time.Until(cached.Add(ac + 100*time.Millisecond)))
		before = c.ops()
		if got := size(t, name); got != 10 {
			t.Errorf("after acregmin: size %d, want the server's 10", got)
		}
		if sent := opsSince(c.ops(), before); sent["GETATTR"] != 1 {
			t.Errorf("after acregmin a stat sent %v, want one GETATTR", sent)
		}
	})
	t.Run("noac", func(t *testing.T) {
		mnt, c := mountMem(t, fuse.Options{NoAC: true})
		c.setData(t, "f", []byte("abc"))
		name := filepath.Join(mnt, "f")
		if got := size(t, name); got != 3 {
			t.Fatalf("size %d, want 3", got)
		}
		c.setData(t, "f", make([]byte, 10))
		if got := size(t, name); got != 10 {
			t.Errorf("noac: size %d, want the server's 10 at once", got)
		}
	})
}

// TestMemEntryCache: a name stays valid for acdirmin after a LOOKUP
// found it, even if another client removed it; a name LOOKUP did not
// find is not cached (FUSE's negative timeout is zero: nothing tells
// it when the directory changed), so a file another client created is
// seen at once.
func TestMemEntryCache(t *testing.T) {
	const ac = 2 * time.Second
	mnt, c := mountMem(t, fuse.Options{AcRegMin: ac, AcRegMax: ac, AcDirMin: ac, AcDirMax: ac})
	t.Run("positive", func(t *testing.T) {
		c.setData(t, "gone", []byte("x"))
		name := filepath.Join(mnt, "gone")
		if _, err := os.Stat(name); err != nil {
			t.Fatal(err)
		}
		cached := time.Now()
		before := c.ops()
		c.remove(t, "gone")
		_, err := os.Stat(name)
		sent := opsSince(c.ops(), before)
		if time.Since(cached) < ac && (err != nil || sent["LOOKUP"] != 0) {
			t.Errorf("within acdirmin: stat %v after sending %v, want the cached entry and no LOOKUP", err, sent)
		}
		time.Sleep(time.Until(cached.Add(ac + 100*time.Millisecond)))
		if _, err := os.Stat(name); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after acdirmin: stat of a removed file: %v, want ENOENT", err)
		}
	})
	t.Run("negative", func(t *testing.T) {
		name := filepath.Join(mnt, "later")
		before := c.ops()
		if _, err := os.Stat(name); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("stat before the file exists: %v", err)
		}
		c.setData(t, "later", []byte("x"))
		if _, err := os.Stat(name); err != nil {
			t.Errorf("stat at once after another client created it: %v", err)
		}
		if sent := opsSince(c.ops(), before); sent["LOOKUP"] != 2 {
			t.Errorf("two stats sent %v, want two LOOKUPs (no negative caching)", sent)
		}
	})
}

// TestMemWriteBack: small sequential writes are coalesced into wsize
// UNSTABLE WRITEs, and fsync, or close, sends one COMMIT; close after
// fsync sends nothing more for the data. A small file goes out at close
// as one FILE_SYNC WRITE, without COMMIT.
func TestMemWriteBack(t *testing.T) {
	mnt, c := mountMem(t, fuse.Options{})
	t.Run("fsync", func(t *testing.T) {
		name := filepath.Join(mnt, "big")
		f, err := os.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		want := make([]byte, 1<<20)
		for i := range want {
			want[i] = byte(i * 7)
		}
		before := c.ops()
		const chunk = 4 << 10
		for off := 0; off < len(want); off += chunk {
			if _, err := f.Write(want[off : off+chunk]); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		sent := opsSince(c.ops(), before)
		if n := len(want) / c.wsize; sent["WRITE"] != n || sent["COMMIT"] != 1 {
			t.Errorf("%d writes of %d bytes and fsync sent %v, want %d WRITEs of wsize %d and one COMMIT",
				len(want)/chunk, chunk, sent, n, c.wsize)
		}
		before = c.ops()
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, c)
		if sent := opsSince(c.ops(), before); sent["WRITE"] != 0 || sent["COMMIT"] != 0 || sent["CLOSE"] != 1 {
			t.Errorf("close after fsync sent %v, want only CLOSE (and GETATTRs)", sent)
		}
		if !bytes.Equal(c.data("big"), want) {
			t.Error("the server's data differs from what was written")
		}
	})
	t.Run("close", func(t *testing.T) {
		f, err := os.Create(filepath.Join(mnt, "big-closed"))
		if err != nil {
			t.Fatal(err)
		}
		before := c.ops()
		buf := make([]byte, 8<<10)
		const total = 512 << 10
		for range total / len(buf) {
			if _, err := f.Write(buf); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, c)
		if sent, n := opsSince(c.ops(), before), total/c.wsize; sent["WRITE"] != n || sent["COMMIT"] != 1 {
			t.Errorf("writes of %d bytes and close sent %v, want %d WRITEs and one COMMIT", total, sent, n)
		}
		if got := len(c.data("big-closed")); got != total {
			t.Errorf("server has %d bytes, want %d", got, total)
		}
	})
	t.Run("close small", func(t *testing.T) {
		before := c.ops()
		if err := os.WriteFile(filepath.Join(mnt, "small"), []byte("hello"), 0o644); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, c)
		if sent := opsSince(c.ops(), before); sent["WRITE"] != 1 || sent["COMMIT"] != 0 {
			t.Errorf("a 5-byte file sent %v, want one (FILE_SYNC) WRITE and no COMMIT", sent)
		}
		if got := string(c.data("small")); got != "hello" {
			t.Errorf("server has %q", got)
		}
	})
}

// TestMemFoldWriteSetattr: tar's write-then-futimens of each file sends
// the buffered write in the SETATTR's COMPOUND (fold.go): one request
// where a write-back before the SETATTR takes two. With two open files
// writing the same file there is no one buffer to fold, and the write
// goes out on its own first.
func TestMemFoldWriteSetattr(t *testing.T) {
	mnt, c := mountMem(t, fuse.Options{})
	mtime := time.Unix(1e9, 0)
	t.Run("folded", func(t *testing.T) {
		name := filepath.Join(mnt, "tarred")
		f, err := os.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.Write([]byte("member")); err != nil {
			t.Fatal(err)
		}
		before := c.ops()
		if err := os.Chtimes(name, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		sent := opsSince(c.ops(), before)
		if sent["WRITE+SETATTR"] != 1 || sent["WRITE"] != 0 || sent["SETATTR"] != 0 {
			t.Errorf("utimes after a buffered write sent %v, want one WRITE+SETATTR COMPOUND", sent)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		if !st.ModTime().Equal(mtime) || st.Size() != 6 {
			t.Errorf("mtime %v size %d, want %v and 6", st.ModTime(), st.Size(), mtime)
		}
	})
	t.Run("two writers", func(t *testing.T) {
		name := filepath.Join(mnt, "shared")
		var fs []*os.File
		for range 2 {
			f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fs = append(fs, f)
		}
		// Both at 0: a write past the end the mount knows would go
		// out at once (file.go writeThrough).
		for i, f := range fs {
			if _, err := f.WriteAt([]byte{'a' + byte(i)}, 0); err != nil {
				t.Fatal(err)
			}
		}
		before := c.ops()
		if err := os.Chtimes(name, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		sent := opsSince(c.ops(), before)
		if sent["WRITE+SETATTR"] != 0 || sent["WRITE"] != 2 || sent["SETATTR"] != 1 {
			t.Errorf("utimes with two files' buffered writes sent %v, want two WRITEs and a SETATTR", sent)
		}
	})
}

// TestMemWriteErrorSurfaces: a WRITE the server refuses with
// NFS4ERR_NOSPC after write(2) returned is reported as ENOSPC by the
// next fsync, or by close: never lost.
func TestMemWriteErrorSurfaces(t *testing.T) {
	mnt, c := mountMem(t, fuse.Options{})
	t.Cleanup(func() { c.failOp("WRITE", nil) })
	// writeSome writes more than wsize, so that UNSTABLE WRITEs went
	// out, and leaves some in the buffer.
	writeSome := func(t *testing.T, name string) *os.File {
		f, err := os.Create(filepath.Join(mnt, name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(make([]byte, c.wsize+4096)); err != nil {
			t.Fatal(err)
		}
		return f
	}
	t.Run("fsync", func(t *testing.T) {
		f := writeSome(t, "fsync")
		c.failOp("WRITE", nfsclient.ErrNoSpc)
		defer c.failOp("WRITE", nil)
		if err := f.Sync(); !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("fsync after a WRITE failed with NFS4ERR_NOSPC: %v, want ENOSPC", err)
		}
		f.Close()
		waitClosed(t, c)
	})
	t.Run("close", func(t *testing.T) {
		f := writeSome(t, "close")
		c.failOp("WRITE", nfsclient.ErrNoSpc)
		defer c.failOp("WRITE", nil)
		if err := f.Close(); !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("close after a WRITE failed with NFS4ERR_NOSPC: %v, want ENOSPC", err)
		}
		waitClosed(t, c)
	})
	t.Run("small file close", func(t *testing.T) {
		f, err := os.Create(filepath.Join(mnt, "small"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		c.failOp("WRITE", nfsclient.ErrNoSpc)
		defer c.failOp("WRITE", nil)
		if err := f.Close(); !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("close of a file whose one WRITE failed with NFS4ERR_NOSPC: %v, want ENOSPC", err)
		}
		waitClosed(t, c)
	})
	t.Run("commit", func(t *testing.T) {
		f := writeSome(t, "commit")
		c.failOp("COMMIT", nfsclient.ErrNoSpc)
		defer c.failOp("COMMIT", nil)
		if err := f.Sync(); !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("fsync whose COMMIT failed with NFS4ERR_NOSPC: %v, want ENOSPC", err)
		}
		f.Close()
		waitClosed(t, c)
	})
}

// TestMemLocks: fcntl locks go to the server as LOCK and LOCKU, a
// conflicting one is refused (EAGAIN), and close releases what the
// process held.
func TestMemLocks(t *testing.T) {
	mnt, c := mountMem(t, fuse.Options{})
	c.setData(t, "locked", []byte("data"))
	f, err := os.OpenFile(filepath.Join(mnt, "locked"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: 0, Start: 0, Len: 0}
	before := c.ops()
	if err := syscall.FcntlFlock(f.Fd(), syscall.F_SETLK, &lk); err != nil {
		t.Fatal(err)
	}
	if sent := opsSince(c.ops(), before); sent["LOCK"] != 1 {
		t.Errorf("F_SETLK sent %v, want one LOCK", sent)
	}
	// An open file description lock is another owner: it conflicts.
	ofd := syscall.Flock_t{Type: syscall.F_WRLCK}
	g, err := os.OpenFile(filepath.Join(mnt, "locked"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	const fOFDSetlk = 37 // F_OFD_SETLK
	if err := syscall.FcntlFlock(g.Fd(), fOFDSetlk, &ofd); !errors.Is(err, syscall.EAGAIN) {
		t.Errorf("conflicting OFD lock: %v, want EAGAIN", err)
	}
	before = c.ops()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if sent := opsSince(c.ops(), before); sent["LOCKU"] == 0 {
		t.Errorf("close of a file the process locked sent %v, want a LOCKU", sent)
	}
	if err := syscall.FcntlFlock(g.Fd(), fOFDSetlk, &ofd); err != nil {
		t.Errorf("OFD lock after the process lock went: %v", err)
	}
}
