package fuse_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// The handles of memClient: its write-back and its lock-owners.

var _ fuse.Locks = (*memClient)(nil)

func (c *memClient) NewUnstableWriter(cred oncrpc.Credential, of *nfsclient.OpenFile, inFlight int) fuse.UnstableWriter {
	return &memWriter{c: c, fh: of.FH}
}

// memWriter sends each WriteAt's data as UNSTABLE WRITEs of at most
// wsize, one after the other, and keeps the first error for Flush and
// Commit, as nfsclient.UnstableWriter does.
type memWriter struct {
	c  *memClient
	fh []byte

	mu      sync.Mutex
	err     error
	pending int
}

func (w *memWriter) CommitEvery(int) {}

func (w *memWriter) WriteAt(ctx context.Context, view oncrpc.View, off uint64, release func()) error {
	data := view.Bytes()
	if release != nil {
		defer release()
	}
	for len(data) > 0 {
		n := min(len(data), w.c.wsize)
		w.c.mu.Lock()
		_, _, err := w.c.writeLocked("WRITE", w.fh, off, data[:n], nfsclient.Unstable)
		w.c.mu.Unlock()
		w.mu.Lock()
		if err != nil && w.err == nil {
			w.err = fmt.Errorf("write at %d: %w", off, err)
		} else if err == nil {
			w.pending += n
		}
		w.mu.Unlock()
		data, off = data[n:], off+uint64(n)
	}
	return w.Flush()
}

func (w *memWriter) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *memWriter) Commit(ctx context.Context) error {
	if err := w.Flush(); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending == 0 {
		return nil
	}
	if err := w.c.send("COMMIT"); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	w.pending = 0
	return nil
}

func (w *memWriter) Discard() {
	w.mu.Lock()
	w.pending = 0
	w.mu.Unlock()
}

func (w *memWriter) Pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pending
}

func (c *memClient) NewLocker(of *nfsclient.OpenFile, id uint64) fuse.Locker {
	return &memLocker{c: c, fid: binary.BigEndian.Uint64(of.FH), sid: of.StateID}
}

// memLocker keeps one owner's locks in the client's lock table; it
// does not split ranges: an unlock drops the owner's locks it overlaps.
type memLocker struct {
	c   *memClient
	fid uint64
	sid nfsclient.StateID
}

func overlaps(aOff, aLen, bOff, bLen uint64) bool {
	end := func(off, n uint64) uint64 {
		if n == nfsclient.LengthToEOF || off+n < off {
			return ^uint64(0)
		}
		return off + n
	}
	return aOff < end(bOff, bLen) && bOff < end(aOff, aLen)
}

func (l *memLocker) Held() bool {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	for _, k := range l.c.locks[l.fid] {
		if k.owner == l {
			return true
		}
	}
	return false
}

func (l *memLocker) conflictLocked(typ nfsclient.LockType, off, length uint64) *memLock {
	write := typ == nfsclient.WriteLT || typ == nfsclient.WriteWLT
	for i, k := range l.c.locks[l.fid] {
		if k.owner != l && (write || k.write) && overlaps(off, length, k.off, k.length) {
			return &l.c.locks[l.fid][i]
		}
	}
	return nil
}

func (l *memLocker) Lock(ctx context.Context, cred oncrpc.Credential, typ nfsclient.LockType, off, length uint64) error {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	if err := l.c.sendLocked("LOCK"); err != nil {
		return err
	}
	if l.conflictLocked(typ, off, length) != nil {
		return nfsclient.ErrDenied
	}
	write := typ == nfsclient.WriteLT || typ == nfsclient.WriteWLT
	l.c.locks[l.fid] = append(l.c.locks[l.fid], memLock{owner: l, write: write, off: off, length: length})
	return nil
}

func (l *memLocker) LockWait(ctx, lockCtx context.Context, cred oncrpc.Credential, typ nfsclient.LockType, off, length uint64) error {
	for {
		err := l.Lock(ctx, cred, typ, off, length)
		if err != nfsclient.ErrDenied {
			return err
		}
		select {
		case <-lockCtx.Done():
			return lockCtx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (l *memLocker) TestLock(ctx context.Context, cred oncrpc.Credential, typ nfsclient.LockType, off, length uint64) (*nfsclient.LockDenied, error) {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	if err := l.c.sendLocked("LOCKT"); err != nil {
		return nil, err
	}
	k := l.conflictLocked(typ, off, length)
	if k == nil {
		return nil, nil
	}
	t := nfsclient.ReadLT
	if k.write {
		t = nfsclient.WriteLT
	}
	return &nfsclient.LockDenied{Offset: k.off, Length: k.length, Type: t}, nil
}

func (l *memLocker) Unlock(ctx context.Context, cred oncrpc.Credential, off, length uint64) error {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	if err := l.c.sendLocked("LOCKU"); err != nil {
		return err
	}
	keep := l.c.locks[l.fid][:0]
	for _, k := range l.c.locks[l.fid] {
		if k.owner != l || !overlaps(off, length, k.off, k.length) {
			keep = append(keep, k)
		}
	}
	l.c.locks[l.fid] = keep
	return nil
}

// memLock is a byte-range lock one owner holds.
type memLock struct {
	owner       *memLocker
	write       bool
	off, length uint64
}
