package fuse

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// Namespace are the calls on names: LOOKUP and LOOKUPP (export.go's
// parent of a directory), READLINK, the creation of objects other than
// regular files (those come with OPEN: FileData), LINK, REMOVE and
// RENAME. The changes return the directories' change_info and
// attributes (dircache.go).
type Namespace interface {
	Lookup(ctx context.Context, cred oncrpc.Credential, dir []byte, name string) ([]byte, nfsclient.Attr, error)
	LookupParent(ctx context.Context, cred oncrpc.Credential, dir []byte) ([]byte, nfsclient.Attr, error)
	Readlink(ctx context.Context, cred oncrpc.Credential, fh []byte) (string, error)
	Mkdir(ctx context.Context, cred oncrpc.Credential, dir []byte, name string, sa *nfsclient.SetAttr) (nfsclient.Made, error)
	Mknod(ctx context.Context, cred oncrpc.Credential, dir []byte, name string, typ nfsclient.FileType, major, minor uint32, sa *nfsclient.SetAttr) (nfsclient.Made, error)
	Symlink(ctx context.Context, cred oncrpc.Credential, dir []byte, name, target string, sa *nfsclient.SetAttr) (nfsclient.Made, error)
	Link(ctx context.Context, cred oncrpc.Credential, fh, dir []byte, name string) (nfsclient.Attr, nfsclient.DirChange, error)
	Remove(ctx context.Context, cred oncrpc.Credential, dir []byte, name string) (nfsclient.DirChange, error)
	Rename(ctx context.Context, cred oncrpc.Credential, srcDir []byte, srcName string, dstDir []byte, dstName string) (src, dst nfsclient.DirChange, err error)
}

// node is one file, directory or other object of the export. Its inode
// number is the NFS fileid; it keeps the file handle and the attributes
// last seen.
type node struct {
	fs.Inode
	fsys *FS
	fh   []byte

	mu       sync.Mutex
	attr     nfsclient.Attr
	attrSet  bool
	attrTime time.Time // when attr was read from the server
	// postOp says attr came back from this client's last change of the
	// object, with nothing else setting attributes since (dircache.go).
	postOp    bool
	acTimeout time.Duration
	// changing and changeSeq tell whether the COMPOUNDs that change
	// the object (or the directory) overlapped (dircache.go).
	changing  int
	changeSeq uint64
	// openChange is the change attribute when the kernel's page cache
	// was last known to match the server (close-to-open, RFC 8881
	// s10.3.1 as the Linux client does it).
	openChange uint64
	cacheValid bool
}

var (
	_ = (fs.NodeLookuper)((*node)(nil))
	_ = (fs.NodeGetattrer)((*node)(nil))
	_ = (fs.NodeSetattrer)((*node)(nil))
	_ = (fs.NodeAccesser)((*node)(nil))
	_ = (fs.NodeStatfser)((*node)(nil))
	_ = (fs.NodeReadlinker)((*node)(nil))
	_ = (fs.NodeMkdirer)((*node)(nil))
	_ = (fs.NodeMknoder)((*node)(nil))
	_ = (fs.NodeSymlinker)((*node)(nil))
	_ = (fs.NodeLinker)((*node)(nil))
	_ = (fs.NodeUnlinker)((*node)(nil))
	_ = (fs.NodeRmdirer)((*node)(nil))
	_ = (fs.NodeRenamer)((*node)(nil))
	_ = (fs.NodeCreater)((*node)(nil))
	_ = (fs.NodeOpener)((*node)(nil))
	_ = (fs.NodeOpendirHandler)((*node)(nil))
)

func (f *FS) newNode(fh []byte, a *nfsclient.Attr) *node {
	n := &node{fsys: f, fh: append([]byte(nil), fh...)}
	n.setAttr(a)
	f.handles.put(f.ino(a.FileID), fh)
	return n
}

// child returns the inode for name, an object found in directory parent,
// and fills out. An inode the kernel already has under that name is
// reused with fresh attributes; otherwise a new one is made, which
// go-fuse merges with any inode of the same fileid (a hard link, or a
// racing lookup).
func (f *FS) child(ctx context.Context, parent *node, name string, fh []byte, a *nfsclient.Attr, out *gofuse.EntryOut) *fs.Inode {
	id := f.stableAttr(fh, a)
	if old := parent.GetChild(name); old != nil && old.StableAttr() == id {
		if n, ok := old.Operations().(*node); ok {
			n.setAttr(a)
			if len(fh) > 0 {
				n.mu.Lock()
				n.fh = append(n.fh[:0:0], fh...)
				n.mu.Unlock()
			}
			n.entryOut(out)
			return old
		}
	}
	n := f.newNode(fh, a)
	n.entryOut(out)
	return parent.NewInode(ctx, n, id)
}

