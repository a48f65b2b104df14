package fuse

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// v42Ops are the NFSv4.2 operations the mount uses (RFC 7862 ALLOCATE,
// DEALLOCATE, SEEK, COPY, CLONE; RFC 8276 extended attributes), declared
// here by their one user; *nfsclient.Client provides them, and Serve
// takes them from a Client that has them (NFSClient's). On an
// NFSv4.1 session the mount does as before (fallocate and xattrs:
// EOPNOTSUPP; copy_file_range: the kernel's READ and WRITE;
// SEEK_DATA/SEEK_HOLE: the kernel's own answer, all data up to the size).
type v42Ops interface {
	// MinorVersion is the session's NFSv4 minor version (1 or 2).
	MinorVersion() int
	// Allocate reserves [off, off+length) of the open file (ALLOCATE,
	// RFC 7862 s15.1); a range past the end extends the file. It
	// returns the attributes after it.
	Allocate(ctx context.Context, cred oncrpc.Credential, fh []byte, sid nfsclient.StateID, off, length uint64) (nfsclient.Attr, error)
	// Deallocate punches [off, off+length) out of the file
	// (DEALLOCATE, RFC 7862 s15.4): it reads as zeros, the size stays.
	Deallocate(ctx context.Context, cred oncrpc.Credential, fh []byte, sid nfsclient.StateID, off, length uint64) (nfsclient.Attr, error)
	// Seek finds the first data or hole at or after off (SEEK, RFC
	// 7862 s15.11): eof says there is no data after the offset.
	Seek(ctx context.Context, cred oncrpc.Credential, fh []byte, sid nfsclient.StateID, off uint64, what nfsclient.SeekWhat) (uint64, bool, error)
	// Copy copies count bytes from src at srcOff to dst at dstOff on the
	// server (COPY, RFC 7862 s15.2), going on after the server's short
	// counts and waiting for a copy the server runs in the background,
	// and commits what it copied; the count is short only at the
	// source's end, or when ctx ends (after the first COPY: ctx's error).
	Copy(ctx context.Context, cred oncrpc.Credential, src []byte, srcSID nfsclient.StateID, dst []byte, dstSID nfsclient.StateID, srcOff, dstOff, count uint64) (nfsclient.CopyResult, error)
	// Clone makes [dstOff, dstOff+count) of dst share src's blocks at
	// srcOff (CLONE, RFC 7862 s15.13).
	Clone(ctx context.Context, cred oncrpc.Credential, src []byte, srcSID nfsclient.StateID, dst []byte, dstSID nfsclient.StateID, srcOff, dstOff, count uint64) (nfsclient.Attr, error)
	// GetXattr, SetXattr, ListXattrs and RemoveXattr are RFC 8276's
	// GETXATTR, SETXATTR, LISTXATTRS (all pages) and REMOVEXATTR, on
	// names of the user namespace without "user.".
	GetXattr(ctx context.Context, cred oncrpc.Credential, fh []byte, name string, maxSize int) ([]byte, error)
	SetXattr(ctx context.Context, cred oncrpc.Credential, fh []byte, name string, value []byte, how nfsclient.XattrHow) error
	ListXattrs(ctx context.Context, cred oncrpc.Credential, fh []byte) ([]string, error)
	RemoveXattr(ctx context.Context, cred oncrpc.Credential, fh []byte, name string) error
}

// The client provides the operations.
var _ v42Ops = (*nfsclient.Client)(nil)

// v42State is the mount's NFSv4.2 support: the operations (nil under
// NFSv4.1) and what the server refused with NFS4ERR_NOTSUPP, so that the
// next call does not ask again (Linux clears NFS_CAP_ALLOCATE etc. the
// same way).
type v42State struct {
	ops                                     v42Ops
	noAllocate, noDeallocate, noSeek        atomic.Bool
	noCopy, noClone, noXattr                atomic.Bool
	allocateWorks                           atomic.Bool // an ALLOCATE succeeded
	copies, clones, copyBytes, copyFallback atomic.Uint64
}

