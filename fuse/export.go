package fuse

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/rdmafs/rdmafs/nfsclient"
)

// Export support (name_to_handle_at, open_by_handle_at, and knfsd
// re-exporting the mount). The Linux NFS client puts the NFS file handle
// into the handles it hands out; a FUSE handle holds only the node ID
// and a 32-bit generation (fuse_encode_fh), so the node ID is the NFS
// fileid (go-fuse's ExternalNodeID) and the generation a hash of the
// file handle, and the mount remembers the file handle of each fileid it
// has seen. When the kernel has forgotten the inode (drop_caches, memory
// pressure) it sends LOOKUP "." with the node ID (fuse_get_dentry), and
// the node is made again from the remembered file handle; a directory's
// parent comes from LOOKUPP (RFC 8881 s18.14) for LOOKUP "..".

// fileHandles remembers the NFS file handle of each fileid seen, bounded:
// two generations of at most fhTableSize entries each, the older dropped
// when the newer fills up (about 100 bytes an entry: at most some 25 MiB).
// A handle of an object not seen in the last fhTableSize to
// 2*fhTableSize new fileids fails with ESTALE once the kernel forgot the
// inode.
type fileHandles struct {
	mu       sync.Mutex
	cur, old map[uint64][]byte
}

const fhTableSize = 1 << 17

func (t *fileHandles) put(ino uint64, fh []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.cur[ino]; ok && bytes.Equal(old, fh) {
		return
	}
	if t.cur == nil || len(t.cur) >= fhTableSize {
		t.old, t.cur = t.cur, make(map[uint64][]byte)
	}
	t.cur[ino] = append([]byte(nil), fh...)
}

func (t *fileHandles) get(ino uint64) []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	if fh, ok := t.cur[ino]; ok {
		return fh
	}
	return t.old[ino]
}

// ino returns the inode number, which is also the FUSE node ID, of an
// object with the given fileid. Node ID 1 is the FUSE root and ^0 is
// reserved by go-fuse: another object with such a fileid gets a number
// with the top bit flipped instead.
func (f *FS) ino(fileid uint64) uint64 {
	if fileid == f.rootIno {
		return fileid
	}
	if fileid == gofuse.FUSE_ROOT_ID || fileid == ^uint64(0) {
		return fileid ^ 1<<63
	}
	return fileid
}

// fileidOf inverts ino.
func (f *FS) fileidOf(ino uint64) uint64 {
	if ino == gofuse.FUSE_ROOT_ID^1<<63 || ino == ^uint64(0)^1<<63 {
		return ino ^ 1<<63
	}
	return ino
}

// fhGen is the generation of a node: a hash of its file handle, so that a
// handle of an object that is gone, whose fileid the server gave to a
// new object, fails with ESTALE (the kernel compares generations in
// fuse_get_dentry and drops an inode whose generation changed in
// fuse_iget).
func fhGen(fh []byte) uint64 {
	h := fnv.New32a()
	h.Write(fh)
	return uint64(h.Sum32())
}

// stableAttr is the go-fuse identity of the object with handle fh and
// attributes a.
func (f *FS) stableAttr(fh []byte, a *nfsclient.Attr) fs.StableAttr {
	return fs.StableAttr{Mode: typeBits(a.Type), Ino: f.ino(a.FileID), Gen: fhGen(fh)}
}

var (
	_ = (fs.NodeLookupNoder)((*node)(nil))
	_ = (fs.NodeLookupParenter)((*node)(nil))
)

// LookupNode makes the node of node ID id again after the kernel forgot
// it, from the file handle remembered for it (called on the root only).
// A file handle the server no longer knows gives ESTALE, as an NFS
// client's open_by_handle_at of a removed file.
func (n *node) LookupNode(ctx context.Context, id uint64, out *gofuse.EntryOut) (*fs.Inode, syscall.Errno) {
	f := n.fsys
	fh := f.handles.get(id)
	if fh == nil {
		return nil, syscall.ESTALE
	}
	a, err := f.c.GetAttr(ctx, f.cred(ctx), fh)
	if err != nil {
		return nil, n.errno("GETATTR (by handle)", err)
	}
	if f.ino(a.FileID) != id {
		return nil, syscall.ESTALE
	}
	c := f.newNode(fh, &a)
	c.entryOut(out)
	return n.NewInode(ctx, c, f.stableAttr(fh, &a)), 0
}

