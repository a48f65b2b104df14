package nfsclient

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
// see the README's table.

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
	Async     bool   // the server ran the copy in the background
}

// Copy copies count bytes at srcOff of the file src (open with srcSID)
// to dstOff of dst (open with dstSID) inside the server (COPY, RFC 7862
// s15.2; intra-server, no data crosses the network), as
// copy_file_range(2). It asks for a synchronous copy; a server that
// insists on copying in the background is waited for (CB_OFFLOAD, or
// OFFLOAD_STATUS polls when no callback comes). Copied data not yet
// stable is committed before Copy returns. A server that will not copy
// gives an error whose Errno is EOPNOTSUPP (NFS4ERR_NOTSUPP,
// OFFLOAD_DENIED, OFFLOAD_NO_REQS): the caller then reads and writes.
func (c *Client) Copy(ctx context.Context, cred oncrpc.Credential, src []byte, srcSID StateID, dst []byte, dstSID StateID, srcOff, dstOff, count uint64) (CopyResult, error) {
	return c.copy(ctx, cred, src, srcSID, dst, dstSID, srcOff, dstOff, count, true)
}

// copy is Copy; sync false lets the server copy in the background.
func (c *Client) copy(ctx context.Context, cred oncrpc.Credential, src []byte, srcSID StateID, dst []byte, dstSID StateID, srcOff, dstOff, count uint64, sync bool) (CopyResult, error) {
	if err := c.need42("COPY"); err != nil {
		return CopyResult{}, err
	}
	op := &copyOp{}
	err := c.do(ctx, cred, func(cp *compound) {
		op.args = copy4args{srcStateid: c.sid(cp, srcSID), dstStateid: c.sid(cp, dstSID),
			srcOffset: srcOff, dstOffset: dstOff, count: count, consecutive: true, synchronous: sync}
		cp.putFH(src)
		cp.saveFH()
		cp.putFH(dst)
		cp.add(op)
	})
	if err != nil {
		return CopyResult{}, err
	}
	wr := op.res.response
	res := CopyResult{Count: wr.count, Committed: wr.committed}
	verf := Verifier(wr.writeverf)
	if len(wr.callbackId) == 1 {
		// RFC 7862 s15.2.3: an asynchronous copy; its result comes in
		// CB_OFFLOAD, or from OFFLOAD_STATUS.
		res.Async = true
		out, err := c.waitCopy(ctx, cred, dst, wr.callbackId[0])
		if err != nil {
			return res, err
		}
		res.Count, res.Committed, verf = out.count, out.committed, out.verf
	}
	if res.Count > count && count != 0 {
		return res, fmt.Errorf("%w: COPY of %d bytes reports %d copied", ErrProtocol, count, res.Count)
	}
	if res.Committed != FileSync && res.Count > 0 {
		// RFC 7862 s15.2.3: data copied unstable is committed like
		// written data; another verifier means the server lost it.
		v, err := c.Commit(ctx, cred, dst, dstOff, uint32(min(res.Count, 1<<32-1)))
		if err != nil {
			return res, fmt.Errorf("COMMIT after COPY: %w", err)
		}
		if res.Async || v == verf {
			res.Committed = FileSync
		} else {
			return res, fmt.Errorf("COPY: %w: write verifier changed before COMMIT", ErrIO)
		}
	}
	return res, nil
}

// copyOut is the outcome of an asynchronous COPY.
type copyOut struct {
	count     uint64
	committed Stable
	verf      Verifier
	err       error
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

// waitCopy waits for the asynchronous copy sid into dst to end: for its
// CB_OFFLOAD, asking OFFLOAD_STATUS (RFC 7862 s15.9) now and then in
// case no callback comes. If ctx ends first, the copy is cancelled
// (OFFLOAD_CANCEL, s15.8).
func (c *Client) waitCopy(ctx context.Context, cred oncrpc.Credential, dst []byte, sid StateID) (copyOut, error) {
	ch := c.copies.wait(sid)
	defer c.copies.forget(sid)
	delay := 50 * time.Millisecond
	for {
		t := time.NewTimer(delay)
		select {
		case out := <-ch:
			t.Stop()
			c.trace("COPY %x: CB_OFFLOAD: %d bytes, %v", sid.Other, out.count, out.err)
			return out, out.err
		case <-ctx.Done():
			t.Stop()
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			c.do(cctx, cred, func(cp *compound) {
				cp.putFH(dst)
				cp.add(&offloadCancelOp{args: offloadCancel4args{stateid: sid}})
			})
			cancel()
			return copyOut{}, ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, time.Second)
		st := &offloadStatusOp{args: offloadStatus4args{stateid: sid}}
		err := c.do(ctx, cred, func(cp *compound) {
			cp.putFH(dst)
			cp.add(st)
		})
		c.trace("COPY %x: OFFLOAD_STATUS: %+v, %v", sid.Other, st.res, err)
		if errors.Is(err, ErrBadStateID) || errors.Is(err, ErrNotSupp) {
			// The copy is over and forgotten, or the server only
			// reports by callback: wait for CB_OFFLOAD.
			delay = time.Second
			continue
		}
		if err != nil {
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
