package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// lockChildEnv names the file a lock-holding child process (this test
// binary, see maybeLockChild) locks; lockChildClose says which of its two
// descriptors it closes: "locked" or "other".
const (
	lockChildEnv   = "RDMAFS_LOCK_CHILD"
	lockChildClose = "RDMAFS_LOCK_CHILD_CLOSE"
)

// maybeLockChild runs the child of TestLockGoneAtClose when this binary
// was started as one: it opens the file twice, takes a POSIX write lock
// on [0,10) through the first descriptor, says "locked", and at a line on
// its standard input closes one descriptor and says "closed"; it exits at
// the end of its input.
func maybeLockChild() {
	path := os.Getenv(lockChildEnv)
	if path == "" {
		return
	}
	fail := func(err error) {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	a, err := unix.Open(path, unix.O_RDWR, 0)
	if err != nil {
		fail(err)
	}
	b, err := unix.Open(path, unix.O_RDWR, 0)
	if err != nil {
		fail(err)
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Start: 0, Len: 10}
	if err := unix.FcntlFlock(uintptr(a), unix.F_SETLK, &lk); err != nil {
		fail(err)
	}
	fmt.Println("locked")
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil {
		fail(err)
	}
	closeFD := a
	if os.Getenv(lockChildClose) == "other" {
		closeFD = b
	}
	if err := unix.Close(closeFD); err != nil {
		fail(err)
	}
	fmt.Println("closed")
	io.Copy(io.Discard, in)
	os.Exit(0)
}

// ofdGetlk returns the lock that conflicts with a write lock on [0,10)
// through fd, with F_OFD_GETLK (or F_GETLK when posix).
func ofdGetlk(t *testing.T, fd int, posix bool) int16 {
	t.Helper()
	cmd := unix.F_OFD_GETLK
	if posix {
		cmd = unix.F_GETLK
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Start: 0, Len: 10}
	if err := retryEINTR(func() error { return unix.FcntlFlock(uintptr(fd), cmd, &lk) }); err != nil {
		t.Fatalf("getlk: %v", err)
	}
	return lk.Type
}

// TestLockGoneAtClose checks that a lock released by a close is gone for
// every other open file as soon as close(2) returns, as on a kernel NFS
// mount, whose LOCKU at close is synchronous (xfstests generic/478, which
// saw an OFD lock "intermittently" after its last close):
//   - an OFD lock goes with the last close of its open file description
//     (FUSE RELEASE, which the kernel sends without waiting for it: lock
//     requests on the file wait for the RELEASEs under way), and stays
//     while a dup of the descriptor is open;
//   - a POSIX lock goes with the first close of any descriptor of the
//     file by its process (FUSE FLUSH, which carries the lock owner).
func TestLockGoneAtClose(t *testing.T) {
	p := ganeshaPeer(t)
	mnt := mount(t, p)
	d := testDir(t, mnt)
	defer os.RemoveAll(d)
	name := filepath.Join(d, "f")
	if err := os.WriteFile(name, make([]byte, 100), 0o666); err != nil {
		t.Fatal(err)
	}
	// Calls into the mount are retried on EINTR: the Go runtime's
	// preemption signal interrupts them.
	open := func(t *testing.T) int {
		t.Helper()
		var fd int
		err := retryEINTR(func() (err error) {
			fd, err = unix.Open(name, unix.O_RDWR, 0)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	t.Run("ofd", func(t *testing.T) {
		other := open(t)
		defer unix.Close(other)
		const rounds = 100
		stale := 0
		for i := range rounds {
			fd := open(t)
			lk := unix.Flock_t{Type: unix.F_WRLCK, Start: 0, Len: 10}
			if err := retryEINTR(func() error { return unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk) }); err != nil {
				t.Fatalf("F_OFD_SETLK: %v", err)
			}
			if i == 0 {
				// A dup's close leaves the lock: the open file
				// description lives on.
				dup, err := unix.Dup(fd)
				if err != nil {
					t.Fatal(err)
				}
				unix.Close(dup)
				if typ := ofdGetlk(t, other, false); typ != unix.F_WRLCK {
					t.Fatalf("F_OFD_GETLK after closing a dup of the locking descriptor: type %d, want F_WRLCK", typ)
				}
			}
			unix.Close(fd)
			if typ := ofdGetlk(t, other, false); typ != unix.F_UNLCK {
				stale++
			}
		}
		if stale > 0 {
			t.Errorf("F_OFD_GETLK right after the last close still saw the lock in %d of %d rounds", stale, rounds)
		}
	})
	for _, which := range []string{"locked", "other"} {
		t.Run("posix-close-"+which, func(t *testing.T) {
			other := open(t)
			defer unix.Close(other)
			const rounds = 10
			for range rounds {
				exe, err := os.Executable()
				if err != nil {
					t.Fatal(err)
				}
				cmd := exec.Command(exe)
				cmd.Env = append(os.Environ(), lockChildEnv+"="+name, lockChildClose+"="+which)
				stdin, stdout := startPiped(t, cmd)
				out := bufio.NewReader(stdout)
				expect := func(want string) {
					t.Helper()
					line, err := out.ReadString('\n')
					if err != nil || line != want+"\n" {
						cmd.Process.Kill()
						cmd.Wait()
						t.Fatalf("child said %q (%v), want %q", line, err, want)
					}
				}
				expect("locked")
				if typ := ofdGetlk(t, other, true); typ != unix.F_WRLCK {
					t.Fatalf("F_GETLK while the child holds the lock: type %d, want F_WRLCK", typ)
				}
				fmt.Fprintln(stdin, "close")
				expect("closed")
				typ := ofdGetlk(t, other, true)
				stdin.Close()
				if err := cmd.Wait(); err != nil {
					t.Fatalf("child: %v", err)
				}
				if typ != unix.F_UNLCK {
					t.Fatalf("F_GETLK right after the child closed its %s descriptor (its process still running): type %d, want F_UNLCK", which, typ)
				}
			}
		})
	}
}