func (n *node) handle() []byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.fh
}

// uninterrupted detaches ctx from FUSE interrupts (a request's context
// ends when the kernel interrupted it and its caller is dying, or, for a
// blocking lock wait, at any signal: interrupt.go). Operations that
// change state on the server run to completion even then: an OPEN
// abandoned half-way would leave open state nobody closes, a cancelled
// COMMIT would poison the file's write error.
func uninterrupted(ctx context.Context) context.Context {
	return context.WithoutCancel(ctx)
}

// errno maps err for the kernel: nfsclient.Errno for NFS and transport
// errors, EINTR for a call whose context ended (its caller is dying:
// interrupt.go).
func (n *node) errno(op string, err error) syscall.Errno {
	e := nfsclient.Errno(err)
	if errors.Is(err, context.Canceled) {
		e = syscall.EINTR
	}
	n.fsys.Stats.noteErrno(op, err, e)
	if n.fsys.tr.On(trace.FUSE) {
		n.fsys.trace("%s ino=%d err=%v errno=%d", op, n.StableAttr().Ino, err, e)
	}
	return e
}

// Lookup finds name with LOOKUP+GETFH+GETATTR.
func (n *node) Lookup(ctx context.Context, name string, out *gofuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.fsys.checkName(name); errno != 0 {
		return nil, errno
	}
	n.fsys.Stats.Lookups.Add(1)
	fh, a, err := n.fsys.c.Lookup(ctx, n.fsys.cred(ctx), n.handle(), name)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return nil, syscall.EINTR
		}
		e := nfsclient.Errno(err)
		n.fsys.Stats.noteErrno("LOOKUP", err, e)
		return nil, e
	}
	if n.fsys.tr.On(trace.FUSE) {
		n.fsys.trace("LOOKUP dir=%d name=%q -> ino=%d type=%d size=%d", n.StableAttr().Ino, name, a.FileID, a.Type, a.Size)
	}
	return n.fsys.child(ctx, n, name, fh, &a, out), 0
}

// Getattr sends GETATTR: the kernel asks only when its cached attributes
// have expired, or after it changed the object. Buffered writes go out
// first so size and mtime are right. A directory whose attributes came
// back fresh from the change itself is answered from them (dircache.go).
func (n *node) Getattr(ctx context.Context, fh fs.FileHandle, out *gofuse.AttrOut) syscall.Errno {
	if n.cachedDirAttr() {
		n.fsys.Stats.GetattrsAnswered.Add(1)
		n.attrOut(out)
		return 0
	}
	post, errno := n.flushWritersAttr(ctx)
	if errno != 0 {
		return errno
	}
	var a nfsclient.Attr
	if post != nil {
		// The flush was one WRITE, which brought the attributes after
		// it (Linux folds GETATTR into WRITE and trusts them too).
		a = *post
	} else {
		var err error
		if a, err = n.fsys.c.GetAttr(ctx, n.fsys.cred(ctx), n.handle()); err != nil {
			if n.staleOpenDir(err) {
				n.attrOut(out)
				out.Nlink = 0
				return 0
			}
			return n.errno("GETATTR", err)
		}
	}
	n.setAttr(&a)
	n.attrOut(out)
	if n.fsys.tr.On(trace.FUSE) {
		n.fsys.trace("GETATTR ino=%d size=%d change=%d timeout=%v", a.FileID, a.Size, a.Change, out.Timeout())
	}
	return 0
}

// staleOpenDir reports whether err says n is gone on the server
// (NFS4ERR_STALE: another client removed it or renamed over it) while n
// is a directory this mount has open: fstat on the open descriptor is
// then answered from the cached attributes with no links, as a local
// file system answers for a removed directory still open, instead of
// failing. The Linux client answers such an fstat from its attribute
// cache until it expires (nfs_getattr revalidates only then), and fails
// with ESTALE after; FUSE's kernel side asks whenever its own cache
// expires, so answering from ours keeps the descriptor usable.
func (n *node) staleOpenDir(err error) bool {
	if n.StableAttr().Mode != syscall.S_IFDIR || nfsclient.Errno(err) != syscall.ESTALE {
		return false
	}
	f := n.fsys
	f.mu.Lock()
	open := f.openDirs[n.StableAttr().Ino] > 0
	f.mu.Unlock()
	n.mu.Lock()
	defer n.mu.Unlock()
	return open && n.attrSet
}

