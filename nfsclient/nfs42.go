package nfsclient

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// NFSv4.2 (RFC 7862) and extended attributes (RFC 8276). The client
// speaks minor version 2 unless Config.MinorVersion says 1, and falls
// back to 1 when the server refuses 2 (NFS4ERR_MINOR_VERS_MISMATCH on
// EXCHANGE_ID, RFC 8881 s16.2.3). On a 4.1 session the methods below
// fail with NFS4ERR_NOTSUPP (EOPNOTSUPP) without asking the server.
//
// Which server does what (integration tests, nfs42_integration_test.go):
// see the table in docs/design.md.

// MinorVersion returns the NFSv4 minor version of the session: 1 or 2.
func (c *Client) MinorVersion() int { return int(c.minor.Load()) }

// need42 refuses an NFSv4.2 operation on a 4.1 session.
func (c *Client) need42(op string) error {
	if c.minor.Load() < minorVersion2 {
		return &OpError{Op: op, Status: ErrNotSupp}
	}
	return nil
}

// Allocate reserves space for [off, off+length) of the file fh open with
// sid (ALLOCATE, RFC 7862 s15.1), so that later writes there do not fail
// for lack of space; it returns the file's attributes after it (a range
// past the end of the file may extend it: Attr.Size says). It is
// fallocate(2) mode 0.
func (c *Client) Allocate(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, off, length uint64) (Attr, error) {
	if err := c.need42("ALLOCATE"); err != nil {
		return Attr{}, err
	}
	var a Attr
	err := c.do(ctx, cred, func(cp *compound) {
		cp.putFH(fh)
		cp.add(&allocateOp{args: allocate4args{stateid: c.sid(cp, sid), offset: off, length: length}})
		cp.getAttr(fileAttrs, &a)
	})
	return a, err
}

// Deallocate punches a hole in [off, off+length) of the file fh open with
// sid (DEALLOCATE, RFC 7862 s15.4): reads there return zeros and the
// space is freed; the size does not change. It returns the file's
// attributes after it. It is fallocate(2) FALLOC_FL_PUNCH_HOLE|KEEP_SIZE.
func (c *Client) Deallocate(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, off, length uint64) (Attr, error) {
	if err := c.need42("DEALLOCATE"); err != nil {
		return Attr{}, err
	}
	var a Attr
	err := c.do(ctx, cred, func(cp *compound) {
		cp.putFH(fh)
		cp.add(&deallocateOp{args: deallocate4args{stateid: c.sid(cp, sid), offset: off, length: length}})
		cp.getAttr(fileAttrs, &a)
	})
	return a, err
}

// SeekWhat is what Seek looks for (data_content4, RFC 7862 s4.1.1).
type SeekWhat uint32

// Seek targets.
const (
	SeekData SeekWhat = nfs4ContentData // lseek SEEK_DATA
	SeekHole SeekWhat = nfs4ContentHole // lseek SEEK_HOLE
)

// Seek finds the first byte at or after off that is data (SeekData) or
// in a hole (SeekHole) in the file fh open with sid (SEEK, RFC 7862
// s15.11). eof says there is no data after the returned offset. A
// SeekData at or after the last data fails with NFS4ERR_NXIO (ENXIO), as
// lseek does.
func (c *Client) Seek(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, off uint64, what SeekWhat) (newOff uint64, eof bool, err error) {
	if err := c.need42("SEEK"); err != nil {
		return 0, false, err
	}
	op := &seekOp{}
	err = c.do(ctx, cred, func(cp *compound) {
		op.args = seek4args{stateid: c.sid(cp, sid), offset: off, what: uint32(what)}
		cp.putFH(fh)
		cp.add(op)
	})
	return op.res.offset, op.res.eof, err
}

// CopyResult is what a COPY did (write_response4, RFC 7862 s15.2.2).
type CopyResult struct {
	Count     uint64 // bytes copied: may be fewer than asked (a short copy)
	Committed Stable // FileSync once Copy committed them
	Async     bool   // the server ran (part of) the copy in the background
}

// asyncCopyMin is the smallest COPY that Copy asks the server to run in
// the background (ca_synchronous false, RFC 7862 s15.2.3). A server may
// copy less than asked per synchronous COPY, to keep a thread and a
// session slot from being held long (knfsd, Linux 6.1: 4 MiB each), so
// a large copy would be many COPYs and COMMITs; an asynchronous one runs
// to the end in the server (knfsd: one kernel thread, which also syncs
// the range) and is reported by one CB_OFFLOAD. Below this size the
// callback's extra round trip is not worth it.
const asyncCopyMin = 8 << 20

