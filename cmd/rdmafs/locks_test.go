package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// forEachLockPeer runs f against knfsd over TCP and over RPC-over-RDMA,
// and against nfs-ganesha over TCP.
func forEachLockPeer(t *testing.T, f func(t *testing.T, p peer)) {
	eachWay(t, []testpeer.Way{testpeer.KnfsdTCP, testpeer.KnfsdRDMA, testpeer.GaneshaTCP}, f)
}

// retryEINTR repeats a lock call the kernel interrupted: the Go runtime's
// preemption signal interrupts a blocked F_SETLKW (FUSE INTERRUPT), and
// fcntl is not restarted.
func retryEINTR(f func() error) error {
	for {
		err := f()
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

func setlk(f *os.File, typ int16, start, length int64, wait bool) error {
	lk := syscall.Flock_t{Type: typ, Whence: 0, Start: start, Len: length}
	cmd := syscall.F_SETLK
	if wait {
		cmd = syscall.F_SETLKW
	}
	return retryEINTR(func() error { return syscall.FcntlFlock(f.Fd(), cmd, &lk) })
}

func getlk(t *testing.T, f *os.File, typ int16, start, length int64) syscall.Flock_t {
	t.Helper()
	lk := syscall.Flock_t{Type: typ, Start: start, Len: length}
	if err := retryEINTR(func() error { return syscall.FcntlFlock(f.Fd(), syscall.F_GETLK, &lk) }); err != nil {
		t.Fatalf("F_GETLK [%d,+%d): %v", start, length, err)
	}
	return lk
}

// lockDenials reads the LOCK error count of a mount's statistics: a
// blocked F_SETLKW shows up there as a denied LOCK.
func lockDenials(t *testing.T, mnt string) int {
	out, code := runBin(t, time.Minute, "stats", mnt)
	if code != 0 {
		t.Fatalf("rdmafs stats: exit %d: %s", code, out)
	}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "LOCK" {
			n, _ := strconv.Atoi(f[2])
			return n
		}
	}
	return 0
}

// awaitBlocked waits until the lock waiter what, on mount mnt, is
// blocked: its client has had a LOCK denied since the count was before.
// It fails the test if the waiter ends first (ended), or if no denial
// shows within a minute.
func awaitBlocked(t *testing.T, peer, mnt string, before int, ended <-chan error, what string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for lockDenials(t, mnt) == before {
		select {
		case err := <-ended:
			t.Fatalf("%s: %s ended (%v) while A holds the lock", peer, what, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no denied LOCK from %s", peer, what)
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not synchronisation
	}
}

func statsLine(t *testing.T, mnt, prefix string) string {
	out, _ := runBin(t, time.Minute, "stats", mnt)
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// TestLocksAcrossMounts takes fcntl and flock locks through one rdmafs
// mount and checks what a second mount of the same export (another
// process, so another NFSv4.1 client ID) sees: conflicts, F_GETLK's
// report, a blocked F_SETLKW that completes after the unlock, splits and
// merges of ranges, and locks released at close.
func TestLocksAcrossMounts(t *testing.T) {
	forEachLockPeer(t, func(t *testing.T, p peer) {
		mA, mB := mount(t, p), mount(t, p)
		d := testDir(t, mA)
		defer os.RemoveAll(d)
		pathA := filepath.Join(d, "f")
		pathB := filepath.Join(mB, filepath.Base(d), "f")
		if err := os.WriteFile(pathA, make([]byte, 200), 0o666); err != nil {
			t.Fatal(err)
		}
		open := func(path string) *os.File {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return f
		}
		fa, fb := open(pathA), open(pathB)
		mustLock := func(f *os.File, typ int16, start, length int64) {
			t.Helper()
			if err := setlk(f, typ, start, length, false); err != nil {
				t.Fatalf("%s: F_SETLK type=%d [%d,+%d): %v", p.name, typ, start, length, err)
			}
		}
		mustConflict := func(f *os.File, typ int16, start, length int64) {
			t.Helper()
			if err := setlk(f, typ, start, length, false); !errors.Is(err, syscall.EAGAIN) {
				t.Fatalf("%s: F_SETLK type=%d [%d,+%d) through the other mount: %v, want EAGAIN", p.name, typ, start, length, err)
			}
		}

		// A write lock through A: B's F_SETLK fails, F_GETLK reports it.
		mustLock(fa, syscall.F_WRLCK, 0, 101)
		mustConflict(fb, syscall.F_WRLCK, 50, 10)
		mustConflict(fb, syscall.F_RDLCK, 0, 1)
		if lk := getlk(t, fb, syscall.F_RDLCK, 0, 0); lk.Type != syscall.F_WRLCK || lk.Start != 0 || lk.Len != 101 {
			t.Fatalf("%s: F_GETLK through B: type=%d start=%d len=%d, want write lock [0,+101)", p.name, lk.Type, lk.Start, lk.Len)
		}

		// Split: unlock 40-60 in the middle.
		mustLock(fa, syscall.F_UNLCK, 40, 21)
		mustLock(fb, syscall.F_WRLCK, 40, 21)
		mustLock(fb, syscall.F_UNLCK, 40, 21)
		mustConflict(fb, syscall.F_WRLCK, 0, 40)
		mustConflict(fb, syscall.F_WRLCK, 39, 1)
		mustConflict(fb, syscall.F_WRLCK, 61, 40)
		mustConflict(fb, syscall.F_WRLCK, 100, 1)
		if lk := getlk(t, fb, syscall.F_WRLCK, 61, 100); lk.Type != syscall.F_WRLCK || lk.Start != 61 || lk.Len != 40 {
			t.Fatalf("%s: F_GETLK [61,+100) after the split: type=%d start=%d len=%d, want [61,+40)", p.name, lk.Type, lk.Start, lk.Len)
		}
		if lk := getlk(t, fb, syscall.F_WRLCK, 40, 21); lk.Type != syscall.F_UNLCK {
			t.Fatalf("%s: F_GETLK of the hole: type=%d start=%d len=%d, want F_UNLCK", p.name, lk.Type, lk.Start, lk.Len)
		}
		mustLock(fb, syscall.F_WRLCK, 101, 99) // beyond A's range

		// Merge: fill the hole, then one unlock of 0-100 frees it all.
		mustLock(fa, syscall.F_WRLCK, 40, 21)
		mustConflict(fb, syscall.F_WRLCK, 50, 1)
		mustLock(fa, syscall.F_UNLCK, 0, 101)
		mustLock(fb, syscall.F_WRLCK, 0, 101)
		mustLock(fb, syscall.F_UNLCK, 0, 0)

		// Read locks share; a write lock does not.
		mustLock(fa, syscall.F_RDLCK, 0, 0)
		mustLock(fb, syscall.F_RDLCK, 0, 10)
		mustConflict(fb, syscall.F_WRLCK, 0, 10)
		mustLock(fb, syscall.F_UNLCK, 0, 0)

		// F_SETLKW through B waits for A's write lock.
		mustLock(fa, syscall.F_WRLCK, 0, 101)
		before := lockDenials(t, mB)
		done := make(chan error, 1)
		go func() { done <- setlk(fb, syscall.F_WRLCK, 10, 10, true) }()
		awaitBlocked(t, p.name, mB, before, done, "F_SETLKW")
		select {
		case err := <-done:
			t.Fatalf("%s: F_SETLKW returned %v while A holds the lock", p.name, err)
		default:
		}
		unlocked := time.Now()
		mustLock(fa, syscall.F_UNLCK, 0, 0)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: F_SETLKW: %v", p.name, err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s: F_SETLKW still blocked after A unlocked", p.name)
		}
		t.Logf("%s: blocked F_SETLKW granted %v after the unlock; %s", p.name,
			time.Since(unlocked).Round(time.Millisecond), statsLine(t, mB, "callbacks:"))
		mustConflict(fa, syscall.F_WRLCK, 15, 1)
		mustLock(fb, syscall.F_UNLCK, 0, 0)

		// Data written under a lock through A is what B reads under
		// its lock, though B's open file has cached the old pages.
		readAt := func(f *os.File) string {
			t.Helper()
			b := make([]byte, 5)
			if _, err := f.ReadAt(b, 0); err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
		mustLock(fb, syscall.F_RDLCK, 0, 0)
		if got := readAt(fb); got != "\x00\x00\x00\x00\x00" {
			t.Fatalf("%s: B read %q before", p.name, got)
		}
		mustLock(fb, syscall.F_UNLCK, 0, 0)
		mustLock(fa, syscall.F_WRLCK, 0, 0)
		if _, err := fa.WriteAt([]byte("fresh"), 0); err != nil {
			t.Fatal(err)
		}
		mustLock(fa, syscall.F_UNLCK, 0, 0)
		mustLock(fb, syscall.F_RDLCK, 0, 0)
		if got := readAt(fb); got != "fresh" {
			t.Fatalf("%s: B read %q under its lock after A wrote under its lock, want %q", p.name, got, "fresh")
		}
		mustLock(fb, syscall.F_UNLCK, 0, 0)

		// flock: exclusive through A excludes B until A unlocks.
		if err := retryEINTR(func() error { return syscall.Flock(int(fa.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) }); err != nil {
			t.Fatalf("%s: flock A: %v", p.name, err)
		}
		if err := retryEINTR(func() error { return syscall.Flock(int(fb.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) }); !errors.Is(err, syscall.EWOULDBLOCK) {
			t.Fatalf("%s: flock B while A holds it: %v, want EWOULDBLOCK", p.name, err)
		}
		if err := retryEINTR(func() error { return syscall.Flock(int(fa.Fd()), syscall.LOCK_UN) }); err != nil {
			t.Fatalf("%s: flock A unlock: %v", p.name, err)
		}
		if err := retryEINTR(func() error { return syscall.Flock(int(fb.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) }); err != nil {
			t.Fatalf("%s: flock B after A unlocked: %v", p.name, err)
		}
		if err := retryEINTR(func() error { return syscall.Flock(int(fb.Fd()), syscall.LOCK_UN) }); err != nil {
			t.Fatalf("%s: flock B unlock: %v", p.name, err)
		}

		// One process's fcntl locks are one owner's, whichever
		// descriptor took them (POSIX): they merge, and do not conflict.
		fa1 := open(pathA)
		mustLock(fa, syscall.F_WRLCK, 0, 50)
		mustLock(fa1, syscall.F_WRLCK, 25, 50)
		if lk := getlk(t, fa1, syscall.F_WRLCK, 0, 0); lk.Type != syscall.F_UNLCK {
			t.Fatalf("%s: F_GETLK reports the process's own lock [%d,+%d) as a conflict", p.name, lk.Start, lk.Len)
		}
		mustConflict(fb, syscall.F_WRLCK, 60, 1)
		mustLock(fa1, syscall.F_UNLCK, 0, 100)
		// A read-only descriptor used first does not stop a write lock
		// through a read-write one.
		ro, err := os.Open(pathA)
		if err != nil {
			t.Fatal(err)
		}
		getlk(t, ro, syscall.F_RDLCK, 0, 0)
		mustLock(ro, syscall.F_RDLCK, 0, 10)
		mustLock(ro, syscall.F_UNLCK, 0, 0)
		mustLock(fa1, syscall.F_WRLCK, 0, 10)
		mustLock(fa1, syscall.F_UNLCK, 0, 0)
		ro.Close()
		mustLock(fb, syscall.F_WRLCK, 0, 75)
		mustLock(fb, syscall.F_UNLCK, 0, 0)

		// Closing a descriptor drops the process's fcntl locks on the
		// file, also those taken through another descriptor (POSIX).
		fa2, fa3 := open(pathA), open(pathA)
		mustLock(fa2, syscall.F_WRLCK, 0, 0)
		mustConflict(fb, syscall.F_WRLCK, 0, 1)
		fa3.Close()
		mustLock(fb, syscall.F_WRLCK, 0, 1)
		mustLock(fb, syscall.F_UNLCK, 0, 0)
		mustLock(fa2, syscall.F_WRLCK, 0, 0)
		fa2.Close()
		mustLock(fb, syscall.F_WRLCK, 0, 1)
		mustLock(fb, syscall.F_UNLCK, 0, 0)

		// A flock lock goes with the last close of its open file (FUSE
		// RELEASE, which the kernel sends after close returns: B waits).
		fa4 := open(pathA)
		if err := retryEINTR(func() error { return syscall.Flock(int(fa4.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) }); err != nil {
			t.Fatalf("%s: flock A: %v", p.name, err)
		}
		fa4.Close()
		got := make(chan error, 1)
		go func() {
			got <- retryEINTR(func() error { return syscall.Flock(int(fb.Fd()), syscall.LOCK_EX) })
		}()
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("%s: flock B after A closed: %v", p.name, err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s: flock B still blocked after A closed its file", p.name)
		}
		syscall.Flock(int(fb.Fd()), syscall.LOCK_UN)
	})
}

// TestLockWaitInterrupted blocks flock(1) on mount B behind a lock held
// through mount A and kills it: the kernel interrupts the FUSE request,
// rdmafs stops waiting and answers, so the process can die (a FUSE
// request of a dying process waits for the answer), and B holds nothing.
func TestLockWaitInterrupted(t *testing.T) {
	forEachLockPeer(t, func(t *testing.T, p peer) {
		mA, mB := mount(t, p), mount(t, p)
		d := testDir(t, mA)
		defer os.RemoveAll(d)
		pathA := filepath.Join(d, "f")
		if err := os.WriteFile(pathA, []byte("x"), 0o666); err != nil {
			t.Fatal(err)
		}
		fa, err := os.OpenFile(pathA, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer fa.Close()
		if err := setlk(fa, syscall.F_WRLCK, 0, 0, false); err != nil {
			t.Fatalf("%s: F_SETLK: %v", p.name, err)
		}
		before := lockDenials(t, mB)
		cmd := exec.Command("flock", "-x", filepath.Join(mB, filepath.Base(d), "f"), "true")
		if err := cmd.Start(); err != nil {
			t.Fatalf("flock(1): %v", err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		awaitBlocked(t, p.name, mB, before, exited, "flock(1)")
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
				t.Fatalf("%s: flock(1) ended with %v, want killed by SIGTERM", p.name, err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s: flock(1) still blocked after SIGTERM", p.name)
		}
		if err := setlk(fa, syscall.F_UNLCK, 0, 0, false); err != nil {
			t.Fatal(err)
		}
		if lk := getlk(t, fa, syscall.F_WRLCK, 0, 0); lk.Type != syscall.F_UNLCK {
			t.Fatalf("%s: a lock [%d,+%d) type %d is held after the waiter was killed", p.name, lk.Start, lk.Len, lk.Type)
		}
	})
}