// Setattr covers chmod, chown, truncate and utimens with one SETATTR.
func (n *node) Setattr(ctx context.Context, fh fs.FileHandle, in *gofuse.SetAttrIn, out *gofuse.AttrOut) syscall.Errno {
	ctx = uninterrupted(ctx)
	var sa nfsclient.SetAttr
	if m, ok := in.GetMode(); ok {
		m &= 07777
		sa.Mode = &m
	}
	if v, ok := in.GetUID(); ok {
		sa.UID = &v
	}
	if v, ok := in.GetGID(); ok {
		sa.GID = &v
	}
	if v, ok := in.GetSize(); ok {
		if errno := n.fsys.checkFileSize(v); errno != 0 {
			return errno
		}
		sa.Size = &v
	}
	if in.Valid&gofuse.FATTR_ATIME != 0 {
		if in.Valid&gofuse.FATTR_ATIME_NOW != 0 {
			sa.AtimeNow = true
		} else {
			t := time.Unix(int64(in.Atime), int64(in.Atimensec))
			sa.Atime = &t
		}
	}
	if in.Valid&gofuse.FATTR_MTIME != 0 {
		if in.Valid&gofuse.FATTR_MTIME_NOW != 0 {
			sa.MtimeNow = true
		} else {
			t := time.Unix(int64(in.Mtime), int64(in.Mtimensec))
			sa.Mtime = &t
		}
	}
	// A size change needs a stateid (RFC 8881 s18.30): the open file's
	// when there is one, otherwise the anonymous stateid (s8.2.3).
	var sid nfsclient.StateID
	if h, ok := fh.(*file); ok && sa.Size != nil {
		sid = h.of.StateID
	}
	cred := n.fsys.cred(ctx)
	ch := n.beginChange()
	defer n.endChange()
	var a nfsclient.Attr
	var err error
	folded := false
	if !sa.Empty() {
		// Buffered writes go out first, in the SETATTR's COMPOUND when
		// they can (fold.go).
		a, folded, err = n.writeSetAttr(ctx, cred, sid, &sa)
	}
	if !folded {
		post, errno := n.flushWritersAttr(ctx)
		if errno != 0 {
			return errno
		}
		switch {
		case !sa.Empty():
			a, err = n.fsys.c.SetAttr(ctx, cred, n.handle(), sid, &sa)
		case post != nil:
			a = *post // the flush's one WRITE brought them
		default:
			a, err = n.fsys.c.GetAttr(ctx, cred, n.handle())
		}
	}
	if err != nil {
		return n.errno("SETATTR", err)
	}
	n.changed(&a, true, ch)
	if sa.Size != nil {
		n.mu.Lock()
		n.openChange = a.Change // our own truncate keeps the cache valid
		n.mu.Unlock()
	}
	n.attrOut(out)
	if n.fsys.tr.On(trace.FUSE) {
		n.fsys.trace("SETATTR ino=%d valid=%#x size=%d mode=%o", a.FileID, in.Valid, a.Size, a.Mode)
	}
	return 0
}

// Access asks the server with ACCESS (RFC 8881 s18.1).
func (n *node) Access(ctx context.Context, mask uint32) syscall.Errno {
	isDir := n.StableAttr().Mode == syscall.S_IFDIR
	var want uint32
	if mask&unix.R_OK != 0 {
		want |= nfsclient.AccessRead
	}
	if mask&unix.W_OK != 0 {
		want |= nfsclient.AccessModify | nfsclient.AccessExtend
		if isDir {
			want |= nfsclient.AccessDelete
		}
	}
	if mask&unix.X_OK != 0 {
		if isDir {
			want |= nfsclient.AccessLookup
		} else {
			want |= nfsclient.AccessExecute
		}
	}
	if want == 0 {
		return 0
	}
	got, err := n.fsys.c.Access(ctx, n.fsys.cred(ctx), n.handle(), want)
	if err != nil {
		return n.errno("ACCESS", err)
	}
	if got&want != want {
		return syscall.EACCES
	}
	return 0
}