// init takes c's NFSv4.2 operations if the session speaks NFSv4.2.
func (s *v42State) init(c v42Ops) {
	if c.MinorVersion() >= 2 {
		s.ops = c
	}
}

// notSupp reports whether err is the server's refusal of an operation it
// does not implement (RFC 8881 s15.1.1.7, NFS4ERR_NOTSUPP), after which
// the mount stops asking.
func notSupp(err error) bool {
	var st nfsclient.Status
	return errors.As(err, &st) && st == nfsclient.ErrNotSupp
}

var (
	_ = (fs.NodeAllocater)((*node)(nil))
	_ = (fs.NodeLseeker)((*node)(nil))
	_ = (fs.NodeCopyFileRanger)((*node)(nil))
)

// fallocStep is one ALLOCATE or DEALLOCATE of a fallocate(2).
type fallocStep struct {
	dealloc     bool
	off, length uint64
}

// fallocPlan turns fallocate(2)'s mode into NFSv4.2 operations. size is
// the file's size, needed only when needSize says so (KEEP_SIZE with an
// allocation: ALLOCATE past the end would extend the file, RFC 7862
// s15.1.3, so the allocation stops at the end, as CIFS's does; space past
// the end stays unreserved).
//
//   - 0: ALLOCATE.
//   - KEEP_SIZE: ALLOCATE of the part inside the file.
//   - PUNCH_HOLE|KEEP_SIZE: DEALLOCATE (Linux's nfs42_fallocate).
//   - ZERO_RANGE[|KEEP_SIZE]: DEALLOCATE (the range reads as zeros,
//     s15.4.3) then ALLOCATE (reserved again, and the size extended
//     unless KEEP_SIZE), as Linux 6.14's nfs42_proc_zero_range does.
//   - anything else (COLLAPSE_RANGE, INSERT_RANGE, UNSHARE_RANGE, PUNCH_HOLE
//     without KEEP_SIZE): EOPNOTSUPP, as the Linux client answers.
func fallocPlan(mode uint32, off, length, size uint64) ([]fallocStep, syscall.Errno) {
	if length == 0 {
		return nil, syscall.EINVAL
	}
	if off > math.MaxInt64 || length > math.MaxInt64-off {
		return nil, syscall.EFBIG
	}
	clip := func(off, length uint64) []fallocStep {
		if off >= size {
			return nil
		}
		return []fallocStep{{off: off, length: min(length, size-off)}}
	}
	switch mode {
	case 0:
		return []fallocStep{{off: off, length: length}}, 0
	case unix.FALLOC_FL_KEEP_SIZE:
		return clip(off, length), 0
	case unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE:
		return []fallocStep{{dealloc: true, off: off, length: length}}, 0
	case unix.FALLOC_FL_ZERO_RANGE:
		return []fallocStep{{dealloc: true, off: off, length: length}, {off: off, length: length}}, 0
	case unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE:
		return append([]fallocStep{{dealloc: true, off: off, length: length}}, clip(off, length)...), 0
	}
	return nil, syscall.EOPNOTSUPP
}

// fallocNeedsSize reports whether fallocPlan needs the file's size.
func fallocNeedsSize(mode uint32) bool {
	return mode&unix.FALLOC_FL_KEEP_SIZE != 0 && mode&unix.FALLOC_FL_PUNCH_HOLE == 0
}

// ioState returns the credential and stateid for I/O on n through fh:
// the open file's, or the caller's and the anonymous stateid (RFC 8881
// s8.2.3) without one.
func (n *node) ioState(ctx context.Context, fh fs.FileHandle) (oncrpc.Credential, nfsclient.StateID) {
	if h, ok := fh.(*file); ok {
		return h.cred, h.of.StateID
	}
	return n.fsys.cred(ctx), nfsclient.StateID{}
}

