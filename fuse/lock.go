package fuse

import (
	"context"
	"errors"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// fcntl and flock(2) locks go to the server as NFSv4.1 byte-range locks
// (RFC 8881 s9, LOCK/LOCKT/LOCKU). The kernel names the lock owner: for
// fcntl locks the process's file table, for flock the open file
// description (FUSE_LK_FLOCK in the flags; the range is the whole file).
// Each (file, owner) pair is one NFS lock-owner (nfsclient.Locker).

var (
	_ = (fs.FileGetlker)((*file)(nil))
	_ = (fs.FileSetlker)((*file)(nil))
	_ = (fs.FileSetlkwer)((*file)(nil))
)

// Locks makes the byte-range lock state of lock-owners (the Client's
// NewLocker, LOCK, LOCKT and LOCKU).
type Locks interface {
	// NewLocker returns the byte-range lock state of lock-owner id on
	// the open file of.
	NewLocker(of *nfsclient.OpenFile, id uint64) Locker
}

// Locker is one lock-owner's byte-range locks on one open file
// (nfsclient.Locker and the Client's LOCK, LOCKT and LOCKU).
type Locker interface {
	// Held reports whether the owner holds any lock.
	Held() bool
	// Lock takes a lock without waiting (LOCK): nfsclient.ErrDenied
	// when another owner holds a conflicting one.
	Lock(ctx context.Context, cred oncrpc.Credential, typ nfsclient.LockType, off, length uint64) error
	// LockWait takes a lock, waiting for a conflicting one to go until
	// lockCtx ends; ctx bounds each LOCK.
	LockWait(ctx, lockCtx context.Context, cred oncrpc.Credential, typ nfsclient.LockType, off, length uint64) error
	// TestLock returns the lock that conflicts with the one described
	// (LOCKT), or nil.
	TestLock(ctx context.Context, cred oncrpc.Credential, typ nfsclient.LockType, off, length uint64) (*nfsclient.LockDenied, error)
	// Unlock releases a range (LOCKU).
	Unlock(ctx context.Context, cred oncrpc.Credential, off, length uint64) error
}

// offsetMax is the kernel's OFFSET_MAX: a lock "to end of file".
const offsetMax = 1<<63 - 1

// lockTable is the lock state of a mount: one NFS lock-owner per file
// and FUSE lock owner, so that all of a process's fcntl locks on a file
// are one owner's, whichever descriptor took them (POSIX). The lock-owner
// hangs off the open file through which the owner locked first (RFC 8881
// s18.10.3, open_to_lock_owner4); it is dropped when that file is
// released, by which time close(2) has released the owner's locks.
type lockTable struct {
	mu     sync.Mutex
	owners map[lockKey]*ownerLock
}

type lockKey struct {
	ino, owner uint64
}

type ownerLock struct {
	l Locker
	h *file // the open file the lock-owner belongs to
}

// locker returns the lock-owner of owner on h's file, made on h if the
// owner has none yet.
func (h *file) locker(owner uint64) (Locker, *file) {
	t := &h.n.fsys.locks
	k := lockKey{h.n.StableAttr().Ino, owner}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.owners == nil {
		t.owners = make(map[lockKey]*ownerLock)
	}
	ol := t.owners[k]
	// An owner that holds nothing moves to the open it uses now: that
	// open may allow what the first did not (a write lock needs an open
	// for writing: NFS4ERR_OPENMODE, RFC 8881 s18.10).
	if ol == nil || ol.h != h && !ol.l.Held() {
		ol = &ownerLock{l: h.n.fsys.c.NewLocker(h.of, owner), h: h}
		t.owners[k] = ol
	}
	return ol.l, ol.h
}

// lookup returns the lock-owner of owner on h's file, or nil.
func (h *file) lookupLocker(owner uint64) (Locker, *file) {
	t := &h.n.fsys.locks
	t.mu.Lock()
	defer t.mu.Unlock()
	ol := t.owners[lockKey{h.n.StableAttr().Ino, owner}]
	if ol == nil {
		return nil, nil
	}
	return ol.l, ol.h
}

// nfsRange turns the kernel's inclusive [start, end] into offset and
// length; end OFFSET_MAX means to the end of the file (RFC 8881 s18.10.3:
// length all ones).
func nfsRange(lk *gofuse.FileLock) (off, length uint64) {
	if lk.End >= offsetMax || lk.End == ^uint64(0) {
		return lk.Start, nfsclient.LengthToEOF
	}
	if lk.End < lk.Start {
		return lk.Start, 0
	}
	return lk.Start, lk.End - lk.Start + 1
}

// fuseRange is the inverse of nfsRange for a conflicting lock.
func fuseRange(off, length uint64) (start, end uint64) {
	start = min(off, offsetMax)
	if length == nfsclient.LengthToEOF || length == 0 || off+length-1 < off || off+length-1 >= offsetMax {
		return start, offsetMax
	}
	return start, off + length - 1
}

func lockType(typ uint32) (nfsclient.LockType, bool) {
	switch typ {
	case syscall.F_RDLCK:
		return nfsclient.ReadLT, true
	case syscall.F_WRLCK:
		return nfsclient.WriteLT, true
	}
	return 0, false
}

// Getlk answers F_GETLK with LOCKT (RFC 8881 s18.11): the conflicting
// lock's range and type, or F_UNLCK. The holder may be on another client,
// so its pid is not known and reported as 0.
func (h *file) Getlk(ctx context.Context, owner uint64, lk *gofuse.FileLock, flags uint32, out *gofuse.FileLock) syscall.Errno {
	typ, ok := lockType(lk.Typ)
	if !ok {
		return syscall.EINVAL
	}
	off, length := nfsRange(lk)
	l, lh := h.locker(owner)
	dn, err := l.TestLock(ctx, lh.cred, typ, off, length)
	if err != nil {
		return h.n.errno("LOCKT", err)
	}
	if dn == nil {
		*out = *lk
		out.Typ = syscall.F_UNLCK
		h.traceLock("GETLK", owner, lk, flags, "free")
		return 0
	}
	out.Start, out.End = fuseRange(dn.Offset, dn.Length)
	out.Typ = syscall.F_RDLCK
	if dn.Type == nfsclient.WriteLT || dn.Type == nfsclient.WriteWLT {
		out.Typ = syscall.F_WRLCK
	}
	out.Pid = 0
	h.traceLock("GETLK", owner, lk, flags, "conflict")
	return 0
}

// Setlk takes or releases a lock without waiting (F_SETLK, flock with
// LOCK_NB): a conflict is EAGAIN.
func (h *file) Setlk(ctx context.Context, owner uint64, lk *gofuse.FileLock, flags uint32) syscall.Errno {
	return h.setlk(ctx, owner, lk, flags, false)
}

// Setlkw takes a lock, waiting for conflicting ones to go (F_SETLKW,
// flock without LOCK_NB) until the kernel interrupts the request: any
// signal ends it with EINTR (killable passes SETLKW the kernel's cancel
// channel: interrupt.go).
func (h *file) Setlkw(ctx context.Context, owner uint64, lk *gofuse.FileLock, flags uint32) syscall.Errno {
	return h.setlk(ctx, owner, lk, flags, true)
}

func (h *file) setlk(ctx context.Context, owner uint64, lk *gofuse.FileLock, flags uint32, wait bool) syscall.Errno {
	// The owner's LOCKs go under the open it first locked through (lh).
	l, lh := h.locker(owner)
	off, length := nfsRange(lk)
	// LOCK and LOCKU change state on the server: they run to completion
	// even when the kernel interrupts the request (see uninterrupted).
	opCtx := uninterrupted(ctx)
	if lk.Typ == syscall.F_UNLCK {
		// Data written under the lock reaches the server before the
		// lock goes, as the Linux client's do_unlk flushes.
		if errno := h.n.flushWriters(opCtx); errno != 0 {
			return errno
		}
		if err := l.Unlock(opCtx, lh.cred, off, length); err != nil {
			return h.n.errno("LOCKU", err)
		}
		h.traceLock("UNLOCK", owner, lk, flags, "ok")
		return 0
	}
	typ, ok := lockType(lk.Typ)
	if !ok {
		return syscall.EINVAL
	}
	var err error
	if wait {
		err = l.LockWait(ctx, opCtx, lh.cred, typ, off, length)
	} else {
		err = l.Lock(opCtx, lh.cred, typ, off, length)
	}
	switch {
	case err == nil:
	case errors.Is(err, nfsclient.ErrDenied):
		h.traceLock("SETLK", owner, lk, flags, "denied")
		return syscall.EAGAIN
	case errors.Is(err, context.Canceled):
		h.traceLock("SETLKW", owner, lk, flags, "interrupted")
		return syscall.EINTR
	default:
		return h.n.errno("LOCK", err)
	}
	// Another client may have written under its lock: drop the cached
	// pages and attributes (the Linux client revalidates the mapping
	// after a lock too).
	h.n.NotifyContent(0, 0)
	h.traceLock("SETLK", owner, lk, flags, "granted")
	return 0
}

// releaseOwner releases every lock owner holds on h's file.
func (h *file) releaseOwner(ctx context.Context, owner uint64) syscall.Errno {
	l, lh := h.lookupLocker(owner)
	if l == nil || !l.Held() {
		return 0
	}
	if err := l.Unlock(ctx, lh.cred, 0, nfsclient.LengthToEOF); err != nil {
		return h.n.errno("LOCKU", err)
	}
	h.traceLock("RELEASE-OWNER", owner, &gofuse.FileLock{End: offsetMax}, 0, "ok")
	return 0
}

// flushLocks runs at close(2) with the closing process's lock owner:
// POSIX drops all the process's fcntl locks on the file, also those
// taken through another descriptor.
func (h *file) flushLocks(ctx context.Context, owner uint64) syscall.Errno {
	return h.releaseOwner(ctx, owner)
}

// holdsLocks reports whether a lock-owner of h's holds locks.
func (h *file) holdsLocks() bool {
	t := &h.n.fsys.locks
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, ol := range t.owners {
		if ol.h == h && ol.l.Held() {
			return true
		}
	}
	return false
}

// releaseLocks releases the locks of the lock-owners that belong to h,
// and forgets them, before CLOSE: a server refuses to CLOSE an open with
// locks (RFC 8881 s18.2.4, NFS4ERR_LOCKS_HELD). flock locks go here
// (FUSE's RELEASE has FUSE_RELEASE_FLOCK_UNLOCK). RELEASE_LOCKOWNER is
// not sent: it is NFSv4.0's, "MUST NOT implement" in 4.1 (RFC 8881 s17);
// the lock state goes with the CLOSE (s8.2.4).
func (h *file) releaseLocks(ctx context.Context) {
	t := &h.n.fsys.locks
	t.mu.Lock()
	var mine []Locker
	for k, ol := range t.owners {
		if ol.h == h {
			mine = append(mine, ol.l)
			delete(t.owners, k) // later locks of the owner start afresh
		}
	}
	t.mu.Unlock()
	for _, l := range mine {
		if l.Held() {
			if err := l.Unlock(ctx, h.cred, 0, nfsclient.LengthToEOF); err != nil {
				h.n.errno("LOCKU", err)
			}
		}
	}
}

func (h *file) traceLock(op string, owner uint64, lk *gofuse.FileLock, flags uint32, res string) {
	if !h.n.fsys.tr.On(trace.FUSE) {
		return
	}
	h.n.fsys.trace("%s ino=%d owner=%#x type=%d range=[%d,%d] flock=%v: %s", op, h.n.StableAttr().Ino,
		owner, lk.Typ, lk.Start, lk.End, flags&gofuse.FUSE_LK_FLOCK != 0, res)
}
