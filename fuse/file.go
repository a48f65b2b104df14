package fuse

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// writesInFlight bounds the UNSTABLE WRITEs one open file keeps in flight.
const writesInFlight = 8

// file is an open regular file: NFSv4.1 OPEN state (one open-owner per
// FUSE open, so closing one never drops another's share reservation) and
// a write buffer that coalesces sequential writes into wsize UNSTABLE
// WRITEs, committed on flush (close) and fsync, and in the background
// every Options.CommitEvery bytes.
type file struct {
	n      *node
	of     *nfsclient.OpenFile
	cred   oncrpc.Credential // the opener's: I/O and CLOSE use it
	access uint32

	mu     sync.Mutex
	w      UnstableWriter
	wb     writeBuffer // coalesced writes not yet handed to w
	bufOff uint64
	dirty  bool  // written since the last COMMIT
	sent   bool  // UNSTABLE WRITEs went out since the last COMMIT
	werr   error // first write error, reported by flush and fsync
	// werrShown: flush or fsync returned werr to the application, so a
	// release does not report it again.
	werrShown bool
	released  bool
	// post is the file's attributes returned by the last WRITE of
	// writeStable, nil after any other write.
	post *nfsclient.Attr
	// end is the end of the data written through this open file.
	end uint64
}

var (
	_ = (fs.FileReader)((*file)(nil))
	_ = (fs.FileWriter)((*file)(nil))
	_ = (fs.FileFlusher)((*file)(nil))
	_ = (fs.FileFsyncer)((*file)(nil))
	_ = (fs.FileReleaser)((*file)(nil))
)

func shareAccess(flags uint32) uint32 {
	switch flags & syscall.O_ACCMODE {
	case syscall.O_WRONLY:
		return nfsclient.ShareAccessWrite
	case syscall.O_RDWR:
		return nfsclient.ShareAccessBoth
	}
	return nfsclient.ShareAccessRead
}

func (f *FS) newFile(n *node, of *nfsclient.OpenFile, cred oncrpc.Credential, access uint32) *file {
	h := &file{n: n, of: of, cred: cred, access: access}
	f.addFile(h)
	return h
}

// openFlags decides whether the kernel may keep its page cache: only if
// the change attribute is what it was when the cache was last known good
// (close-to-open consistency, RFC 8881 s10.3.1).
func (n *node) openFlags(change uint64, flags uint32) uint32 {
	n.trackDelegation()
	n.mu.Lock()
	keep := n.cacheValid && n.openChange == change
	n.openChange, n.cacheValid = change, true
	n.mu.Unlock()
	var out uint32
	if keep {
		out |= gofuse.FOPEN_KEEP_CACHE
	}
	// O_DIRECT I/O goes straight to the server (FOPEN_DIRECT_IO). The
	// kernel refuses to map such a file (ENODEV) unless the mount has
	// FUSE_DIRECT_IO_ALLOW_MMAP (Linux 6.6); before that, the file is
	// opened without it: the kernel then does O_DIRECT I/O itself
	// (fuse_direct_IO), bypassing its page cache all the same, and the
	// file can be mapped.
	if flags&syscall.O_DIRECT != 0 && n.fsys.directIOMmap {
		out |= gofuse.FOPEN_DIRECT_IO
	}
	return out
}

// Open sends OPEN with CLAIM_FH; its GETATTR is the close-to-open check.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	ctx = uninterrupted(ctx)
	if n.StableAttr().Mode != syscall.S_IFREG {
		return nil, 0, syscall.EINVAL
	}
	n.fsys.Stats.Opens.Add(1)
	cred := n.fsys.cred(ctx)
	access := shareAccess(flags)
	// Until the file is on f.files, the OPEN counts as open for silly
	// rename (silly.go beginOpen).
	ino := n.StableAttr().Ino
	n.fsys.beginOpen(ino)
	opened := false
	defer func() { n.fsys.endOpen(ctx, ino, opened) }()
	of, err := n.fsys.c.OpenFH(ctx, cred, n.handle(), access, nfsclient.ShareDenyNone)
	if err != nil {
		// NFS4ERR_STALE: the file is gone (a REMOVE landed after the
		// kernel's LOOKUP). ESTALE has the kernel walk the path again
		// with LOOKUP_REVAL (fs/namei.c do_filp_open), which finds the
		// name gone (ENOENT, as the Linux client's open by name
		// answers), or the file now there, which it opens.
		return nil, 0, n.errno("OPEN", err)
	}
	if flags&syscall.O_TRUNC != 0 && access != nfsclient.ShareAccessRead && of.Attr.Size != 0 {
		if errno := n.truncate(ctx, cred, of); errno != 0 {
			n.fsys.c.CloseFile(ctx, cred, of)
			return nil, 0, errno
		}
	}
	n.setAttr(&of.Attr)
	h := n.fsys.newFile(n, of, cred, access)
	opened = true
	fl := n.openFlags(of.Attr.Change, flags)
	if fl&gofuse.FOPEN_KEEP_CACHE == 0 {
		// The file changed on the server since the kernel cached it:
		// besides its pages (dropped for an open without KEEP_CACHE),
		// its cached size and times are stale too.
		n.NotifyContent(-1, 0)
	}
	h.traceOpen("OPEN", flags, fl)
	return h, fl, 0
}