// Copy copies count bytes at srcOff of the file src (open with srcSID)
// to dstOff of dst (open with dstSID) inside the server (COPY, RFC 7862
// s15.2; intra-server, no data crosses the network), as
// copy_file_range(2). From asyncCopyMin bytes on it asks for a copy in
// the background and waits for its CB_OFFLOAD (or OFFLOAD_STATUS polls
// when no callback comes); below that, or where the server will only
// copy synchronously, it sends synchronous COPYs and goes on after each
// short count, until count bytes are copied or the source ends (a COPY
// that copies nothing). Copied data not yet stable is committed, with
// one COMMIT, before Copy returns. If ctx ends, Copy stops after the
// COPY under way (a copy in the background is cancelled, OFFLOAD_CANCEL)
// and returns what it copied and committed, or ctx's error if nothing.
// A server that will not copy gives an error whose Errno is EOPNOTSUPP
// (NFS4ERR_NOTSUPP, OFFLOAD_DENIED, OFFLOAD_NO_REQS): the caller then
// reads and writes.
func (c *Client) Copy(ctx context.Context, cred oncrpc.Credential, src []byte, srcSID StateID, dst []byte, dstSID StateID, srcOff, dstOff, count uint64) (CopyResult, error) {
	if err := c.need42("COPY"); err != nil {
		return CopyResult{}, err
	}
	var (
		res      CopyResult
		err      error
		unstable bool     // some copied data awaits a COMMIT
		verf     Verifier // the synchronous COPYs' write verifier
		haveVerf bool
	)
	for res.Count < count {
		if res.Count > 0 && ctx.Err() != nil {
			break // interrupted: what is copied is committed and returned
		}
		left := count - res.Count
		sync := left < asyncCopyMin || c.copies.syncOnly.Load()
		var p copyOut
		p, err = c.copyOnce(ctx, cred, src, srcSID, dst, dstSID, srcOff+res.Count, dstOff+res.Count, left, sync)
		if !sync && (errors.Is(err, ErrOffloadNoReqs) || errors.Is(err, errCopyLost)) {
			// RFC 7862 s15.2.3: a server that cannot copy as asked
			// answers NFS4ERR_OFFLOAD_NO_REQS (with the requirements it
			// can meet); an asynchronous copy whose CB_OFFLOAD never came
			// (s16.1.3) left the range in an unknown state. Either way:
			// synchronous COPYs from now on (copying a range again is
			// harmless, the source is the same).
			c.trace("COPY: asynchronous copy: %v; synchronous from now on", err)
			c.copies.syncOnly.Store(true)
			err = nil
			continue
		}
		if err != nil {
			break
		}
		if p.count > left {
			return res, fmt.Errorf("%w: COPY of %d bytes reports %d copied", ErrProtocol, left, p.count)
		}
		res.Count += p.count
		res.Async = res.Async || p.async
		if p.committed != FileSync && p.count > 0 {
			unstable = true
			if sync {
				// RFC 8881 s18.32.3 (WRITE, which COPY's answer follows,
				// RFC 7862 s15.2.3): another verifier means the server
				// restarted and may have lost the earlier unstable data.
				if haveVerf && p.verf != verf {
					return CopyResult{}, fmt.Errorf("COPY: %w: write verifier changed between COPYs", ErrIO)
				}
				verf, haveVerf = p.verf, true
			}
		}
		if p.count == 0 || p.async {
			// The source ended; or the server ran the copy in the
			// background, which goes to the end (or an error) by itself.
			break
		}
	}
	if res.Count == 0 {
		return res, err
	}
	if err != nil {
		// Copied some, then failed: the copied part is returned, as a
		// short write; the caller's next call meets the error.
		c.trace("COPY: stopped after %d bytes: %v", res.Count, err)
	}
	if unstable {
		// RFC 7862 s15.2.3: data copied unstable is committed like
		// written data, here once for all the COPYs (RFC 8881 s18.3.3:
		// count 0 commits to the end of the file).
		n := uint32(0)
		if res.Count <= math.MaxUint32 {
			n = uint32(res.Count)
		}
		v, err := c.Commit(context.WithoutCancel(ctx), cred, dst, dstOff, n)
		if err != nil {
			return CopyResult{}, fmt.Errorf("COMMIT after COPY: %w", err)
		}
		if haveVerf && v != verf {
			return CopyResult{}, fmt.Errorf("COPY: %w: write verifier changed before COMMIT", ErrIO)
		}
	}
	res.Committed = FileSync
	return res, nil
}

// errCopyLost is an asynchronous copy the server forgot without a
// CB_OFFLOAD reaching the client.
var errCopyLost = errors.New("asynchronous COPY ended without CB_OFFLOAD")