// Allocate serves fallocate(2) with ALLOCATE and DEALLOCATE (fallocPlan).
// Buffered writes go out first, so that the server's size and data are
// this mount's; the kernel has written back and dropped its cached pages
// of a punched or zeroed range already (fuse_file_fallocate).
func (n *node) Allocate(ctx context.Context, fh fs.FileHandle, off, length uint64, mode uint32) syscall.Errno {
	ctx = uninterrupted(ctx)
	v := &n.fsys.v42
	if v.ops == nil || n.StableAttr().Mode != syscall.S_IFREG {
		return syscall.EOPNOTSUPP
	}
	if _, errno := fallocPlan(mode, off, length, 0); errno != 0 {
		return errno
	}
	if errno := n.flushWriters(ctx); errno != 0 {
		return errno
	}
	cred, sid := n.ioState(ctx, fh)
	var size uint64
	if fallocNeedsSize(mode) {
		a, err := n.fsys.c.GetAttr(ctx, cred, n.handle())
		if err != nil {
			return n.errno("GETATTR", err)
		}
		n.setAttr(&a)
		size = a.Size
	}
	steps, errno := fallocPlan(mode, off, length, size)
	if errno != 0 {
		return errno
	}
	for _, s := range steps {
		// A step the server refused before: refuse before any other
		// step changed the file.
		if s.dealloc && v.noDeallocate.Load() || !s.dealloc && v.noAllocate.Load() {
			return syscall.EOPNOTSUPP
		}
	}
	if len(steps) == 2 && steps[0].dealloc && !v.allocateWorks.Load() {
		// ZERO_RANGE: until ALLOCATE is known to work, it goes first
		// too, so that a server without it refuses before the
		// DEALLOCATE has zeroed anything (ALLOCATE leaves the data).
		steps = append([]fallocStep{steps[1]}, steps...)
	}
	n.mu.Lock()
	modeBefore := n.attr.Mode
	n.mu.Unlock()
	for _, s := range steps {
		op, no, call := "ALLOCATE", &v.noAllocate, v.ops.Allocate
		if s.dealloc {
			op, no, call = "DEALLOCATE", &v.noDeallocate, v.ops.Deallocate
		}
		a, err := call(ctx, cred, n.handle(), sid, s.off, s.length)
		if n.fsys.tr.On(trace.FUSE) {
			n.fsys.trace("%s ino=%d off=%d len=%d mode=%#x err=%v", op, n.StableAttr().Ino, s.off, s.length, mode, err)
		}
		if err != nil {
			if notSupp(err) {
				no.Store(true)
			}
			return n.errno(op, err)
		}
		if !s.dealloc {
			v.allocateWorks.Store(true)
		}
		n.setAttr(&a)
		if a.Mode != modeBefore {
			// The server cleared set-user-ID or set-group-ID, as a
			// local file system's fallocate does for a caller
			// without CAP_FSETID (file_modified; FUSE leaves it to
			// us, FUSE_HANDLE_KILLPRIV_V2): the kernel's cached mode
			// goes, as after such a WRITE (killpriv.go).
			n.NotifyContent(-1, 0)
			modeBefore = a.Mode
		}
	}
	return 0
}

