package nfs

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"syscall"

	"github.com/rdmafs/rdmafs/nfsclient"
)

// nfsError is a failed NFS call as a local file system would report it:
// it matches its errno (and through it fs.ErrNotExist, fs.ErrExist,
// fs.ErrPermission), fs.ErrInvalid for EINVAL, and the cause, which
// holds the nfsclient.Status.
type nfsError struct {
	errno syscall.Errno
	cause error
}

func (e *nfsError) Error() string {
	if e.cause == error(e.errno) {
		return e.errno.Error()
	}
	return e.errno.Error() + " (" + e.cause.Error() + ")"
}

func (e *nfsError) Unwrap() []error {
	if e.errno == syscall.EINVAL {
		return []error{e.errno, fs.ErrInvalid, e.cause}
	}
	return []error{e.errno, e.cause}
}

// wrapErr gives err the errno of the NFS status it carries (RFC 8881
// s15.1 statuses, mapped as Linux's nfs4_stat_to_errno does). Context
// ends and errors that are already errnos stay as they are.
func wrapErr(err error) error {
	if err == nil {
		return nil
	}
	var st nfsclient.Status
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.As(err, &st):
		return &nfsError{errno: st.Errno(), cause: err}
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		if en == syscall.EINVAL && !errors.Is(err, fs.ErrInvalid) {
			return &nfsError{errno: en, cause: err}
		}
		return err
	}
	return &nfsError{errno: nfsclient.Errno(err), cause: err}
}

// pathErr is the *fs.PathError of op on name.
func pathErr(op, name string, err error) error {
	if err == nil {
		return nil
	}
	return &fs.PathError{Op: op, Path: name, Err: wrapErr(err)}
}

// linkErr is the *os.LinkError of op from old to new.
func linkErr(op, old, new string, err error) error {
	if err == nil {
		return nil
	}
	return &os.LinkError{Op: op, Old: old, New: new, Err: wrapErr(err)}
}
