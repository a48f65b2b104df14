package nfsclient

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// lockErrors is the LOCK error count of c (denied LOCKs among them).
func lockErrors(c *Client) uint64 {
	ops, _ := c.Snapshot()
	for _, o := range ops {
		if o.Op == "LOCK" {
			return o.Errors
		}
	}
	return 0
}

// waitDenied waits until c has had more than n failed LOCKs, or fails.
func waitDenied(t *testing.T, c *Client, n uint64, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for lockErrors(c) <= n {
		select {
		case err := <-done:
			t.Fatalf("LockWait returned %v while the lock is held", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no denied LOCK from the waiter")
		}
		time.Sleep(10 * time.Millisecond) // polling interval, not synchronisation
	}
}

// TestLockTwoClients takes byte-range locks from two clients (two client
// IDs): the open-to-lock-owner first LOCK, exist_lock_owner4 after it,
// NFS4ERR_DENIED with the holder's range, LOCKT, LOCKU, a blocking lock
// that completes after the unlock, and one whose wait is cancelled.
func TestLockTwoClients(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		ctx := testCtx(t)
		c1, c2 := dial(t, p, oncrpc.TCPOptions{}), dial(t, p, oncrpc.TCPOptions{})
		dir := testDir(t, c1)
		of1, err := c1.Open(ctx, rootCred, dir, "f", OpenArgs{Access: ShareAccessBoth, Create: Unchecked, Attr: &SetAttr{Mode: ptr(uint32(0o666))}})
		if err != nil {
			t.Fatal(err)
		}
		defer c1.CloseFile(ctx, rootCred, of1)
		of2, err := c2.Open(ctx, rootCred, dir, "f", OpenArgs{Access: ShareAccessBoth, Create: NoCreate})
		if err != nil {
			t.Fatal(err)
		}
		defer c2.CloseFile(ctx, rootCred, of2)
		l1, l2 := c1.NewLocker(of1, 1), c2.NewLocker(of2, 1)

		if _, err := c1.Lock(ctx, rootCred, l1, WriteLT, 0, 100); err != nil {
			t.Fatalf("%s: first LOCK (open_to_lock_owner4): %v", p.name, err)
		}
		if _, err := c1.Lock(ctx, rootCred, l1, ReadLT, 200, 10); err != nil {
			t.Fatalf("%s: second LOCK (exist_lock_owner4): %v", p.name, err)
		}
		dn, err := c2.Lock(ctx, rootCred, l2, WriteLT, 50, 1)
		if !errors.Is(err, ErrDenied) || dn == nil {
			t.Fatalf("%s: conflicting LOCK: %v (denied %+v), want NFS4ERR_DENIED", p.name, err, dn)
		}
		if dn.Offset != 0 || dn.Length != 100 || dn.Type != WriteLT {
			t.Errorf("%s: LOCK4denied %+v, want [0,+100) WRITE_LT", p.name, dn)
		}
		if dn, err := c2.TestLock(ctx, rootCred, l2, ReadLT, 205, 1); err != nil || dn != nil {
			t.Errorf("%s: LOCKT read over a read lock: %+v %v, want no conflict", p.name, dn, err)
		}
		if dn, err := c2.TestLock(ctx, rootCred, l2, WriteLT, 205, 1); err != nil || dn == nil || dn.Type != ReadLT || dn.Offset != 200 {
			t.Errorf("%s: LOCKT write over a read lock: %+v %v, want the read lock at 200", p.name, dn, err)
		}

		// A blocking lock waits for the unlock.
		n := lockErrors(c2)
		done := make(chan error, 1)
		go func() { done <- c2.LockWait(ctx, ctx, rootCred, l2, WriteLT, 0, 10) }()
		waitDenied(t, c2, n, done)
		if err := c1.Unlock(ctx, rootCred, l1, 0, LengthToEOF); err != nil {
			t.Fatalf("%s: LOCKU: %v", p.name, err)
		}
		if err := <-done; err != nil {
			t.Fatalf("%s: LockWait: %v", p.name, err)
		}
		t.Logf("%s: CB_NOTIFY_LOCKs received: %d", p.name, c2.LockNotifies())
		if dn, err := c1.Lock(ctx, rootCred, l1, ReadLT, 5, 1); !errors.Is(err, ErrDenied) || dn == nil || dn.Offset != 0 || dn.Length != 10 {
			t.Errorf("%s: LOCK over the waiter's lock: %+v %v", p.name, dn, err)
		}

		// A wait ends when its context does; the lock is not taken.
		wctx, cancel := context.WithCancel(ctx)
		n = lockErrors(c1)
		go func() { done <- c1.LockWait(wctx, ctx, rootCred, l1, WriteLT, 0, 1) }()
		waitDenied(t, c1, n, done)
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: cancelled LockWait: %v", p.name, err)
		}
		if err := c2.Unlock(ctx, rootCred, l2, 0, LengthToEOF); err != nil {
			t.Fatalf("%s: LOCKU: %v", p.name, err)
		}
		if dn, err := c1.TestLock(ctx, rootCred, l1, WriteLT, 0, LengthToEOF); err != nil || dn != nil {
			t.Errorf("%s: LOCKT after all unlocks: %+v %v", p.name, dn, err)
		}
	})
}
