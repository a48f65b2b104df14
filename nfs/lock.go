package nfs

import (
	"context"
	"errors"
	"syscall"

	"github.com/rdmafs/rdmafs/nfsclient"
)

// Lock takes a byte-range lock on [offset, offset+length) of the file; a
// length of 0 reaches to the end of the file, however far it grows (as
// fcntl). exclusive asks for a write lock, which the file must be open
// for writing to get; else a read lock, which needs it open for
// reading. Without wait a conflicting lock fails the call with an error
// matching syscall.EAGAIN (and nfsclient.ErrDenied); with wait the call
// waits for it until ctx ends (RFC 8881 s9.6: blocking locks, with
// CB_NOTIFY_LOCK to hurry the retry).
//
// The locks belong to this File: other Files, even of this Client,
// conflict with them (as OFD locks do locally), and Close releases
// them. A lock over a range the File already holds replaces it.
func (f *File) Lock(ctx context.Context, offset, length int64, exclusive, wait bool) error {
	if err := f.check("lock", false); err != nil {
		return err
	}
	off, n, err := lockRange(offset, length)
	if err != nil {
		return pathErr("lock", f.name, err)
	}
	typ := nfsclient.ReadLT
	if exclusive {
		typ = nfsclient.WriteLT
	}
	l := f.lockOwner()
	if wait {
		// The LOCK that may be granted runs to its end even when ctx
		// ends the wait, so that no lock is left unknown to the client.
		lockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.c.callTimeout)
		defer cancel()
		err = f.c.nfs.LockWait(ctx, lockCtx, f.c.cred, l, typ, off, n)
	} else {
		_, err = f.c.nfs.Lock(ctx, f.c.cred, l, typ, off, n)
	}
	if errors.Is(err, nfsclient.ErrDenied) {
		// fcntl F_SETLK reports a conflicting lock with EAGAIN.
		return pathErr("lock", f.name, &nfsError{errno: syscall.EAGAIN, cause: err})
	}
	return pathErr("lock", f.name, err)
}

// Unlock releases the File's locks in [offset, offset+length); a length
// of 0 reaches to the end of the file (LOCKU, RFC 8881 s18.12).
func (f *File) Unlock(ctx context.Context, offset, length int64) error {
	if err := f.check("unlock", false); err != nil {
		return err
	}
	off, n, err := lockRange(offset, length)
	if err != nil {
		return pathErr("unlock", f.name, err)
	}
	return pathErr("unlock", f.name, f.c.nfs.Unlock(ctx, f.c.cred, f.lockOwner(), off, n))
}

// lockOwner returns the File's lock-owner, made on first use.
func (f *File) lockOwner() *nfsclient.Locker {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.locker == nil {
		f.locker = f.c.nfs.NewLocker(f.of, f.c.lockIDs.Add(1))
	}
	return f.locker
}

// lockRange is the offset and length4 of a range: length 0 is all ones,
// "to the end of the file" (RFC 8881 s18.10.3).
func lockRange(offset, length int64) (uint64, uint64, error) {
	if offset < 0 || length < 0 {
		return 0, 0, syscall.EINVAL
	}
	if length == 0 {
		return uint64(offset), nfsclient.LengthToEOF, nil
	}
	return uint64(offset), uint64(length), nil
}