// truncate empties an open file with SETATTR(size=0) under its stateid.
func (n *node) truncate(ctx context.Context, cred oncrpc.Credential, of *nfsclient.OpenFile) syscall.Errno {
	zero := uint64(0)
	a, err := n.fsys.c.SetAttr(ctx, cred, of.FH, of.StateID, &nfsclient.SetAttr{Size: &zero})
	if err != nil {
		return n.errno("SETATTR", err)
	}
	of.Attr = a
	return 0
}

// Create sends OPEN with OPEN4_CREATE: GUARDED4 for O_EXCL, UNCHECKED4
// otherwise (RFC 8881 s18.16.3). GUARDED4 is safe against retransmission
// here: the session's reply cache gives exactly-once execution (RFC 8881
// s2.10.6), so EXCLUSIVE4_1's verifier is not needed.
func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *gofuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if errno := n.fsys.checkName(name); errno != 0 {
		return nil, nil, 0, errno
	}
	ctx = uninterrupted(ctx)
	n.fsys.Stats.Creates.Add(1)
	cred := n.fsys.cred(ctx)
	access := shareAccess(flags)
	how := nfsclient.Unchecked
	if flags&syscall.O_EXCL != 0 {
		how = nfsclient.Guarded
	}
	ch := n.beginChange()
	defer n.endChange()
	of, err := n.fsys.c.Open(ctx, cred, n.handle(), name, nfsclient.OpenArgs{
		Access: access, Deny: nfsclient.ShareDenyNone, Create: how, Attr: sattrFromMode(mode)})
	if err != nil {
		return nil, nil, 0, n.errno("OPEN", err)
	}
	n.dirChanged(&of.Dir, ch)
	if flags&syscall.O_TRUNC != 0 && !of.Created && of.Attr.Size != 0 && access != nfsclient.ShareAccessRead {
		if errno := n.truncate(ctx, cred, of); errno != 0 {
			n.fsys.c.CloseFile(ctx, cred, of)
			return nil, nil, 0, errno
		}
	}
	ino := n.fsys.child(ctx, n, name, of.FH, &of.Attr, out)
	cn := ino.Operations().(*node)
	h := n.fsys.newFile(cn, of, cred, access)
	fl := cn.openFlags(of.Attr.Change, flags)
	h.traceOpen("CREATE "+name, flags, fl)
	return ino, h, fl, 0
}

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

// Flush runs at every close(2): the data must be on stable storage and
// the attributes fresh before close returns (close-to-open).
func (h *file) Flush(ctx context.Context) syscall.Errno {
	owner, hasOwner := h.n.fsys.flushOwner(ctx)
	req := ctx // the FLUSH request's, which the hooks know
	ctx = uninterrupted(ctx)
	h.n.fsys.Stats.Flushes.Add(1)
	h.mu.Lock()
	wasDirty := h.dirty
	h.post = nil
	err := h.syncLocked(ctx)
	post := h.post
	h.werrShown = h.werrShown || err != nil && err == h.werr
	h.mu.Unlock()
	if err != nil {
		return h.n.errno("flush", err)
	}
	if hasOwner {
		if errno := h.flushLocks(ctx, owner); errno != 0 {
			return errno
		}
	}
	if h.holdsLocks() {
		// OFD or flock locks, or another process's POSIX locks: they
		// go at RELEASE, if this was the last close (rawhooks.go).
		h.n.fsys.setFlushHolding(req)
	}
	if wasDirty {
		// Our own writes changed the change attribute: remember the
		// new value so the next open keeps the page cache. A flush
		// done by one FILE_SYNC WRITE brought the attributes along.
		a, err := nfsclient.Attr{}, error(nil)
		if post != nil {
			a = *post
		} else {
			a, err = h.n.fsys.c.GetAttr(ctx, h.cred, h.of.FH)
		}
		if err == nil {
			h.n.setAttr(&a)
			h.n.mu.Lock()
			h.n.openChange = a.Change
			h.n.mu.Unlock()
		}
	}
	return 0
}