// Lseek serves SEEK_DATA and SEEK_HOLE with SEEK (the kernel answers the
// other whences itself). As Linux's nfs42_proc_llseek: buffered writes
// go out first; the server's NFS4ERR_NXIO (an offset at or past the end)
// is ENXIO, and so is SEEK_DATA that finds no data before the end
// (sr_eof). A server without SEEK gets ENOSYS: the kernel then stops
// asking and answers from the size, all data (fuse_lseek, as Linux's
// client without NFS_CAP_SEEK).
func (n *node) Lseek(ctx context.Context, fh fs.FileHandle, off uint64, whence uint32) (uint64, syscall.Errno) {
	v := &n.fsys.v42
	var what nfsclient.SeekWhat
	switch whence {
	case unix.SEEK_DATA:
		what = nfsclient.SeekData
	case unix.SEEK_HOLE:
		what = nfsclient.SeekHole
	default:
		return 0, syscall.EINVAL
	}
	if v.ops == nil || v.noSeek.Load() {
		return 0, syscall.ENOSYS
	}
	if off > math.MaxInt64 {
		return 0, syscall.ENXIO
	}
	if errno := n.flushWriters(ctx); errno != 0 {
		return 0, errno
	}
	cred, sid := n.ioState(ctx, fh)
	pos, eof, err := v.ops.Seek(ctx, cred, n.handle(), sid, off, what)
	if n.fsys.tr.On(trace.FUSE) {
		n.fsys.trace("SEEK ino=%d off=%d what=%d -> off=%d eof=%v err=%v", n.StableAttr().Ino, off, what, pos, eof, err)
	}
	if err != nil {
		if notSupp(err) {
			v.noSeek.Store(true)
			return 0, syscall.ENOSYS
		}
		return 0, n.errno("SEEK", err)
	}
	if what == nfsclient.SeekData && eof {
		return 0, syscall.ENXIO
	}
	if pos < off || pos > math.MaxInt64 {
		// RFC 7862 s15.11.3: the offset found is at or after sa_offset.
		return 0, syscall.EIO
	}
	return pos, 0
}

// maxCopy bounds one copy_file_range reply (FUSE returns a uint32; the
// kernel asks for at most UINT_MAX & PAGE_MASK).
const maxCopy = math.MaxUint32 &^ 4095

// CopyFileRange serves copy_file_range(2) between two files of this
// mount with COPY (RFC 7862 s15.2), or with CLONE where the server has no
// COPY. The client's Copy goes on after the server's short counts (knfsd
// copies 4 MiB per synchronous COPY) and asks for a large range to be
// copied in the background (s15.2.3, CB_OFFLOAD), so that cp(1)'s one
// call for a whole file is one FUSE request, not one per 4 MiB, each with
// its own write-back flush and COMMIT. A fatal signal to the copying
// process (its FUSE_INTERRUPT: interrupt.go) stops the copy after the
// COPY under way, or cancels the server's background copy
// (OFFLOAD_CANCEL, s15.8).
// Where the server has neither COPY nor CLONE, EOPNOTSUPP makes the
// kernel copy through READ and WRITE itself (fuse_copy_file_range falls
// back to splice, as Linux's nfs4_copy_file_range does).
func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	copyCtx := ctx // ends if the caller is killed
	ctx = uninterrupted(ctx)
	v := &n.fsys.v42
	dst, ok := out.Operations().(*node)
	if !ok {
		return 0, syscall.EXDEV
	}
	if flags != 0 {
		return 0, syscall.EINVAL
	}
	hin, ok1 := fhIn.(*file)
	hout, ok2 := fhOut.(*file)
	if !ok1 || !ok2 {
		return 0, syscall.EBADF
	}
	if v.ops == nil || v.noCopy.Load() && v.noClone.Load() {
		v.copyFallback.Add(1)
		return 0, syscall.EOPNOTSUPP
	}
	if length == 0 {
		return 0, 0
	}
	length = min(length, maxCopy)
	// The server copies what it has: this mount's buffered writes of
	// both files go out first.
	if errno := n.flushWriters(ctx); errno != 0 {
		return 0, errno
	}
	if errno := dst.flushWriters(ctx); errno != 0 {
		return 0, errno
	}
	defer dst.invalidateAttr()
	if !v.noCopy.Load() {
		res, err := v.ops.Copy(copyCtx, hout.cred, hin.of.FH, hin.of.StateID, hout.of.FH, hout.of.StateID, offIn, offOut, length)
		if n.fsys.tr.On(trace.FUSE) {
			n.fsys.trace("COPY ino=%d off=%d -> ino=%d off=%d len=%d -> %+v err=%v", n.StableAttr().Ino, offIn, dst.StableAttr().Ino, offOut, length, res, err)
		}
		switch {
		case err == nil:
			if res.Count > length {
				return 0, syscall.EIO
			}
			v.copies.Add(1)
			v.copyBytes.Add(res.Count)
			return uint32(res.Count), 0
		case notSupp(err):
			v.noCopy.Store(true)
		default:
			if e := n.errno("COPY", err); e != syscall.EOPNOTSUPP && e != syscall.EXDEV {
				return 0, e
			}
			// This copy refused (NFS4ERR_XDEV, OFFLOAD_DENIED,
			// OFFLOAD_NO_REQS): the kernel copies it.
			v.copyFallback.Add(1)
			return 0, syscall.EOPNOTSUPP
		}
	}
	return n.cloneRange(ctx, hin, offIn, dst, hout, offOut, length)
}