// LookupParent finds directory n's parent with LOOKUPP, and n's name in
// it with READDIR (the kernel reconnects a directory's handle to the
// tree through it).
func (n *node) LookupParent(ctx context.Context, out *gofuse.EntryOut) (*fs.Inode, string, syscall.Errno) {
	f := n.fsys
	cred := f.cred(ctx)
	pfh, pa, err := f.c.LookupParent(ctx, cred, n.handle())
	if err != nil {
		return nil, "", n.errno("LOOKUPP", err)
	}
	ents, err := f.c.ReadDirAll(ctx, cred, pfh)
	if err != nil {
		return nil, "", n.errno("READDIR", err)
	}
	self := f.fileidOf(n.StableAttr().Ino)
	name := ""
	for _, e := range ents {
		if e.Attr.FileID == self {
			name = e.Name
			break
		}
	}
	if name == "" {
		return nil, "", syscall.ESTALE
	}
	if bytes.Equal(pfh, f.c.RootFH()) {
		root := n.Root()
		r := root.Operations().(*node)
		r.setAttr(&pa)
		r.entryOut(out)
		return root, name, 0
	}
	p := f.newNode(pfh, &pa)
	p.entryOut(out)
	return n.NewInode(ctx, p, f.stableAttr(pfh, &pa)), name, 0
}

// The handle cache file (Options.HandleCache) keeps the table across a
// remount: "rdmafs handles 1\n", the export root's file handle, then
// (fileid, file handle) records, each number an unsigned varint and each
// file handle its length and bytes.
const (
	handleCacheMagic = "rdmafs handles 1\n"
	maxFH            = 128 // NFS4_FHSIZE (RFC 8881 s3.2)
)

// encode writes the table, newest generation last.
func (t *fileHandles) encode(root []byte) []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := []byte(handleCacheMagic)
	b = binary.AppendUvarint(b, uint64(len(root)))
	b = append(b, root...)
	for _, m := range []map[uint64][]byte{t.old, t.cur} {
		for ino, fh := range m {
			b = binary.AppendUvarint(b, ino)
			b = binary.AppendUvarint(b, uint64(len(fh)))
			b = append(b, fh...)
		}
	}
	return b
}

// decode fills the table from b, written by encode for the same export
// root; it stops at the first malformed record.
func (t *fileHandles) decode(b, root []byte) error {
	if !bytes.HasPrefix(b, []byte(handleCacheMagic)) {
		return errors.New("not a handle cache")
	}
	b = b[len(handleCacheMagic):]
	fh := func() ([]byte, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n == 0 || n > maxFH || n > uint64(len(b)-k) {
			return nil, false
		}
		v := b[k : k+int(n)]
		b = b[k+int(n):]
		return v, true
	}
	r, ok := fh()
	if !ok || !bytes.Equal(r, root) {
		return errors.New("handle cache of another export")
	}
	for len(b) > 0 {
		ino, k := binary.Uvarint(b)
		if k <= 0 {
			return errors.New("handle cache: bad fileid")
		}
		b = b[k:]
		v, ok := fh()
		if !ok {
			return errors.New("handle cache: bad file handle")
		}
		t.put(ino, v)
	}
	return nil
}

// openHandleCache opens path, waits (up to handleCacheWait) for the lock
// a mount of the same place holds on it until its Shutdown saved it, and
// loads it. The lock stays held until saveHandleCache.
func (f *FS) openHandleCache(path string) {
	fd, err := lockHandleCache(path, time.Now().Add(handleCacheWait))
	if err != nil {
		f.trace("handle cache %s: %v", path, err)
		return
	}
	b, err := io.ReadAll(io.LimitReader(fd, 64<<20))
	if err == nil && len(b) > 0 {
		err = f.handles.decode(b, f.c.RootFH())
	}
	if err != nil {
		f.trace("handle cache %s: %v", path, err)
	}
	f.handleCache = fd
}

// lockHandleCache opens path (made 0600 if missing) and locks it. It
// refuses a symbolic link (O_NOFOLLOW) and anything but a regular file:
// a link planted at the cache's predictable name must not make a
// privileged mount write through it. saveHandleCache renames a new file
// over path, so the file locked is checked to be still the one at path,
// and opened again when it is not.
func lockHandleCache(path string, deadline time.Time) (*os.File, error) {
	for {
		fd, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, err
		}
		fi, err := fd.Stat()
		if err == nil && !fi.Mode().IsRegular() {
			err = errors.New("not a regular file")
		}
		if err != nil {
			fd.Close()
			return nil, err
		}
		for unix.Flock(int(fd.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			if time.Now().After(deadline) {
				fd.Close()
				return nil, errors.New("still locked")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if cur, err := os.Lstat(path); err == nil && os.SameFile(cur, fi) {
			return fd, nil
		}
		fd.Close() // saved and replaced while we waited
	}
}

// handleCacheWait bounds how long a mount waits for the process that had
// the same mount to save its handles.
const handleCacheWait = 10 * time.Second

// saveHandleCache writes the table back and releases the lock. It
// writes a new file (O_EXCL, 0600) in the cache's directory and renames it
// over the cache, so that it never writes to a file someone else put at
// the cache's name; the rename comes before the lock is released.
func (f *FS) saveHandleCache() error {
	fd := f.handleCache
	if fd == nil {
		return nil
	}
	f.handleCache = nil
	defer fd.Close()
	path := fd.Name()
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("handle cache: %w", err)
	}
	_, err = tmp.Write(f.handles.encode(f.c.RootFH()))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("handle cache: %w", err)
	}
	return nil
}
