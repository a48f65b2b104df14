package fuse

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// Writing an open file: the write-back buffer sent as UNSTABLE WRITEs
// while the application keeps writing, then COMMITted at flush or fsync;
// a write that starts past the end of the file is sent through at once,
// so that an error of its own (EFBIG) is its own.

// Write buffers data; sequential writes are coalesced into wsize
// UNSTABLE WRITEs that go out while the application keeps writing.
// Errors surface at the next write, flush or fsync, as on an NFS mount.
func (h *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	defer h.killPrivAfterWrite(ctx)
	f := h.n.fsys
	f.Stats.Writes.Add(1)
	f.Stats.WriteBytes.Add(uint64(len(data)))
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.werr != nil {
		return 0, nfsclient.Errno(h.werr)
	}
	if limit := f.c.MaxFileSize(); limit > 0 {
		// Nothing beyond the export's maxfilesize: EFBIG, or a short
		// write up to it, as write(2) does at a file size limit.
		if uint64(off) >= limit {
			return 0, syscall.EFBIG
		}
		data = data[:min(uint64(len(data)), limit-uint64(off))]
	}
	if h.pastEOFLocked(uint64(off)) {
		return h.writeThrough(ctx, data, uint64(off))
	}
	h.end = max(h.end, uint64(off)+uint64(len(data)))
	if !h.dirty {
		h.dirty = true
		h.n.addWriter(h)
	}
	if h.w == nil {
		h.w = f.c.NewUnstableWriter(h.cred, h.of, writesInFlight)
		h.w.CommitEvery(f.opts.CommitEvery)
	}
	if len(h.wb.b) > 0 && uint64(off) != h.bufOff+uint64(len(h.wb.b)) {
		h.sendLocked()
	}
	wsize := f.c.WSize()
	rest := data
	pos := uint64(off)
	for len(rest) > 0 {
		if cap(h.wb.b) == 0 {
			// Most files of a tree are much smaller than wsize: a
			// file's first buffer starts at 64 KiB unless the write
			// is larger; later ones are wsize (growing one would
			// copy it).
			size := wsize
			if len(rest) < 64<<10 && pos == 0 && !h.sent {
				size = min(wsize, 64<<10)
			}
			h.wb = h.newWriteBufferLocked(ctx, size)
			h.bufOff = pos
		} else if len(h.wb.b) == cap(h.wb.b) {
			// Grow to wsize (once per buffer).
			bigger := h.newWriteBufferLocked(ctx, wsize)
			bigger.b = append(bigger.b, h.wb.b...)
			f.Stats.BytesCopied.Add(uint64(len(h.wb.b)))
			if rel := h.wb.release(); rel != nil {
				rel()
			}
			h.wb = bigger
		}
		k := min(len(rest), cap(h.wb.b)-len(h.wb.b))
		// The one copy a WRITE makes: from go-fuse's request buffer
		// into the write-back buffer the server reads from.
		h.wb.b = append(h.wb.b, rest[:k]...)
		f.Stats.BytesCopied.Add(uint64(k))
		rest = rest[k:]
		pos += uint64(k)
		if len(h.wb.b) == wsize {
			h.sendLocked()
		}
	}
	if h.werr != nil {
		return 0, nfsclient.Errno(h.werr)
	}
	return uint32(len(data)), 0
}

// pastEOFLocked reports whether a write at off starts past the end of
// the file as this mount knows it: its cached size, and what this open
// file wrote.
func (h *file) pastEOFLocked(off uint64) bool {
	h.n.mu.Lock()
	size := h.n.attr.Size
	h.n.mu.Unlock()
	return off > max(size, h.end, h.bufOff+uint64(len(h.wb.b)))
}

// writeThrough writes data that starts past the end of the file to the
// server before the write returns, FILE_SYNC: a server refuses such a
// write when its file system cannot hold a file that large
// (NFS4ERR_FBIG: the xfstests' seek_sanity_test writes at 2^59 on an
// export whose file system stops at 16 TiB, and says FATTR4_MAXFILESIZE
// 2^63-1), and that error belongs to this write, not to a later write,
// fsync or close of the file. Writes that leave holes are rare; the ones
// that extend a file (at its end) stay buffered.
func (h *file) writeThrough(ctx context.Context, data []byte, off uint64) (uint32, syscall.Errno) {
	ctx = uninterrupted(ctx)
	if err := h.writeStable(ctx, oncrpc.Plain(data), off); err != nil {
		h.post = nil
		return 0, h.n.errno("WRITE", err)
	}
	h.post = nil
	h.end = max(h.end, off+uint64(len(data)))
	return uint32(len(data)), 0
}