// cloneRange copies with CLONE, for a server that has no COPY. CLONE
// takes no short count and refuses a range past the source's end, so
// the count stops there (copy_file_range returns a short count at EOF).
func (n *node) cloneRange(ctx context.Context, hin *file, offIn uint64, dst *node, hout *file, offOut, length uint64) (uint32, syscall.Errno) {
	v := &n.fsys.v42
	if v.noClone.Load() {
		v.copyFallback.Add(1)
		return 0, syscall.EOPNOTSUPP
	}
	a, err := n.fsys.c.GetAttr(ctx, hin.cred, hin.of.FH)
	if err != nil {
		return 0, n.errno("GETATTR", err)
	}
	if offIn >= a.Size {
		return 0, 0
	}
	length = min(length, a.Size-offIn)
	_, err = v.ops.Clone(ctx, hout.cred, hin.of.FH, hin.of.StateID, hout.of.FH, hout.of.StateID, offIn, offOut, length)
	if n.fsys.tr.On(trace.FUSE) {
		n.fsys.trace("CLONE ino=%d off=%d -> ino=%d off=%d len=%d err=%v", n.StableAttr().Ino, offIn, dst.StableAttr().Ino, offOut, length, err)
	}
	if err != nil {
		if notSupp(err) {
			v.noClone.Store(true)
		}
		if e := nfsclient.Errno(err); e == syscall.EOPNOTSUPP || e == syscall.EINVAL || e == syscall.EXDEV {
			// Refused, or not at the file system's block alignment
			// (vfs_clone_file_range's EINVAL): the kernel copies.
			v.copyFallback.Add(1)
			return 0, syscall.EOPNOTSUPP
		}
		return 0, n.errno("CLONE", err)
	}
	v.clones.Add(1)
	v.copyBytes.Add(length)
	return uint32(length), 0
}

// V42Stats counts what the NFSv4.2 operations did on a mount.
type V42Stats struct {
	// Minor is the session's NFSv4 minor version as the mount sees it:
	// 2 when the client offers NFSv4.2's operations, else 1.
	Minor uint32
	// Copies and Clones count copy_file_range requests served by COPY
	// and by CLONE, CopyBytes the bytes they copied; CopyFallbacks those
	// left to the kernel (EOPNOTSUPP: it copies with READ and WRITE).
	Copies, Clones, CopyBytes, CopyFallbacks uint64
	// Refused lists the operations the server answered NFS4ERR_NOTSUPP,
	// which the mount no longer sends.
	Refused []string
}

// V42Stats returns the mount's NFSv4.2 counters.
func (f *FS) V42Stats() V42Stats {
	v := &f.v42
	s := V42Stats{
		Minor:         1,
		Copies:        v.copies.Load(),
		Clones:        v.clones.Load(),
		CopyBytes:     v.copyBytes.Load(),
		CopyFallbacks: v.copyFallback.Load(),
	}
	if v.ops != nil {
		s.Minor = 2
	}
	for _, r := range []struct {
		name string
		no   *atomic.Bool
	}{
		{"ALLOCATE", &v.noAllocate}, {"DEALLOCATE", &v.noDeallocate}, {"SEEK", &v.noSeek},
		{"COPY", &v.noCopy}, {"CLONE", &v.noClone}, {"XATTR", &v.noXattr},
	} {
		if r.no.Load() {
			s.Refused = append(s.Refused, r.name)
		}
	}
	return s
}
