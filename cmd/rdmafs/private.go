package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// Files and sockets another local user must not reach or redirect: the
// --log file, the CPU profile, the stats sockets of mounts and relays.

// openNoFollow opens path with flag, refusing a symbolic link as its
// last component (O_NOFOLLOW): a link planted where a privileged rdmafs
// writes would send its writes to the link's target. Files it creates
// get perm.
func openNoFollow(path string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, flag|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, perm)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("%s is a symbolic link (refused: give the file's own path)", path)
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	return f, nil
}

// privateListener is a unix socket listener whose socket file is 0600
// from the moment it has a name others can see, and which accepts only
// peers of this process's effective uid or root (SO_PEERCRED).
type privateListener struct {
	*net.UnixListener
	path string
	file os.FileInfo // the socket file, to unlink only our own
	uid  int
}

// listenUnixPrivate listens on a unix socket at path, replacing a stale
// one. The socket is bound in a fresh 0700 directory next to path (the
// umask is process-wide, so it is not changed), made 0600 there and
// renamed to path, so that no other user can connect to it even for a
// moment; its Accept drops connections from other users. Close removes
// the socket while path is still this listener's.
func listenUnixPrivate(path string) (net.Listener, error) {
	tmp, err := os.MkdirTemp(filepath.Dir(path), ".sock-")
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	defer os.RemoveAll(tmp)
	bound := filepath.Join(tmp, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: bound, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		ln.Close()
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := os.Chmod(bound, 0o600); err != nil {
		return fail(err)
	}
	if err := os.Rename(bound, path); err != nil {
		return fail(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(err)
	}
	return &privateListener{UnixListener: ln, path: path, file: fi, uid: os.Geteuid()}, nil
}

// Accept returns the next connection from this process's user or root;
// others are closed unanswered.
func (l *privateListener) Accept() (net.Conn, error) {
	for {
		c, err := l.UnixListener.AcceptUnix()
		if err != nil {
			return nil, err
		}
		uid, err := peerUID(c)
		if err == nil && (uid == l.uid || uid == 0) {
			return c, nil
		}
		c.Close()
	}
}

// Close stops listening and removes the socket, unless another process
// has put its own at the path since (a later mount on the same directory
// after a lazy unmount).
func (l *privateListener) Close() error {
	err := l.UnixListener.Close()
	if fi, serr := os.Lstat(l.path); serr == nil && os.SameFile(fi, l.file) {
		os.Remove(l.path)
	}
	return err
}

// peerUID returns the uid of the process at the other end of c, as the
// kernel recorded it at connect (SO_PEERCRED, unix(7)).
func peerUID(c *net.UnixConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, fmt.Errorf("SO_PEERCRED: %w", serr)
	}
	return int(cred.Uid), nil
}
