package nfsclient

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// LockType is an nfs_lock_type4 (RFC 8881 s18.10.1).
type LockType uint32

// Byte-range lock types. The W variants ask for a blocking lock: the
// server may then queue the request and notify with CB_NOTIFY_LOCK (RFC
// 8881 s9.6, s20.11).
const (
	ReadLT   LockType = 1
	WriteLT  LockType = 2
	ReadWLT  LockType = 3
	WriteWLT LockType = 4
)

// LengthToEOF is a length4 that reaches to the end of any file (RFC 8881
// s18.10.3: all bits set).
const LengthToEOF = ^uint64(0)

// Decoding limit for a lock-owner's opaque (NFS4_OPAQUE_LIMIT).
const maxLockOwnerLen = 1024

// LockDenied is a LOCK4denied (RFC 8881 s18.10.2): the lock that
// conflicts with the request.
type LockDenied struct {
	Offset   uint64
	Length   uint64
	Type     LockType
	ClientID uint64
	Owner    []byte
}

// Locker is the byte-range lock state of one lock-owner on one open file:
// the lock stateid, once the first LOCK has made one. It serialises the
// lock-owner's LOCK and LOCKU calls (RFC 8881 s9.4: one stateid per
// lock-owner and file, changed by each operation on it).
type Locker struct {
	of    *OpenFile
	owner []byte

	mu sync.Mutex // serialises the lock-owner's LOCK and LOCKU

	// smu guards the lock state; reclaim after a server restart takes it
	// (never mu, which a LOCK waiting for the recovery holds).
	smu    sync.Mutex
	sid    StateID
	have   bool        // sid is a lock stateid the server gave us
	ranges []lockRange // what the owner holds, for reclaim (RFC 8881 s9.6)
}

// lockRange is one byte range a lock-owner holds.
type lockRange struct {
	typ         LockType // ReadLT or WriteLT
	off, length uint64
}

// NewLocker returns the lock state of lock-owner id on the open file of.
// The owner string names both the open (its stateid's "other", unique per
// open on the server) and id (the FUSE lock owner): each open file here
// has its own open-owner, and a lock-owner is best kept to one open-owner
// (RFC 8881 s9.5, s18.10.3). Its lock stateid stays valid after a LOCKU
// of everything, until the open is closed (s8.2.4).
func (c *Client) NewLocker(of *OpenFile, id uint64) *Locker {
	owner := make([]byte, 0, 8+12+8)
	owner = append(owner, "rdmafs-l"...)
	owner = append(owner, of.StateID.Other[:]...)
	owner = binary.BigEndian.AppendUint64(owner, id)
	l := &Locker{of: of, owner: owner}
	if of.st != nil {
		of.st.mu.Lock()
		of.st.lockers = append(of.st.lockers, l)
		of.st.mu.Unlock()
	}
	return l
}

// Held reports whether the lock-owner holds locks on the file.
func (l *Locker) Held() bool {
	l.smu.Lock()
	defer l.smu.Unlock()
	return len(l.ranges) > 0
}

// rangeEnd is the exclusive end of [off, off+length); all ones for a
// range to the end of the file.
func rangeEnd(off, length uint64) uint64 {
	if length == LengthToEOF || off+length < off {
		return LengthToEOF
	}
	return off + length
}

func makeRange(typ LockType, start, end uint64) lockRange {
	if end == LengthToEOF {
		return lockRange{typ, start, LengthToEOF}
	}
	return lockRange{typ, start, end - start}
}

// cutLocked removes [off, off+length) from the held ranges (l.smu held).
func (l *Locker) cutLocked(off, length uint64) {
	end := rangeEnd(off, length)
	var out []lockRange
	for _, r := range l.ranges {
		rend := rangeEnd(r.off, r.length)
		if rend <= off || r.off >= end {
			out = append(out, r)
			continue
		}
		if r.off < off {
			out = append(out, makeRange(r.typ, r.off, off))
		}
		if rend > end {
			out = append(out, makeRange(r.typ, end, rend))
		}
	}
	l.ranges = out
}

// Ranges returns the byte ranges the lock-owner holds, as (type,
// offset, length) in no particular order.
func (l *Locker) Ranges() [][3]uint64 {
	l.smu.Lock()
	defer l.smu.Unlock()
	out := make([][3]uint64, len(l.ranges))
	for i, r := range l.ranges {
		out[i] = [3]uint64{uint64(r.typ), r.off, r.length}
	}
	return out
}

