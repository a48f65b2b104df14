package fuse

import (
	"context"
	"syscall"
	"time"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// Attributes are the calls on an object's attributes: GETATTR, SETATTR
// (with the stateid of an open file for a size change, RFC 8881
// s18.30), ACCESS, and the file system's attributes that statfs(2)
// shows.
type Attributes interface {
	GetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte) (nfsclient.Attr, error)
	SetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte, sid nfsclient.StateID, sa *nfsclient.SetAttr) (nfsclient.Attr, error)
	Access(ctx context.Context, cred oncrpc.Credential, fh []byte, mask uint32) (granted uint32, err error)
	StatFS(ctx context.Context, cred oncrpc.Credential, fh []byte) (nfsclient.Attr, error)
}

// typeBits returns the S_IFMT bits of an NFS file type (RFC 8881 s5.8.1.2).
func typeBits(t nfsclient.FileType) uint32 {
	switch t {
	case nfsclient.TypeDir:
		return syscall.S_IFDIR
	case nfsclient.TypeLnk:
		return syscall.S_IFLNK
	case nfsclient.TypeBlk:
		return syscall.S_IFBLK
	case nfsclient.TypeChr:
		return syscall.S_IFCHR
	case nfsclient.TypeSock:
		return syscall.S_IFSOCK
	case nfsclient.TypeFifo:
		return syscall.S_IFIFO
	}
	return syscall.S_IFREG
}

// fillAttr converts NFS attributes into a FUSE attribute block.
func (f *FS) fillAttr(a *nfsclient.Attr, out *gofuse.Attr) {
	out.Ino = f.ino(a.FileID)
	out.Size = a.Size
	out.Blocks = (a.SpaceUsed + 511) / 512
	out.Mode = typeBits(a.Type) | a.Mode&07777
	out.Nlink = a.NLink
	out.Uid = a.UID
	out.Gid = a.GID
	out.Rdev = uint32(unix.Mkdev(a.RdevMajor, a.RdevMinor))
	// A large st_blksize makes cp, tar and friends use wsize buffers.
	out.Blksize = uint32(f.c.WSize())
	setTime := func(t time.Time, sec *uint64, nsec *uint32) {
		if t.IsZero() {
			return
		}
		*sec = uint64(t.Unix())
		*nsec = uint32(t.Nanosecond())
	}
	setTime(a.Atime, &out.Atime, &out.Atimensec)
	setTime(a.Mtime, &out.Mtime, &out.Mtimensec)
	setTime(a.Ctime, &out.Ctime, &out.Ctimensec)
}

// acBounds returns the attribute cache timeouts for a file type.
func (f *FS) acBounds(t nfsclient.FileType) (lo, hi time.Duration) {
	if t == nfsclient.TypeDir {
		return f.opts.AcDirMin, f.opts.AcDirMax
	}
	return f.opts.AcRegMin, f.opts.AcRegMax
}

// setAttr records fresh attributes of n. Like the Linux client
// (nfs_update_inode), the cache timeout starts at the min and doubles up
// to the max while the change attribute stays the same; a new change
// attribute resets it (RFC 8881 s5.8.1.4: change tells a client its
// cached data and attributes are stale).
func (n *node) setAttr(a *nfsclient.Attr) {
	lo, hi := n.fsys.acBounds(a.Type)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.attrSet && a.Change == n.attr.Change {
		n.acTimeout = min(max(2*n.acTimeout, lo), hi)
	} else {
		n.acTimeout = lo
	}
	n.attr = *a
	n.attr.FileHandle = nil
	n.attrSet = true
	n.attrTime = time.Now()
	n.postOp = false
}

// attrOut fills a GETATTR/SETATTR reply from the cached attributes.
func (n *node) attrOut(out *gofuse.AttrOut) {
	out.SetTimeout(n.fillAttr(&out.Attr))
}

// entryOut fills a LOOKUP-style reply for child n of a directory.
func (n *node) entryOut(out *gofuse.EntryOut) {
	out.SetAttrTimeout(n.fillAttr(&out.Attr))
	// A name stays valid as long as its directory's attributes would.
	out.SetEntryTimeout(n.fsys.opts.AcDirMin)
}

// fillAttr fills out from the cached attributes and returns how long the
// kernel may keep them: the attribute cache timeout, or longer for a
// delegated regular file, whose changes the server would recall first.
func (n *node) fillAttr(out *gofuse.Attr) time.Duration {
	n.mu.Lock()
	a, t := n.attr, n.acTimeout
	n.mu.Unlock()
	if a.Type == nfsclient.TypeReg && n.delegated() {
		t = delegAttrTimeout
	}
	n.fsys.fillAttr(&a, out)
	n.fsys.hideSillyLinks(out)
	return t
}

// sattrFromMode returns a SetAttr carrying the permission bits of mode.
func sattrFromMode(mode uint32) *nfsclient.SetAttr {
	m := mode & 07777
	return &nfsclient.SetAttr{Mode: &m}
}
