package fuse

import (
	"context"
	"syscall"
	"time"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// readsInFlight bounds the READs one read request keeps in flight.
const readsInFlight = 16

// Reading an open file: READs of rsize sent concurrently into the
// kernel's buffer (or a lent registered one), or the data left in the
// transport's receive buffer handed to the kernel in place.

// Read sends READs. With a transport buffer pool (RDMA), data too large
// to come inline lands in pool memory by RDMA Write and goes to the
// kernel from there, with no copy in user space; data that came inline
// is copied once, from the receive buffer into the pool memory (RFC 8166
// s3.4.6: the requester decides on a Write chunk; rpcrdma offers one
// only when the reply would not fit inline). Without a pool, a READ of
// at most rsize goes to the kernel from the reply's buffer (readInPlace),
// a larger one is copied once from the replies into the kernel's buffer.
func (h *file) Read(ctx context.Context, dest []byte, off int64) (gofuse.ReadResult, syscall.Errno) {
	if errno := h.n.flushWriters(ctx); errno != 0 {
		return nil, errno
	}
	rsize := h.n.fsys.c.RSize()
	var start time.Time
	if h.n.fsys.tr.On(trace.FUSE) {
		start = time.Now()
	}
	buf := oncrpc.Plain(dest)
	var mem Buffer
	if pool := h.n.fsys.opts.Buffers; pool != nil {
		if m, err := pool.Alloc(len(dest)); err == nil {
			buf, mem = oncrpc.Lent(m), m
		}
	}
	if mem == nil && len(dest) <= rsize {
		return h.readInPlace(ctx, dest, off, start)
	}
	total, err := h.readRange(ctx, buf, uint64(off), rsize)
	if err != nil && total == 0 {
		if mem != nil {
			_ = mem.Release()
		}
		return nil, h.n.errno("READ", err)
	}
	h.n.fsys.Stats.Reads.Add(1)
	h.n.fsys.Stats.ReadBytes.Add(uint64(total))
	if h.n.fsys.tr.On(trace.FUSE) {
		h.n.fsys.trace("READ ino=%d off=%d len=%d got=%d time=%v", h.n.StableAttr().Ino, off, len(dest), total, time.Since(start).Round(time.Microsecond))
	}
	if mem != nil {
		return &slabResult{buf: mem, data: buf.Bytes()[:total]}, 0
	}
	return gofuse.ReadResultData(dest[:total]), 0
}

// readInPlace answers a READ of at most rsize from where the reply's data
// arrived, without copying it into dest first; go-fuse writes it to the
// kernel from there. A short READ that is not at EOF is finished in
// dest, by copying.
func (h *file) readInPlace(ctx context.Context, dest []byte, off int64, start time.Time) (gofuse.ReadResult, syscall.Errno) {
	c := h.n.fsys.c
	data, release, eof, err := c.ReadInPlace(ctx, h.cred, h.of.FH, h.of.StateID, uint64(off), dest)
	if err != nil {
		return nil, h.n.errno("READ", err)
	}
	var res gofuse.ReadResult = &replyResult{data: data, release: release}
	total := len(data)
	if total < len(dest) && total > 0 && !eof {
		copy(dest, data)
		if release != nil {
			release()
		}
		// An error here leaves a short answer; the next READ reports it.
		n, _ := h.readRange(ctx, oncrpc.Plain(dest[total:]), uint64(off)+uint64(total), c.RSize())
		total += n
		res = gofuse.ReadResultData(dest[:total])
	}
	h.n.fsys.Stats.Reads.Add(1)
	h.n.fsys.Stats.ReadBytes.Add(uint64(total))
	if h.n.fsys.tr.On(trace.FUSE) {
		h.n.fsys.trace("READ ino=%d off=%d len=%d got=%d time=%v (in place)", h.n.StableAttr().Ino, off, len(dest), total, time.Since(start).Round(time.Microsecond))
	}
	return res, 0
}

// readRange fills dest from off with READs of at most rsize bytes, up
// to readsInFlight at once when dest needs several (the server's rsize
// may be far below the kernel's max_read): nfsclient.ReadRange, which the
// library's reads share.
func (h *file) readRange(ctx context.Context, dest oncrpc.View, off uint64, rsize int) (int, error) {
	c := h.n.fsys.c
	read := func(ctx context.Context, off uint64, dest oncrpc.View) (int, bool, error) {
		return c.Read(ctx, h.cred, h.of.FH, h.of.StateID, off, dest)
	}
	return nfsclient.ReadRange(ctx, read, dest, off, rsize, readsInFlight)
}