// lockArgs builds LOCK4args (RFC 8881 s18.10.1). reclaim re-takes a
// lock held before a server restart, in the grace period (s9.6,
// s18.10.3).
func lockArgs(typ LockType, off, length uint64, reclaim, newLock bool, openSID StateID, clientID uint64, owner []byte, lockSID StateID) lock4args {
	a := lock4args{locktype: typ, reclaim: reclaim, offset: off, length: length}
	if newLock {
		// RFC 8881 s18.10.3: the first lock of a lock-owner names the
		// open stateid it hangs off (open_to_lock_owner4). The seqids
		// are 4.0's request ordering, which the session's slots replace
		// in 4.1 (s2.10.6); servers ignore them.
		a.locker = locker4{newLockOwner: true, openOwner: openToLockOwner4{
			openSeqid: openSID.Seq, openStateid: openSID,
			lockOwner: stateOwner4{clientid: clientID, owner: owner}}}
	} else {
		// RFC 8881 s18.10.3: later locks use the lock stateid
		// (exist_lock_owner4).
		a.locker = locker4{lockOwner: existLockOwner4{lockStateid: lockSID}}
	}
	return a
}

// lockDenied is the LockDenied of a LOCK4denied (RFC 8881 s18.10.2).
func (d *lock4denied) lockDenied() *LockDenied {
	return &LockDenied{Offset: d.offset, Length: d.length, Type: d.locktype,
		ClientID: d.owner.clientid, Owner: d.owner.owner}
}

// sendLock sends one LOCK on fh, with the arguments args builds for each
// attempt (a recovery in between changes the stateids), and returns the
// lock stateid, or the conflicting lock with an error wrapping ErrDenied.
func (c *Client) sendLock(ctx context.Context, cred oncrpc.Credential, fh []byte, args func(cp *compound) lock4args) (StateID, *LockDenied, error) {
	var op lockOp
	err := c.do(ctx, cred, func(cp *compound) {
		op = lockOp{args: args(cp)}
		cp.putFH(fh)
		cp.add(&op)
	})
	if op.failed {
		return StateID{}, op.fail.lockDenied(), err
	}
	return op.res.lockStateid, nil, err
}

// Lock sends one LOCK for [off, off+length) (RFC 8881 s18.10). A conflict
// returns the holder's lock and an error wrapping ErrDenied.
func (c *Client) Lock(ctx context.Context, cred oncrpc.Credential, l *Locker, typ LockType, off, length uint64) (*LockDenied, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sid, denied, err := c.sendLock(ctx, cred, l.of.FH, func(cp *compound) lock4args {
		l.smu.Lock()
		defer l.smu.Unlock()
		return lockArgs(typ, off, length, false, !l.have, c.sid(cp, l.of.StateID), c.currentClientID(), l.owner, l.sid)
	})
	if err != nil {
		return denied, fmt.Errorf("LOCK [%d,+%d): %w", off, length, err)
	}
	if typ == ReadWLT || typ == WriteWLT {
		typ -= 2
	}
	l.smu.Lock()
	l.sid, l.have = sid, true
	// A lock replaces the owner's own locks in its range (POSIX).
	l.cutLocked(off, length)
	l.ranges = append(l.ranges, lockRange{typ, off, length})
	l.smu.Unlock()
	return nil, nil
}