// Statfs reports the export's space and file counts.
func (n *node) Statfs(ctx context.Context, out *gofuse.StatfsOut) syscall.Errno {
	a, err := n.fsys.c.StatFS(ctx, n.fsys.cred(ctx), n.handle())
	if err != nil {
		return n.errno("STATFS", err)
	}
	const bsize = 4096
	out.Bsize = bsize
	out.Frsize = bsize
	out.Blocks = a.SpaceTotal / bsize
	out.Bfree = a.SpaceFree / bsize
	out.Bavail = a.SpaceAvail / bsize
	out.Files = a.FilesTotal
	out.Ffree = a.FilesFree
	out.NameLen = uint32(n.fsys.nameMax)
	return 0
}

// Readlink sends READLINK.
func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	s, err := n.fsys.c.Readlink(ctx, n.fsys.cred(ctx), n.handle())
	if err != nil {
		return nil, n.errno("READLINK", err)
	}
	return []byte(s), 0
}

// Mkdir sends CREATE of an NF4DIR.
func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *gofuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.fsys.checkName(name); errno != 0 {
		return nil, errno
	}
	ctx = uninterrupted(ctx)
	ch := n.beginChange()
	defer n.endChange()
	m, err := n.fsys.c.Mkdir(ctx, n.fsys.cred(ctx), n.handle(), name, sattrFromMode(mode))
	if err != nil {
		return nil, n.errno("MKDIR", err)
	}
	n.dirChanged(&m.Dir, ch)
	return n.fsys.child(ctx, n, name, m.FH, &m.Attr, out), 0
}

// Mknod creates fifos, sockets and devices with CREATE, regular files
// with OPEN(create)+CLOSE.
func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *gofuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.fsys.checkName(name); errno != 0 {
		return nil, errno
	}
	ctx = uninterrupted(ctx)
	cred := n.fsys.cred(ctx)
	ch := n.beginChange()
	defer n.endChange()
	var typ nfsclient.FileType
	switch mode & syscall.S_IFMT {
	case syscall.S_IFIFO:
		typ = nfsclient.TypeFifo
	case syscall.S_IFSOCK:
		typ = nfsclient.TypeSock
	case syscall.S_IFCHR:
		typ = nfsclient.TypeChr
	case syscall.S_IFBLK:
		typ = nfsclient.TypeBlk
	case syscall.S_IFREG, 0:
		of, err := n.fsys.c.Open(ctx, cred, n.handle(), name, nfsclient.OpenArgs{
			Access: nfsclient.ShareAccessWrite, Create: nfsclient.Guarded, Attr: sattrFromMode(mode)})
		if err != nil {
			return nil, n.errno("OPEN", err)
		}
		n.dirChanged(&of.Dir, ch)
		if err := n.fsys.c.CloseFile(ctx, cred, of); err != nil {
			return nil, n.errno("CLOSE", err)
		}
		return n.fsys.child(ctx, n, name, of.FH, &of.Attr, out), 0
	default:
		return nil, syscall.EINVAL
	}
	m, err := n.fsys.c.Mknod(ctx, cred, n.handle(), name, typ, unix.Major(uint64(dev)), unix.Minor(uint64(dev)), sattrFromMode(mode))
	if err != nil {
		return nil, n.errno("MKNOD", err)
	}
	n.dirChanged(&m.Dir, ch)
	return n.fsys.child(ctx, n, name, m.FH, &m.Attr, out), 0
}

// Symlink sends CREATE of an NF4LNK.
func (n *node) Symlink(ctx context.Context, target, name string, out *gofuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.fsys.checkName(name); errno != 0 {
		return nil, errno
	}
	if errno := checkPath(target); errno != 0 {
		return nil, errno
	}
	ctx = uninterrupted(ctx)
	ch := n.beginChange()
	defer n.endChange()
	m, err := n.fsys.c.Symlink(ctx, n.fsys.cred(ctx), n.handle(), name, target, nil)
	if err != nil {
		return nil, n.errno("SYMLINK", err)
	}
	n.dirChanged(&m.Dir, ch)
	return n.fsys.child(ctx, n, name, m.FH, &m.Attr, out), 0
}