// copyOnce sends one COPY (sync false: one the server may run in the
// background) and, for a copy in the background, waits for its end. It
// does not commit. The COPY itself is sent whatever ctx says, so that
// the server's answer, and a background copy's stateid, is not lost to
// an interrupt; the wait for the copy's end stops with ctx, and cancels
// it.
func (c *Client) copyOnce(ctx context.Context, cred oncrpc.Credential, src []byte, srcSID StateID, dst []byte, dstSID StateID, srcOff, dstOff, count uint64, sync bool) (copyOut, error) {
	op := &copyOp{}
	err := c.do(context.WithoutCancel(ctx), cred, func(cp *compound) {
		op.args = copy4args{srcStateid: c.sid(cp, srcSID), dstStateid: c.sid(cp, dstSID),
			srcOffset: srcOff, dstOffset: dstOff, count: count, consecutive: true, synchronous: sync}
		cp.putFH(src)
		cp.saveFH()
		cp.putFH(dst)
		cp.add(op)
	})
	if err != nil {
		return copyOut{}, err
	}
	wr := op.res.response
	if len(wr.callbackId) == 1 {
		// RFC 7862 s15.2.3: an asynchronous copy; its result comes in
		// CB_OFFLOAD, or from OFFLOAD_STATUS. (A server may also answer
		// a request for one synchronously: no callback id.)
		out, err := c.waitCopy(ctx, cred, dst, wr.callbackId[0])
		out.async = true
		return out, err
	}
	if !sync {
		c.trace("COPY of %d bytes asked to run in the background: done synchronously", count)
	}
	return copyOut{count: wr.count, committed: wr.committed, verf: Verifier(wr.writeverf)}, nil
}

// copy is one COPY, committed; sync false lets the server copy in the
// background. Tests use it.
func (c *Client) copy(ctx context.Context, cred oncrpc.Credential, src []byte, srcSID StateID, dst []byte, dstSID StateID, srcOff, dstOff, count uint64, sync bool) (CopyResult, error) {
	if err := c.need42("COPY"); err != nil {
		return CopyResult{}, err
	}
	out, err := c.copyOnce(ctx, cred, src, srcSID, dst, dstSID, srcOff, dstOff, count, sync)
	if err != nil {
		return CopyResult{}, err
	}
	res := CopyResult{Count: out.count, Committed: out.committed, Async: out.async}
	if res.Committed != FileSync && res.Count > 0 {
		v, err := c.Commit(ctx, cred, dst, dstOff, uint32(min(res.Count, math.MaxUint32)))
		if err != nil {
			return res, fmt.Errorf("COMMIT after COPY: %w", err)
		}
		if !out.async && v != out.verf {
			return res, fmt.Errorf("COPY: %w: write verifier changed before COMMIT", ErrIO)
		}
		res.Committed = FileSync
	}
	return res, nil
}

// copyOut is the outcome of an asynchronous COPY.
type copyOut struct {
	count     uint64
	committed Stable
	verf      Verifier
	err       error
	async     bool // the server copied in the background
}

func copyOutcome(info *offloadInfo4) copyOut {
	if info.status != StatusOK {
		return copyOut{count: info.count, err: &OpError{Op: "COPY", Status: info.status}}
	}
	r := &info.resok
	return copyOut{count: r.count, committed: r.committed, verf: r.writeverf}
}

// copyTable matches CB_OFFLOADs to the COPYs waiting for them, by the
// copy's stateid. One that comes before its waiter is kept (a few).
type copyTable struct {
	// syncOnly: the server refused, or lost, an asynchronous copy:
	// Copy asks for synchronous ones only.
	syncOnly atomic.Bool

	mu      sync.Mutex
	waiters map[[12]byte]chan copyOut
	early   map[[12]byte]copyOut
}

const maxEarlyCopies = 64

func (t *copyTable) wait(sid StateID) chan copyOut {
	ch := make(chan copyOut, 1)
	t.mu.Lock()
	defer t.mu.Unlock()
	if out, ok := t.early[sid.Other]; ok {
		delete(t.early, sid.Other)
		ch <- out
		return ch
	}
	if t.waiters == nil {
		t.waiters = make(map[[12]byte]chan copyOut)
	}
	t.waiters[sid.Other] = ch
	return ch
}

func (t *copyTable) forget(sid StateID) {
	t.mu.Lock()
	delete(t.waiters, sid.Other)
	t.mu.Unlock()
}

func (t *copyTable) done(sid StateID, out copyOut) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ch, ok := t.waiters[sid.Other]; ok {
		delete(t.waiters, sid.Other)
		ch <- out
		return
	}
	if t.early == nil {
		t.early = make(map[[12]byte]copyOut)
	}
	if len(t.early) < maxEarlyCopies {
		t.early[sid.Other] = out
	}
}