// TestLock asks with LOCKT whether l's owner could lock [off, off+length)
// (RFC 8881 s18.11); it returns the conflicting lock, or nil. Locks of
// l's own owner never conflict.
func (c *Client) TestLock(ctx context.Context, cred oncrpc.Credential, l *Locker, typ LockType, off, length uint64) (*LockDenied, error) {
	var op lockTOp
	err := c.do(ctx, cred, func(cp *compound) {
		c.sid(cp, l.of.StateID) // fails for a lost open
		op = lockTOp{args: lockt4args{locktype: typ, offset: off, length: length,
			owner: stateOwner4{clientid: c.currentClientID(), owner: l.owner}}}
		cp.putFH(l.of.FH)
		cp.add(&op)
	})
	if op.failed {
		return op.fail.lockDenied(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("LOCKT [%d,+%d): %w", off, length, err)
	}
	return nil, nil
}

// Unlock sends LOCKU for [off, off+length) (RFC 8881 s18.12). An owner
// that never got a lock stateid holds nothing, and nothing is sent.
func (c *Client) Unlock(ctx context.Context, cred oncrpc.Credential, l *Locker, off, length uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.smu.Lock()
	have := l.have
	l.smu.Unlock()
	if !have {
		return nil
	}
	var op lockUOp
	// RFC 8881 s18.12.3: the lock type is any valid one; the server
	// releases whatever the owner holds in the range.
	err := c.do(ctx, cred, func(cp *compound) {
		c.sid(cp, l.of.StateID) // fails for a lost open
		l.smu.Lock()
		lsid := l.sid
		l.smu.Unlock()
		op = lockUOp{args: locku4args{locktype: WriteLT, lockStateid: lsid, offset: off, length: length}}
		cp.putFH(l.of.FH)
		cp.add(&op)
	})
	sid := op.res
	if err != nil {
		return fmt.Errorf("LOCKU [%d,+%d): %w", off, length, err)
	}
	l.smu.Lock()
	l.sid = sid
	l.cutLocked(off, length)
	l.smu.Unlock()
	return nil
}

// Blocking-lock retry bounds: the Linux client polls from 100 ms doubling
// to 30 s (nfs4_retry_setlk); we cap lower, as a local waiter expects.
const (
	lockRetryMin = 20 * time.Millisecond
	lockRetryMax = time.Second
)

// LockWait takes a lock for [off, off+length), waiting while another
// owner holds a conflicting one: it sends LOCK with the blocking type
// (READW_LT/WRITEW_LT) and, after NFS4ERR_DENIED, tries again after a
// backoff growing to a second, or at once when the server announces with
// CB_NOTIFY_LOCK that the lock may be free (RFC 8881 s9.6, s20.11). ctx
// ends the wait; each LOCK itself runs on lockCtx, so that a LOCK the
// server may have granted is never abandoned half-way.
func (c *Client) LockWait(ctx, lockCtx context.Context, cred oncrpc.Credential, l *Locker, typ LockType, off, length uint64) error {
	switch typ {
	case ReadLT:
		typ = ReadWLT
	case WriteLT:
		typ = WriteWLT
	}
	w := c.cb.locks.add(l.of.FH, c.currentClientID(), l.owner)
	defer c.cb.locks.remove(w)
	delay := lockRetryMin
	for {
		_, err := c.Lock(lockCtx, cred, l, typ, off, length)
		if !errors.Is(err, ErrDenied) {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for lock: %w", ctx.Err())
		case <-w.ch:
			t.Stop()
		case <-t.C:
		}
		delay = min(2*delay, lockRetryMax)
	}
}

// lockWaiter is one LockWait waiting for CB_NOTIFY_LOCK.
type lockWaiter struct {
	key string
	ch  chan struct{} // gets a token when the server notifies
}

// lockWaiters are the blocked lock requests, by file handle and
// lock-owner, for CB_NOTIFY_LOCK (RFC 8881 s20.11).
type lockWaiters struct {
	mu       sync.Mutex
	waiters  map[string]map[*lockWaiter]struct{}
	notifies int
}

func lockWaiterKey(fh []byte, clientID uint64, owner []byte) string {
	k := make([]byte, 0, 4+len(fh)+8+len(owner))
	k = binary.BigEndian.AppendUint32(k, uint32(len(fh)))
	k = append(k, fh...)
	k = binary.BigEndian.AppendUint64(k, clientID)
	return string(append(k, owner...))
}

func (ws *lockWaiters) add(fh []byte, clientID uint64, owner []byte) *lockWaiter {
	w := &lockWaiter{key: lockWaiterKey(fh, clientID, owner), ch: make(chan struct{}, 1)}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.waiters == nil {
		ws.waiters = make(map[string]map[*lockWaiter]struct{})
	}
	if ws.waiters[w.key] == nil {
		ws.waiters[w.key] = make(map[*lockWaiter]struct{})
	}
	ws.waiters[w.key][w] = struct{}{}
	return w
}

func (ws *lockWaiters) remove(w *lockWaiter) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	delete(ws.waiters[w.key], w)
	if len(ws.waiters[w.key]) == 0 {
		delete(ws.waiters, w.key)
	}
}

// notify wakes the waiters of a CB_NOTIFY_LOCK.
func (ws *lockWaiters) notify(fh []byte, clientID uint64, owner []byte) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.notifies++
	for w := range ws.waiters[lockWaiterKey(fh, clientID, owner)] {
		select {
		case w.ch <- struct{}{}:
		default:
		}
	}
}

// LockNotifies returns how many CB_NOTIFY_LOCKs the client has received.
func (c *Client) LockNotifies() int {
	c.cb.locks.mu.Lock()
	defer c.cb.locks.mu.Unlock()
	return c.cb.locks.notifies
}

// decodeNotifyLock reads CB_NOTIFY_LOCK4args (RFC 8881 s20.11.1): the
// file handle and the lock-owner whose blocked lock may now succeed.
func decodeNotifyLock(d *xdr.Decoder) (fh []byte, clientID uint64, owner []byte, err error) {
	fh = d.Opaque(maxFHSize)
	clientID = d.Uint64()
	owner = d.Opaque(maxLockOwnerLen)
	return fh, clientID, owner, d.Err()
}
