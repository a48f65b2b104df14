package fuse

import (
	"errors"
	"fmt"
	"path/filepath"
	"syscall"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// waitMount is srv.WaitMount, which opens a file of the new mount (its
// "poll hack", the first request the mount serves), retried while that
// open fails with EINTR: a FUSE request is interruptible, and the Go
// runtime's own signals (preemption, the CPU profiler's SIGPROF)
// interrupt it, the more so on a slow machine. A mount that still
// fails is unmounted, so that no caller is left with a half-made mount.
func waitMount(srv *gofuse.Server, dir string) error {
	err := srv.WaitMount()
	// WaitMount takes the mount's ready signal once; the retries do
	// its open and poll themselves.
	for try := 0; errors.Is(err, syscall.EINTR) && try < 100; try++ {
		err = pollHack(dir)
	}
	if err != nil {
		if uerr := srv.Unmount(); uerr != nil {
			return fmt.Errorf("waiting for the mount: %w (and unmounting it: %v)", err, uerr)
		}
		return fmt.Errorf("waiting for the mount: %w", err)
	}
	return nil
}

// pollHackName is the file go-fuse's WaitMount opens and polls, which
// go-fuse's request loop answers itself (it says ENOSYS to the POLL, so
// the kernel sends no more).
const pollHackName = ".go-fuse-epoll-hack"

func pollHack(dir string) error {
	fd, err := syscall.Open(filepath.Join(dir, pollHackName), syscall.O_RDONLY, 0)
	if err != nil {
		return err
	}
	unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLPRI | unix.POLLOUT}}, 0)
	syscall.Close(fd)
	return nil
}
