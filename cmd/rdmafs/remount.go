package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// remount changes the VFS flags of the rdmafs mount on o.Dir ("mount -o
// remount,ro /mnt", which mount(8) hands to mount.fuse.rdmafs): mount(2)
// with MS_REMOUNT on the mountpoint, the flags the options name changed
// and the others kept. The kernel's FUSE side takes ro/rw, sync/async and
// lazytime for the super block (fs/fuse/inode.c fuse_reconfigure,
// MS_RMT_MASK) and the per-mount flags (nosuid, nodev, noexec, the atime
// options) for the mount; dirsync stays as mounted. The serving process
// needs to know nothing: the kernel refuses writes to a read-only mount
// itself. NFS options (proto, rsize, ...) keep the values of the mount,
// as on a kernel NFS remount, which refuses to change most of them.
func remount(o *mountOptions) error {
	cur, fstype, err := mountFlagsOf(o.Dir)
	if err != nil {
		return exitf(exitMountpoint, err, "remount: %v", err)
	}
	if fstype != "fuse.rdmafs" {
		return exitf(exitMountpoint, nil, "remount: %s is not an rdmafs mount (%s)", o.Dir, fstype)
	}
	flags := cur&^o.VFSGiven | o.VFSFlags&o.VFSGiven
	if err := unix.Mount("", o.Dir, "", unix.MS_REMOUNT|flags, ""); err != nil {
		if errors.Is(err, unix.EPERM) && os.Geteuid() != 0 {
			return exitf(exitFUSE, err, "remount of %s: only root can remount (fusermount3 cannot): %v", o.Dir, err)
		}
		return exitf(exitFUSE, err, "remount of %s: %v", o.Dir, err)
	}
	return nil
}

// mountFlagsOf returns the MS_* flags of the mount on dir and its type,
// from /proc/self/mountinfo (proc(5)): the per-mount options (ro,
// nosuid, nodev, noexec, the atime options, nosymfollow) and the super
// block's (ro, sync, dirsync, lazytime).
func mountFlagsOf(dir string) (uintptr, string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0, "", err
	}
	var flags uintptr
	fstype, found := "", false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || unescapeMount(f[4]) != dir {
			continue
		}
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+3 >= len(f) {
			continue
		}
		// The last mount on dir is the one a path walk sees.
		found, fstype, flags = true, f[sep+1], 0
		mountOpts := map[string]uintptr{
			"ro": unix.MS_RDONLY, "nosuid": unix.MS_NOSUID, "nodev": unix.MS_NODEV,
			"noexec": unix.MS_NOEXEC, "noatime": unix.MS_NOATIME, "nodiratime": unix.MS_NODIRATIME,
			"relatime": unix.MS_RELATIME, "nosymfollow": unix.MS_NOSYMFOLLOW,
		}
		for _, opt := range strings.Split(f[5], ",") {
			flags |= mountOpts[opt]
		}
		if flags&(unix.MS_NOATIME|unix.MS_RELATIME) == 0 {
			flags |= unix.MS_STRICTATIME
		}
		sbOpts := map[string]uintptr{
			"ro": unix.MS_RDONLY, "sync": unix.MS_SYNCHRONOUS, "dirsync": unix.MS_DIRSYNC, "lazytime": unix.MS_LAZYTIME,
		}
		for _, opt := range strings.Split(f[sep+3], ",") {
			flags |= sbOpts[opt]
		}
	}
	if !found {
		return 0, "", fmt.Errorf("nothing is mounted on %s", dir)
	}
	return flags, fstype, nil
}
