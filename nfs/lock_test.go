package nfs_test

import (
	"errors"
	"os"
	"path"
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/nfs"
	"github.com/rdmafs/rdmafs/nfsclient"
)

// TestLocks takes byte-range locks through two Files of one file: they
// conflict as two owners' locks do, a waiting lock is granted once the
// holder unlocks, and Close releases what a File holds.
func TestLocks(t *testing.T) {
	forEachPeer(t, func(t *testing.T, c *nfs.Client, dir string) {
		ctx := testCtx(t)
		name := path.Join(dir, "locked")
		if err := c.WriteFile(ctx, name, make([]byte, 100), 0o644); err != nil {
			t.Fatal(err)
		}
		f1, err := c.OpenFile(ctx, name, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f1.Close()
		f2, err := c.OpenFile(ctx, name, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f2.Close()

		if err := f1.Lock(ctx, 0, 10, true, false); err != nil {
			t.Fatalf("f1 write lock [0,10): %v", err)
		}
		err = f2.Lock(ctx, 5, 10, false, false)
		if !errors.Is(err, syscall.EAGAIN) || !errors.Is(err, nfsclient.ErrDenied) {
			t.Fatalf("f2 read lock [5,15) over f1's write lock: %v, want EAGAIN", err)
		}
		if err := f2.Lock(ctx, 10, 0, false, false); err != nil {
			t.Fatalf("f2 read lock [10,EOF): %v", err)
		}
		if err := f1.Lock(ctx, 0, 10, false, false); err != nil {
			t.Fatalf("f1 read lock [0,10) (downgrade): %v", err)
		}
		if err := f2.Lock(ctx, 0, 5, false, false); err != nil {
			t.Fatalf("f2 read lock [0,5) beside f1's read lock: %v", err)
		}
		if err := f2.Unlock(ctx, 0, 0); err != nil {
			t.Fatalf("f2 unlock all: %v", err)
		}

		// A waiting lock is granted when the holder lets go.
		if err := f1.Lock(ctx, 0, 0, true, false); err != nil {
			t.Fatalf("f1 write lock [0,EOF): %v", err)
		}
		done := make(chan error, 1)
		go func() { done <- f2.Lock(ctx, 50, 1, true, true) }()
		if err := f1.Unlock(ctx, 0, 0); err != nil {
			t.Fatalf("f1 unlock: %v", err)
		}
		if err := <-done; err != nil {
			t.Fatalf("f2 waiting write lock: %v", err)
		}
		// Close releases f2's lock: f1 gets it.
		if err := f2.Close(); err != nil {
			t.Fatalf("f2 Close with a lock held: %v", err)
		}
		if err := f1.Lock(ctx, 0, 0, true, false); err != nil {
			t.Fatalf("f1 write lock after f2 closed: %v", err)
		}
	})
}