// copyLostAfter is how long waitCopy waits for a CB_OFFLOAD once
// OFFLOAD_STATUS says the server has forgotten the copy.
const copyLostAfter = 30 * time.Second

// waitCopy waits for the asynchronous copy sid into dst to end: for its
// CB_OFFLOAD, asking OFFLOAD_STATUS (RFC 7862 s15.9) now and then in
// case no callback comes. If ctx ends first, the copy is cancelled
// (OFFLOAD_CANCEL, s15.8), so that an interrupted copy_file_range does
// not leave the server copying. (Seen with Linux 6.1's knfsd: a copy
// cancelled before it had copied anything left the client ID busy,
// DESTROY_CLIENTID answering NFS4ERR_CLIENTID_BUSY; probably its thread
// never ran, so nothing cleaned the copy up.) A copy the server has forgotten
// (NFS4ERR_BAD_STATEID from OFFLOAD_STATUS) whose CB_OFFLOAD does not
// come within copyLostAfter gives errCopyLost.
func (c *Client) waitCopy(ctx context.Context, cred oncrpc.Credential, dst []byte, sid StateID) (copyOut, error) {
	ch := c.copies.wait(sid)
	defer c.copies.forget(sid)
	cancelCopy := func() (copyOut, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		err := c.do(cctx, cred, func(cp *compound) {
			cp.putFH(dst)
			cp.add(&offloadCancelOp{args: offloadCancel4args{stateid: sid}})
		})
		c.trace("COPY %x: interrupted: OFFLOAD_CANCEL: %v", sid.Other, err)
		return copyOut{}, ctx.Err()
	}
	delay := 50 * time.Millisecond
	var forgotten time.Time // when OFFLOAD_STATUS first said BAD_STATEID
	for {
		t := time.NewTimer(delay)
		select {
		case out := <-ch:
			t.Stop()
			c.trace("COPY %x: CB_OFFLOAD: %d bytes, %v", sid.Other, out.count, out.err)
			return out, out.err
		case <-ctx.Done():
			t.Stop()
			return cancelCopy()
		case <-t.C:
		}
		delay = min(2*delay, time.Second)
		st := &offloadStatusOp{args: offloadStatus4args{stateid: sid}}
		err := c.do(context.WithoutCancel(ctx), cred, func(cp *compound) {
			cp.putFH(dst)
			cp.add(st)
		})
		c.trace("COPY %x: OFFLOAD_STATUS: %+v, %v", sid.Other, st.res, err)
		switch {
		case errors.Is(err, ErrBadStateID):
			// The copy is over and forgotten (its CB_OFFLOAD on the
			// way, s15.9.3), or never known: wait for the callback a
			// while.
			if forgotten.IsZero() {
				forgotten = time.Now()
			} else if time.Since(forgotten) > copyLostAfter {
				return copyOut{}, errCopyLost
			}
			continue
		case errors.Is(err, ErrNotSupp):
			// The server reports by callback only: wait for CB_OFFLOAD.
			delay = time.Second
			continue
		case err != nil:
			return copyOut{}, fmt.Errorf("OFFLOAD_STATUS: %w", err)
		}
		if len(st.res.complete) == 1 {
			// Done; the stability of the data is not reported here, so
			// the caller commits.
			if s := st.res.complete[0]; s != StatusOK {
				return copyOut{count: st.res.count}, &OpError{Op: "COPY", Status: s}
			}
			return copyOut{count: st.res.count, committed: Unstable}, nil
		}
	}
}

// Clone makes [dstOff, dstOff+count) of dst share the blocks of
// [srcOff, srcOff+count) of src (CLONE, RFC 7862 s15.13; count 0 means
// to the end of src), as FICLONERANGE; it returns dst's attributes
// after it. Servers and file systems without reflinks answer
// NFS4ERR_NOTSUPP (EOPNOTSUPP).
func (c *Client) Clone(ctx context.Context, cred oncrpc.Credential, src []byte, srcSID StateID, dst []byte, dstSID StateID, srcOff, dstOff, count uint64) (Attr, error) {
	if err := c.need42("CLONE"); err != nil {
		return Attr{}, err
	}
	var a Attr
	err := c.do(ctx, cred, func(cp *compound) {
		cp.putFH(src)
		cp.saveFH()
		cp.putFH(dst)
		cp.add(&cloneOp{args: clone4args{srcStateid: c.sid(cp, srcSID), dstStateid: c.sid(cp, dstSID),
			srcOffset: srcOff, dstOffset: dstOff, count: count}})
		cp.getAttr(fileAttrs, &a)
	})
	return a, err
}