// checkFileSize refuses a size beyond the export's FATTR4_MAXFILESIZE
// (RFC 8881 s5.8.2.20) with EFBIG, as truncate(2) does beyond a file
// system's limit.
func (f *FS) checkFileSize(size uint64) syscall.Errno {
	if limit := f.c.MaxFileSize(); limit > 0 && size > limit {
		return syscall.EFBIG
	}
	return 0
}

// sendLocked hands the buffer to the UnstableWriter, which gives it back
// once the data is committed.
func (h *file) sendLocked() {
	if len(h.wb.b) == 0 {
		return
	}
	data, off, release := h.wb.view(), h.bufOff, h.wb.release()
	h.wb = writeBuffer{}
	h.sent = true
	if h.n.fsys.tr.On(trace.FUSE) {
		h.n.fsys.trace("WRITE ino=%d off=%d len=%d (unstable, buffered writes coalesced)", h.n.StableAttr().Ino, off, data.Len())
	}
	if err := h.w.WriteAt(h.n.fsys.bg, data, off, release); err != nil && h.werr == nil {
		h.werr = err
		h.n.fsys.Stats.WriteErrors.Add(1)
	}
}

// writeOutLocked sends the buffer and waits for the WRITEs in flight.
// When the buffer holds all that is dirty, it goes FILE_SYNC and the
// file is clean (no COMMIT needed at close).
//
// The WRITEs run under the file system's context, not the request's:
// buffered data belongs to the file, as in a page cache, so a read or
// getattr interrupted by a signal neither drops it nor leaves the
// interruption behind as the file's write error.
func (h *file) writeOutLocked() error {
	h.post = nil
	if h.w == nil {
		return h.werr
	}
	if !h.sent && len(h.wb.b) > 0 && h.werr == nil {
		data, off, release := h.wb.view(), h.bufOff, h.wb.release()
		h.wb = writeBuffer{}
		err := h.writeStable(h.n.fsys.bg, data, off)
		if release != nil {
			release()
		}
		if err != nil {
			h.werr = err
			return err
		}
		h.dirty = false
		h.n.removeWriter(h)
		return nil
	}
	h.sendLocked()
	if err := h.w.Flush(); err != nil && h.werr == nil {
		h.werr = err
	}
	return h.werr
}

// syncLocked writes out and COMMITs (RFC 8881 s18.3). When all the
// dirty data is in the buffer, one FILE_SYNC WRITE replaces WRITE+COMMIT,
// as the Linux client does for a flush that fits one request.
func (h *file) syncLocked(ctx context.Context) error {
	if err := h.writeOutLocked(); err != nil {
		return err
	}
	if h.w == nil || !h.dirty {
		return nil
	}
	var start time.Time
	if h.n.fsys.tr.On(trace.FUSE) {
		start = time.Now()
	}
	if err := h.w.Commit(ctx); err != nil {
		// An interrupted COMMIT leaves the writes pending for the
		// next one; only a failure of the COMMIT itself sticks.
		if ctx.Err() == nil {
			h.werr = err
		}
		return err
	}
	if h.n.fsys.tr.On(trace.FUSE) {
		h.n.fsys.trace("COMMIT ino=%d time=%v", h.n.StableAttr().Ino, time.Since(start).Round(time.Microsecond))
	}
	h.dirty, h.sent = false, false
	h.n.removeWriter(h)
	return nil
}

// writeStable sends data with FILE_SYNC WRITEs (RFC 8881 s18.32.3), and
// a COMMIT if the server wrote less stably than asked.
func (h *file) writeStable(ctx context.Context, data oncrpc.View, off uint64) error {
	c := h.n.fsys.c
	if h.n.fsys.tr.On(trace.FUSE) {
		h.n.fsys.trace("WRITE ino=%d off=%d len=%d (file_sync, whole flush in one request)", h.n.StableAttr().Ino, off, data.Len())
	}
	needCommit := false
	h.post = nil
	for data.Len() > 0 {
		n := min(data.Len(), c.WSize())
		write := c.Write
		if n == data.Len() {
			// The last WRITE brings the attributes the flush needs
			// (Linux folds GETATTR into every WRITE).
			write = c.WriteGetAttr
		}
		res, err := write(ctx, h.cred, h.of.FH, h.of.StateID, off, data.Slice(0, n), nfsclient.FileSync)
		if err != nil {
			return fmt.Errorf("write at %d: %w", off, err)
		}
		if res.AttrOK {
			h.post = &res.Attr
		}
		if res.Count == 0 {
			return fmt.Errorf("write at %d: server wrote 0 bytes: %w", off, syscall.EIO)
		}
		needCommit = needCommit || res.Committed != nfsclient.FileSync
		data = data.Slice(int(res.Count), data.Len())
		off += uint64(res.Count)
	}
	if needCommit {
		if _, err := c.Commit(ctx, h.cred, h.of.FH, 0, 0); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
	}
	return nil
}