// Link sends LINK and returns the target's inode with its new link count.
func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *gofuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.fsys.checkName(name); errno != 0 {
		return nil, errno
	}
	ctx = uninterrupted(ctx)
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	ch := n.beginChange()
	defer n.endChange()
	a, dc, err := n.fsys.c.Link(ctx, n.fsys.cred(ctx), t.handle(), n.handle(), name)
	if err != nil {
		return nil, n.errno("LINK", err)
	}
	n.dirChanged(&dc, ch)
	return n.fsys.child(ctx, n, name, t.handle(), &a, out), 0
}

// Unlink sends REMOVE. The kernel has already checked that name is not a
// directory.
func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if errno := n.fsys.checkName(name); errno != 0 {
		return errno
	}
	ctx = uninterrupted(ctx)
	// An open file is renamed out of the way instead (silly.go); one
	// that is not stays so until the REMOVE is done.
	if t := n.childNode(name); t != nil && t.StableAttr().Mode != syscall.S_IFDIR {
		ino := t.StableAttr().Ino
		if !n.fsys.beginRemove(ino) {
			defer n.fsys.endRemove(ino)
			return n.remove(ctx, name)
		}
		done, errno := n.fsys.sillyRename(ctx, n, name, t)
		if done {
			n.fsys.lastClose(ctx, t.StableAttr().Ino)
		}
		if errno != 0 || done {
			return errno
		}
	}
	return n.remove(ctx, name)
}

// remove sends REMOVE.
func (n *node) remove(ctx context.Context, name string) syscall.Errno {
	n.returnDelegationBeforeRemove(name)
	ch := n.beginChange()
	defer n.endChange()
	dc, err := n.fsys.c.Remove(ctx, n.fsys.cred(ctx), n.handle(), name)
	if err != nil {
		return n.errno("REMOVE", err)
	}
	// The removed object has one link less (Linux nfs_unlink and
	// nfs_rmdir drop its nlink and revalidate).
	n.invalidateChild(name)
	n.dirChanged(&dc, ch)
	return 0
}

// Rmdir sends REMOVE; the server refuses a directory that is not empty.
func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if errno := n.fsys.checkName(name); errno != 0 {
		return errno
	}
	return n.remove(uninterrupted(ctx), name)
}

// childNode returns the node the kernel knows as name in n, if any.
func (n *node) childNode(name string) *node {
	if ch := n.GetChild(name); ch != nil {
		if c, ok := ch.Operations().(*node); ok {
			return c
		}
	}
	return nil
}

// Rename sends RENAME, which replaces an existing target (RFC 8881
// s18.26.4). renameat2(2)'s flags are EINVAL, as Linux's NFS client
// answers (nfs_rename): NFS has no RENAME_EXCHANGE, and RENAME_NOREPLACE
// cannot be made safe: a LOOKUP before the RENAME leaves a window in
// which another client's new target would be replaced, and LINK+REMOVE
// works for no directory and may remove another client's new source.
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if errno := n.fsys.checkName(name, newName); errno != 0 {
		return errno
	}
	ctx = uninterrupted(ctx)
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	cred := n.fsys.cred(ctx)
	if flags != 0 {
		return syscall.EINVAL
	}
	// A target this mount has open is renamed out of the way first,
	// as Linux's nfs_rename does for a target in use (silly.go).
	var sillied *node
	if t := np.childNode(newName); t != nil {
		if s := n.childNode(name); s == nil || s.StableAttr().Ino != t.StableAttr().Ino {
			done, errno := n.fsys.sillyRename(ctx, np, newName, t)
			if errno != 0 {
				return errno
			}
			if done {
				sillied = t
				// After the RENAME and the directories' changes
				// (deferred before them, so it runs after them).
				defer n.fsys.lastClose(ctx, t.StableAttr().Ino)
			}
		}
	}
	ch := n.beginChange()
	defer n.endChange()
	npch := ch
	if np != n {
		npch = np.beginChange()
		defer np.endChange()
	}
	src, dst, err := n.fsys.c.Rename(ctx, cred, n.handle(), name, np.handle(), newName)
	if err != nil {
		if sillied != nil {
			n.fsys.unSillyRename(ctx, np, newName, sillied)
		}
		return n.errno("RENAME", err)
	}
	// A directory moved to another parent has a new ".." (and ctime),
	// a replaced target one link less: their cached attributes are
	// stale (Linux nfs_rename: nfs_drop_nlink of the target).
	n.invalidateChild(name)
	np.invalidateChild(newName)
	n.dirChanged(&src, ch)
	if np != n {
		np.dirChanged(&dst, npch)
	}
	return 0
}
