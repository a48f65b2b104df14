package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"
)

func umountCommand() *cli.Command {
	return &cli.Command{
		Name:      "umount",
		Aliases:   []string{"unmount"},
		Usage:     "unmount an rdmafs mount",
		ArgsUsage: "/mountpoint",
		Description: `Unmounts the file system and waits until the process serving it has
written back buffered data, closed its open files on the server and
destroyed its NFS session. Plain umount(8) and fusermount3 -u work too;
they just do not wait.

A non-root user's mount is unmounted through fusermount3 -u.

EXAMPLES:
   rdmafs umount /mnt
   rdmafs umount --lazy /mnt     # detach now, clean up when files close

EXIT STATUS:
   0   unmounted, and the serving process has finished
   1   bad usage
   2   not an rdmafs mount, or busy (files in use: close them or --lazy)
   32  the unmount failed, or the serving process did not finish in --wait`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "lazy", Aliases: []string{"l"}, Usage: "detach even if files are open (MNT_DETACH, fusermount3 -z)", DefaultText: "off"},
			&cli.DurationFlag{Name: "wait", Value: 60 * time.Second, Usage: "how long to wait for the serving process to finish (`DURATION`, as 90s or 2m)"},
		},
		Action: func(cctx *cli.Context) error {
			if cctx.NArg() != 1 {
				return exitf(exitUsage, nil, "usage: rdmafs umount /mountpoint")
			}
			dir, err := filepath.Abs(cctx.Args().First())
			if err != nil {
				return exitf(exitUsage, err, "%v", err)
			}
			return unmount(dir, cctx.Bool("lazy"), cctx.Duration("wait"))
		},
	}
}

func unmount(dir string, lazy bool, wait time.Duration) error {
	if ok, fstype := isMountpoint(dir); !ok || !strings.HasPrefix(fstype, "fuse") {
		return exitf(exitMountpoint, nil, "%s is not an rdmafs mount", dir)
	}
	pid, havePID := servingPID(dir)
	flags := 0
	if lazy {
		flags = unix.MNT_DETACH
	}
	err := unix.Unmount(dir, flags)
	if errors.Is(err, syscall.EPERM) {
		// Not root: fusermount3 is setuid and unmounts our own mounts.
		args := []string{"-u"}
		if lazy {
			args = append(args, "-z")
		}
		out, ferr := exec.Command("fusermount3", append(args, dir)...).CombinedOutput()
		if ferr != nil {
			return exitf(exitFailure, ferr, "fusermount3 -u %s: %s", dir, strings.TrimSpace(string(out)))
		}
		err = nil
	}
	if errors.Is(err, syscall.EBUSY) {
		return exitf(exitMountpoint, err, "%s is busy: files or directories are in use (close them, or rdmafs umount --lazy)", dir)
	}
	if err != nil {
		return exitf(exitFailure, err, "unmount %s: %v", dir, err)
	}
	if !havePID {
		return nil
	}
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if processGone(pid) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return exitf(exitFailure, nil, "unmounted %s, but its process %d is still closing its NFS session after %v", dir, pid, wait)
}

// processGone reports whether pid has exited: no such process, or a
// zombie its new parent has not reaped yet.
func processGone(pid int) bool {
	if unix.Kill(pid, 0) != nil {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name in parentheses.
	if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] == 'Z' || b[i+2] == 'X'
	}
	return false
}