// Fsync writes out and COMMITs.
func (h *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	ctx = uninterrupted(ctx)
	h.n.fsys.Stats.Fsyncs.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.syncLocked(ctx); err != nil {
		h.werrShown = h.werrShown || err == h.werr
		return h.n.errno("fsync", err)
	}
	return 0
}

// Release CLOSEs the open state after the last close of the file.
func (h *file) Release(ctx context.Context) syscall.Errno {
	ctx = uninterrupted(ctx)
	return h.release(ctx)
}

func (h *file) release(ctx context.Context) syscall.Errno {
	h.mu.Lock()
	if h.released {
		h.mu.Unlock()
		return 0
	}
	h.released = true
	h.n.fsys.startClose(h)
	defer h.n.fsys.doneClose()
	err := h.syncLocked(ctx)
	if err != nil && err == h.werr && h.werrShown {
		// Writes fail once werr is set, so nothing was buffered
		// since the application was told at close(2) or fsync(2).
		err = nil
	}
	h.n.removeWriter(h)
	if rel := h.wb.release(); rel != nil {
		rel() // data that could not be written (the error is err)
	}
	h.wb = writeBuffer{}
	if h.w != nil {
		h.w.Discard() // unstable data left after an error
	}
	h.mu.Unlock()
	h.releaseLocks(ctx)
	cerr := h.n.fsys.c.CloseFile(ctx, h.cred, h.of)
	h.n.fsys.lastClose(ctx, h.n.StableAttr().Ino) // silly.go
	if h.n.fsys.tr.On(trace.FUSE) {
		h.n.fsys.trace("RELEASE ino=%d stateid=%d:%x close=%v", h.n.StableAttr().Ino, h.of.StateID.Seq, h.of.StateID.Other, cerr)
	}
	if err != nil {
		return h.n.errno("release", err)
	}
	if cerr != nil {
		return h.n.errno("CLOSE", cerr)
	}
	return 0
}

func (n *node) addWriter(h *file) {
	f, ino := n.fsys, n.StableAttr().Ino
	f.mu.Lock()
	if f.writers[ino] == nil {
		f.writers[ino] = make(map[*file]struct{})
	}
	f.writers[ino][h] = struct{}{}
	f.mu.Unlock()
}

func (n *node) removeWriter(h *file) {
	f, ino := n.fsys, n.StableAttr().Ino
	f.mu.Lock()
	delete(f.writers[ino], h)
	if len(f.writers[ino]) == 0 {
		delete(f.writers, ino)
	}
	f.mu.Unlock()
}

// flushWriters sends what open files of n buffer, so that a READ or
// GETATTR sees every byte written through this mount.
func (n *node) flushWriters(ctx context.Context) syscall.Errno {
	_, errno := n.flushWritersAttr(ctx)
	return errno
}

// flushWritersAttr is flushWriters, and returns the file's attributes
// when the flush was one FILE_SYNC WRITE of the only open file with
// buffered writes, whose COMPOUND brought them: nothing else of this
// mount can have written since.
func (n *node) flushWritersAttr(ctx context.Context) (*nfsclient.Attr, syscall.Errno) {
	f, ino := n.fsys, n.StableAttr().Ino
	f.mu.Lock()
	ws := f.writers[ino]
	if len(ws) == 0 {
		f.mu.Unlock()
		return nil, 0
	}
	hs := make([]*file, 0, len(ws))
	for h := range ws {
		hs = append(hs, h)
	}
	f.mu.Unlock()
	var post *nfsclient.Attr
	for _, h := range hs {
		h.mu.Lock()
		err := h.writeOutLocked()
		post = h.post
		h.mu.Unlock()
		if err != nil {
			return nil, n.errno("write", err)
		}
	}
	if len(hs) != 1 {
		post = nil
	}
	return post, 0
}

func (h *file) traceOpen(op string, flags, fuseFlags uint32) {
	if !h.n.fsys.tr.On(trace.FUSE) {
		return
	}
	h.n.fsys.trace("%s ino=%d flags=%#o share_access=%d stateid=%d:%x keep_cache=%v", op, h.n.StableAttr().Ino,
		flags, h.access, h.of.StateID.Seq, h.of.StateID.Other, fuseFlags&gofuse.FOPEN_KEEP_CACHE != 0)
}
