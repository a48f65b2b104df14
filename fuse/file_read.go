package fuse

import (
	"context"
	"sync"
	"syscall"
	"time"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/oncrpc"
)

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
	total, err := h.readChunks(ctx, buf, uint64(off), rsize)
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
		n, _ := h.readSeq(ctx, oncrpc.Plain(dest[total:]), uint64(off)+uint64(total))
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

// readChunks fills dest from off with READs of at most rsize bytes, sent
// concurrently when dest needs several (the server's rsize may be far
// below the kernel's 1 MiB FUSE READ). It returns how many bytes at the
// start of dest are valid.
func (h *file) readChunks(ctx context.Context, dest oncrpc.View, off uint64, rsize int) (int, error) {
	c := h.n.fsys.c
	if dest.Len() <= rsize {
		return h.readSeq(ctx, dest, off)
	}
	type result struct {
		n   int
		eof bool
		err error
	}
	nchunks := (dest.Len() + rsize - 1) / rsize
	res := make([]result, nchunks)
	var wg sync.WaitGroup
	for i := range nchunks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lo := i * rsize
			chunk := dest.Slice(lo, min(dest.Len(), lo+rsize))
			n, eof, err := c.Read(ctx, h.cred, h.of.FH, h.of.StateID, off+uint64(lo), chunk)
			res[i] = result{n, eof, err}
		}()
	}
	wg.Wait()
	total := 0
	for i, r := range res {
		if r.err != nil {
			return total, r.err
		}
		total += r.n
		want := min(dest.Len(), (i+1)*rsize) - i*rsize
		if r.eof || r.n == 0 {
			return total, nil
		}
		if r.n < want {
			// A short READ that is not at EOF: read the rest in order.
			n, err := h.readSeq(ctx, dest.Slice(total, dest.Len()), off+uint64(total))
			return total + n, err
		}
	}
	return total, nil
}

// readSeq fills dest with READs one after the other.
func (h *file) readSeq(ctx context.Context, dest oncrpc.View, off uint64) (int, error) {
	c := h.n.fsys.c
	total := 0
	for total < dest.Len() {
		chunk := dest.Slice(total, min(dest.Len(), total+c.RSize()))
		k, eof, err := c.Read(ctx, h.cred, h.of.FH, h.of.StateID, off+uint64(total), chunk)
		if err != nil {
			return total, err
		}
		total += k
		if eof || k == 0 {
			break
		}
	}
	return total, nil
}
