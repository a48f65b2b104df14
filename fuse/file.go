package fuse

import (
	"context"
	"sync"
	"syscall"

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
