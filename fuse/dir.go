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

// DirReader reads directories: READDIR one page at a time (silly.go's
// search for a free name), and whole, with the entries' attributes
// (ReadDirPlusAll: an open directory) or with names and fileids only
// (ReadDirAll: export.go's search for a child's name).
type DirReader interface {
	ReadDir(ctx context.Context, cred oncrpc.Credential, dir []byte, cookie uint64, verf [8]byte, maxBytes int) (nfsclient.ReadDirPage, error)
	ReadDirAll(ctx context.Context, cred oncrpc.Credential, dir []byte) ([]nfsclient.DirEntry, error)
	ReadDirPlusAll(ctx context.Context, cred oncrpc.Credential, dir []byte) ([]nfsclient.DirEntry, error)
}

// dirHandle is an open directory. It reads the whole directory with
// READDIR asking for each entry's file handle and attributes, and answers
// the kernel's READDIRPLUS lookups from them: no LOOKUP or GETATTR per
// entry (RFC 8881 s18.23).
type dirHandle struct {
	n    *node
	cred oncrpc.Credential

	mu      sync.Mutex
	loaded  bool
	entries []nfsclient.DirEntry
	byName  map[string]int // index in entries
	pos     int            // next position: 0 ".", 1 "..", 2+i entries[i]
}

var (
	_ = (fs.FileReaddirenter)((*dirHandle)(nil))
	_ = (fs.FileLookuper)((*dirHandle)(nil))
	_ = (fs.FileSeekdirer)((*dirHandle)(nil))
	_ = (fs.FileReleasedirer)((*dirHandle)(nil))
	_ = (fs.FileFsyncdirer)((*dirHandle)(nil))
)

// OpendirHandle opens a directory for reading.
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if n.StableAttr().Mode != syscall.S_IFDIR {
		return nil, 0, syscall.ENOTDIR
	}
	n.fsys.dirOpened(n.StableAttr().Ino)
	return &dirHandle{n: n, cred: n.fsys.cred(ctx)}, 0, 0
}

func (d *dirHandle) load(ctx context.Context) syscall.Errno {
	if d.loaded {
		return 0
	}
	d.n.fsys.Stats.Readdirs.Add(1)
	ents, err := d.n.fsys.c.ReadDirPlusAll(ctx, d.cred, d.n.handle())
	if err != nil {
		return d.n.errno("READDIR", err)
	}
	d.entries, d.loaded = ents, true
	d.byName = make(map[string]int, len(ents))
	for i := range ents {
		d.byName[ents[i].Name] = i
	}
	// READDIR moves the directory's atime: its cached attributes no
	// longer answer a GETATTR (as Linux marks NFS_INO_INVALID_ATIME).
	d.n.invalidateAttr()
	if d.n.fsys.tr.On(trace.FUSE) {
		d.n.fsys.trace("READDIR ino=%d entries=%d (attributes and handles from READDIR)", d.n.StableAttr().Ino, len(ents))
	}
	return 0
}

// Readdirent returns the next entry, "." and ".." first.
func (d *dirHandle) Readdirent(ctx context.Context) (*gofuse.DirEntry, syscall.Errno) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if errno := d.load(ctx); errno != 0 {
		return nil, errno
	}
	i := d.pos
	if i >= len(d.entries)+2 {
		return nil, 0
	}
	d.pos++
	switch i {
	case 0:
		return &gofuse.DirEntry{Name: ".", Mode: syscall.S_IFDIR, Ino: d.n.StableAttr().Ino, Off: 1}, 0
	case 1:
		return &gofuse.DirEntry{Name: "..", Mode: syscall.S_IFDIR, Off: 2}, 0
	}
	e := &d.entries[i-2]
	return &gofuse.DirEntry{Name: e.Name, Mode: typeBits(e.Attr.Type), Ino: d.n.fsys.ino(e.Attr.FileID), Off: uint64(i + 1)}, 0
}

// Lookup answers READDIRPLUS for an entry of the listing, from
// READDIR's attributes; entries without them get a LOOKUP. The entry is
// found by name, not as the one Readdirent returned last: go-fuse
// answers a read at an offset inside its previous batch (a seekdir
// back, or a read the kernel redoes) from its own copy of that batch,
// and the Linux client too serves such reads from the READDIR pages it
// cached, with no LOOKUP per entry.
func (d *dirHandle) Lookup(ctx context.Context, name string, out *gofuse.EntryOut) (*fs.Inode, syscall.Errno) {
	d.mu.Lock()
	var a nfsclient.Attr
	i, ok := d.byName[name]
	if ok {
		a = d.entries[i].Attr
	}
	d.mu.Unlock()
	if !ok || len(a.FileHandle) == 0 || a.RdattrErr != 0 || a.FileID == 0 || a.Type == 0 {
		return d.n.Lookup(ctx, name, out)
	}
	return d.n.fsys.child(ctx, d.n, name, a.FileHandle, &a, out), 0
}

// Seekdir moves to a position Readdirent handed out; 0 reads the
// directory again (rewinddir).
func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off == 0 {
		d.loaded, d.entries, d.byName = false, nil, nil
	}
	d.pos = int(off)
	return 0
}

// Releasedir drops the listing.
func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	d.mu.Lock()
	d.entries, d.byName = nil, nil
	d.mu.Unlock()
	d.n.fsys.dirReleased(uninterrupted(ctx), d.n.StableAttr().Ino)
}

// Fsyncdir has nothing to do: directory operations are synchronous on
// the server.
func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno { return 0 }
