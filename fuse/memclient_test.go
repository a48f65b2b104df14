package fuse_test

import (
	"context"
	"encoding/binary"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// memClient is a fuse.Client over an in-memory tree: a test double that
// lets the tests count the operations the mount sends, change the tree
// behind the mount's caches, and make operations fail as no real server
// does on demand. It is an NFS server of one client with none of the
// protocol: every change is atomic, attributes come back with every
// change, there are no delegations and no NFSv4.2.
type memClient struct {
	wsize, rsize int

	mu      sync.Mutex
	objs    map[uint64]*memObj // by fileid, which is also the file handle
	next    uint64             // the next fileid
	change  uint64             // the last change attribute given out
	counts  map[string]int     // operations sent, by name
	fail    map[string]error   // operations that fail, by name, until cleared
	opens   int                // OPEN states not CLOSEd
	nextSID uint32
	locks   map[uint64][]memLock // by fileid
}

// memObj is one object of the tree.
type memObj struct {
	attr     nfsclient.Attr
	data     []byte            // a regular file's
	target   string            // a symlink's
	children map[string]uint64 // a directory's
}

const memRoot = 2 // the root's fileid

func newMemClient() *memClient {
	c := &memClient{
		wsize: 64 << 10, rsize: 64 << 10,
		objs:   make(map[uint64]*memObj),
		next:   memRoot,
		counts: make(map[string]int),
		fail:   make(map[string]error),
		locks:  make(map[uint64][]memLock),
	}
	c.newObjLocked(nfsclient.TypeDir, 0o777)
	return c
}

var _ fuse.Client = (*memClient)(nil)

func fhOf(id uint64) []byte { return binary.BigEndian.AppendUint64(nil, id) }

// ops returns the counts of the operations sent so far.
func (c *memClient) ops() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

// failOp makes operation op (a name counted in ops) fail with err from
// now on; nil makes it work again.
func (c *memClient) failOp(op string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		delete(c.fail, op)
	} else {
		c.fail[op] = err
	}
}

// sendLocked counts op and returns the error it is to fail with.
func (c *memClient) sendLocked(op string) error {
	c.counts[op]++
	return c.fail[op]
}

func (c *memClient) send(op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sendLocked(op)
}

func (c *memClient) newObjLocked(typ nfsclient.FileType, mode uint32) (uint64, *memObj) {
	id := c.next
	c.next++
	c.change++
	now := time.Now()
	o := &memObj{attr: nfsclient.Attr{
		Type: typ, Change: c.change, FileID: id, Mode: mode & 07777, NLink: 1,
		Atime: now, Mtime: now, Ctime: now,
	}}
	if typ == nfsclient.TypeDir {
		o.children = make(map[string]uint64)
		o.attr.NLink = 2
	}
	c.objs[id] = o
	return id, o
}

// touchLocked records a change of o's data or namespace.
func (c *memClient) touchLocked(o *memObj) {
	c.change++
	o.attr.Change = c.change
	o.attr.Mtime, o.attr.Ctime = time.Now(), time.Now()
}

func (c *memClient) objLocked(fh []byte) (*memObj, error) {
	if len(fh) != 8 {
		return nil, nfsclient.ErrBadHandle
	}
	o := c.objs[binary.BigEndian.Uint64(fh)]
	if o == nil {
		return nil, nfsclient.ErrStale
	}
	return o, nil
}

func (c *memClient) dirLocked(fh []byte) (*memObj, error) {
	d, err := c.objLocked(fh)
	if err == nil && d.attr.Type != nfsclient.TypeDir {
		err = nfsclient.ErrNotDir
	}
	return d, err
}

func (o *memObj) attrs() nfsclient.Attr {
	a := o.attr
	a.Size = uint64(len(o.data))
	if o.attr.Type == nfsclient.TypeLnk {
		a.Size = uint64(len(o.target))
	}
	a.SpaceUsed = a.Size
	return a
}

// dirChangeLocked is what a change of d returns: atomic, with the
// attributes after it.
func (c *memClient) dirChangeLocked(d *memObj) nfsclient.DirChange {
	before := d.attr.Change
	c.touchLocked(d)
	return nfsclient.DirChange{Atomic: true, Before: before, After: d.attr.Change, Attr: d.attrs(), AttrOK: true}
}

// path resolves a slash-separated path from the root, for tests that
// change the tree behind the mount.
func (c *memClient) pathLocked(p string) (*memObj, *memObj, string, error) {
	dir := c.objs[memRoot]
	name := ""
	for p != "" {
		var rest string
		name, rest, _ = strings.Cut(p, "/")
		if rest == "" {
			break
		}
		id, ok := dir.children[name]
		if !ok {
			return nil, nil, "", nfsclient.ErrNoEnt
		}
		dir, p = c.objs[id], rest
	}
	if name == "" {
		return dir, nil, "", nil
	}
	id, ok := dir.children[name]
	if !ok {
		return dir, nil, name, nil
	}
	return dir, c.objs[id], name, nil
}

// setData replaces the content of the file at p, creating it, as another
// client would: the mount's caches do not see it.
func (c *memClient) setData(t testing.TB, p string, data []byte) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	dir, o, name, err := c.pathLocked(p)
	if err != nil {
		t.Fatalf("set data of %s: %v", p, err)
	}
	if o == nil {
		var id uint64
		id, o = c.newObjLocked(nfsclient.TypeReg, 0o644)
		dir.children[name] = id
		c.touchLocked(dir)
	}
	o.data = append([]byte(nil), data...)
	c.touchLocked(o)
}

// remove removes p as another client would.
func (c *memClient) remove(t testing.TB, p string) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	dir, o, name, err := c.pathLocked(p)
	if err != nil || o == nil {
		t.Fatalf("remove %s: no such file", p)
	}
	delete(dir.children, name)
	c.touchLocked(dir)
	o.attr.NLink--
	if o.attr.NLink == 0 {
		delete(c.objs, o.attr.FileID)
	}
}

// data returns the content of the file at p.
func (c *memClient) data(p string) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, o, _, err := c.pathLocked(p)
	if err != nil || o == nil {
		return nil
	}
	return append([]byte(nil), o.data...)
}

// applyLocked sets sa on o.
func (c *memClient) applyLocked(o *memObj, sa *nfsclient.SetAttr) {
	if sa == nil {
		return
	}
	if sa.Mode != nil {
		o.attr.Mode = *sa.Mode & 07777
	}
	if sa.UID != nil {
		o.attr.UID = *sa.UID
	}
	if sa.GID != nil {
		o.attr.GID = *sa.GID
	}
	if sa.Size != nil {
		o.data = resize(o.data, int(*sa.Size))
	}
	if sa.Atime != nil {
		o.attr.Atime = *sa.Atime
	}
	if sa.Mtime != nil {
		o.attr.Mtime = *sa.Mtime
	}
	if sa.AtimeNow {
		o.attr.Atime = time.Now()
	}
	if sa.MtimeNow {
		o.attr.Mtime = time.Now()
	}
	c.change++
	o.attr.Change = c.change
	o.attr.Ctime = time.Now()
}

func resize(b []byte, n int) []byte {
	if n <= len(b) {
		return b[:n]
	}
	return append(b, make([]byte, n-len(b))...)
}

func (c *memClient) Cred(uid, gid uint32, groups []uint32) oncrpc.Credential {
	return oncrpc.Credential{}
}
func (c *memClient) RootFH() []byte                           { return fhOf(memRoot) }
func (c *memClient) RSize() int                               { return c.rsize }
func (c *memClient) WSize() int                               { return c.wsize }
func (c *memClient) MaxFileSize() uint64                      { return 0 }
func (c *memClient) SetRecallHandler(nfsclient.RecallHandler) {}
func (c *memClient) Delegated([]byte) bool                    { return false }
func (c *memClient) ReturnDelegation([]byte)                  {}
func (c *memClient) Abandon()                                 {}
func (c *memClient) Close(context.Context) error              { return c.send("DESTROY_SESSION") }
func (c *memClient) ReadDirAll(ctx context.Context, cred oncrpc.Credential, dir []byte) ([]nfsclient.DirEntry, error) {
	return c.ReadDirPlusAll(ctx, cred, dir)
}

func (c *memClient) GetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte) (nfsclient.Attr, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.sendLocked("GETATTR"); err != nil {
		return nfsclient.Attr{}, err
	}
	o, err := c.objLocked(fh)
	if err != nil {
		return nfsclient.Attr{}, err
	}
	return o.attrs(), nil
}

func (c *memClient) SetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte, sid nfsclient.StateID, sa *nfsclient.SetAttr) (nfsclient.Attr, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.sendLocked("SETATTR"); err != nil {
		return nfsclient.Attr{}, err
	}
	o, err := c.objLocked(fh)
	if err != nil {
		return nfsclient.Attr{}, err
	}
	c.applyLocked(o, sa)
	return o.attrs(), nil
}

func (c *memClient) Access(ctx context.Context, cred oncrpc.Credential, fh []byte, mask uint32) (uint32, error) {
	return mask, c.send("ACCESS")
}

func (c *memClient) StatFS(ctx context.Context, cred oncrpc.Credential, fh []byte) (nfsclient.Attr, error) {
	if err := c.send("STATFS"); err != nil {
		return nfsclient.Attr{}, err
	}
	return nfsclient.Attr{SpaceTotal: 1 << 40, SpaceFree: 1 << 39, SpaceAvail: 1 << 39,
		FilesTotal: 1 << 20, FilesFree: 1 << 19, FilesAvail: 1 << 19, MaxName: 255}, nil
}

func (c *memClient) Lookup(ctx context.Context, cred oncrpc.Credential, dir []byte, name string) ([]byte, nfsclient.Attr, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.sendLocked("LOOKUP"); err != nil {
		return nil, nfsclient.Attr{}, err
	}
	d, err := c.dirLocked(dir)
	if err != nil {
		return nil, nfsclient.Attr{}, err
	}
	id, ok := d.children[name]
	if !ok {
		return nil, nfsclient.Attr{}, nfsclient.ErrNoEnt
	}
	return fhOf(id), c.objs[id].attrs(), nil
}

func (c *memClient) LookupParent(ctx context.Context, cred oncrpc.Credential, dir []byte) ([]byte, nfsclient.Attr, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.sendLocked("LOOKUPP"); err != nil {
		return nil, nfsclient.Attr{}, err
	}
	want := binary.BigEndian.Uint64(dir)
	for id, o := range c.objs {
		for _, ch := range o.children {
			if ch == want {
				return fhOf(id), o.attrs(), nil
			}
		}
	}
	return nil, nfsclient.Attr{}, nfsclient.ErrNoEnt
}

func (c *memClient) Readlink(ctx context.Context, cred oncrpc.Credential, fh []byte) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.sendLocked("READLINK"); err != nil {
		return "", err
	}
	o, err := c.objLocked(fh)
	if err != nil {
		return "", err
	}
	return o.target, nil
}

// makeLocked creates name in dir.
func (c *memClient) makeLocked(op string, dir []byte, name string, typ nfsclient.FileType, sa *nfsclient.SetAttr) (nfsclient.Made, *memObj, error) {
	if err := c.sendLocked(op); err != nil {
		return nfsclient.Made{}, nil, err
	}
	d, err := c.dirLocked(dir)
	if err != nil {
		return nfsclient.Made{}, nil, err
	}
	if _, ok := d.children[name]; ok {
		return nfsclient.Made{}, nil, nfsclient.ErrExist
	}
	id, o := c.newObjLocked(typ, 0o644)
	c.applyLocked(o, sa)
	d.children[name] = id
	if typ == nfsclient.TypeDir {
		d.attr.NLink++
	}
	dc := c.dirChangeLocked(d)
	return nfsclient.Made{FH: fhOf(id), Attr: o.attrs(), Dir: dc}, o, nil
}

func (c *memClient) Mkdir(ctx context.Context, cred oncrpc.Credential, dir []byte, name string, sa *nfsclient.SetAttr) (nfsclient.Made, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, _, err := c.makeLocked("CREATE", dir, name, nfsclient.TypeDir, sa)
	return m, err
}

func (c *memClient) Mknod(ctx context.Context, cred oncrpc.Credential, dir []byte, name string, typ nfsclient.FileType, major, minor uint32, sa *nfsclient.SetAttr) (nfsclient.Made, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, o, err := c.makeLocked("CREATE", dir, name, typ, sa)
	if err == nil {
		o.attr.RdevMajor, o.attr.RdevMinor = major, minor
		m.Attr = o.attrs()
	}
	return m, err
}

func (c *memClient) Symlink(ctx context.Context, cred oncrpc.Credential, dir []byte, name, target string, sa *nfsclient.SetAttr) (nfsclient.Made, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, o, err := c.makeLocked("CREATE", dir, name, nfsclient.TypeLnk, sa)
	if err == nil {
		o.target = target
		m.Attr = o.attrs()
	}
	return m, err
}

func (c *memClient) Link(ctx context.Context, cred oncrpc.Credential, fh, dir []byte, name string) (nfsclient.Attr, nfsclient.DirChange, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.sendLocked("LINK"); err != nil {
		return nfsclient.Attr{}, nfsclient.DirChange{}, err
	}
	o, err := c.objLocked(fh)
	if err != nil {
		return nfsclient.Attr{}, nfsclient.DirChange{}, err
	}
	d, err := c.dirLocked(dir)
	if err != nil {
		return nfsclient.Attr{}, nfsclient.DirChange{}, err
	}
	if _, ok := d.children[name]; ok {
		return nfsclient.Attr{}, nfsclient.DirChange{}, nfsclient.ErrExist
	}
	d.children[name] = o.attr.FileID
	o.attr.NLink++
	c.touchLocked(o)
	return o.attrs(), c.dirChangeLocked(d), nil
}

func (c *memClient) Remove(ctx context.Context, cred oncrpc.Credential, dir []byte, name string) (nfsclient.DirChange, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.sendLocked("REMOVE"); err != nil {
		return nfsclient.DirChange{}, err
	}
	d, err := c.dirLocked(dir)
	if err != nil {
		return nfsclient.DirChange{}, err
	}
	id, ok := d.children[name]
	if !ok {
		return nfsclient.DirChange{}, nfsclient.ErrNoEnt
	}
	o := c.objs[id]
	if len(o.children) > 0 {
		return nfsclient.DirChange{}, nfsclient.ErrNotEmpty
	}
	delete(d.children, name)
	if o.attr.Type == nfsclient.TypeDir {
		d.attr.NLink--
		delete(c.objs, id)
	} else {
		o.attr.NLink--
		if o.attr.NLink == 0 {
			delete(c.objs, id)
		}
	}
	return c.dirChangeLocked(d), nil
}

func (c *memClient) Rename(ctx context.Context, cred oncrpc.Credential, srcDir []byte, srcName string, dstDir []byte, dstName string) (nfsclient.DirChange, nfsclient.DirChange, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var none nfsclient.DirChange
	if err := c.sendLocked("RENAME"); err != nil {
		return none, none, err
	}
	sd, err := c.dirLocked(srcDir)
	if err != nil {
		return none, none, err
	}
	dd, err := c.dirLocked(dstDir)
	if err != nil {
		return none, none, err
	}
	id, ok := sd.children[srcName]
	if !ok {
		return none, none, nfsclient.ErrNoEnt
	}
	if old, ok := dd.children[dstName]; ok && old != id {
		o := c.objs[old]
		o.attr.NLink--
		if o.attr.NLink == 0 || o.attr.Type == nfsclient.TypeDir {
			delete(c.objs, old)
		}
	}
	delete(sd.children, srcName)
	dd.children[dstName] = id
	return c.dirChangeLocked(sd), c.dirChangeLocked(dd), nil
}

func (c *memClient) entriesLocked(op string, dir []byte) ([]nfsclient.DirEntry, error) {
	if err := c.sendLocked(op); err != nil {
		return nil, err
	}
	d, err := c.dirLocked(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(d.children))
	for name := range d.children {
		names = append(names, name)
	}
	sort.Strings(names)
	ents := make([]nfsclient.DirEntry, len(names))
	for i, name := range names {
		id := d.children[name]
		a := c.objs[id].attrs()
		a.FileHandle = fhOf(id)
		ents[i] = nfsclient.DirEntry{Cookie: uint64(i + 3), Name: name, Attr: a}
	}
	return ents, nil
}

func (c *memClient) ReadDir(ctx context.Context, cred oncrpc.Credential, dir []byte, cookie uint64, verf [8]byte, maxBytes int) (nfsclient.ReadDirPage, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ents, err := c.entriesLocked("READDIR", dir)
	var page nfsclient.ReadDirPage
	for _, e := range ents {
		if e.Cookie > cookie {
			page.Entries = append(page.Entries, e)
		}
	}
	page.EOF = true
	return page, err
}

func (c *memClient) ReadDirPlusAll(ctx context.Context, cred oncrpc.Credential, dir []byte) ([]nfsclient.DirEntry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entriesLocked("READDIR", dir)
}

// openLocked makes open state on file id.
func (c *memClient) openLocked(id uint64, o *memObj) *nfsclient.OpenFile {
	c.opens++
	c.nextSID++
	sid := nfsclient.StateID{Seq: 1}
	binary.BigEndian.PutUint32(sid.Other[:], c.nextSID)
	return &nfsclient.OpenFile{FH: fhOf(id), StateID: sid, Attr: o.attrs()}
}

func (c *memClient) Open(ctx context.Context, cred oncrpc.Credential, dir []byte, name string, args nfsclient.OpenArgs) (*nfsclient.OpenFile, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.sendLocked("OPEN"); err != nil {
		return nil, err
	}
	d, err := c.dirLocked(dir)
	if err != nil {
		return nil, err
	}
	id, ok := d.children[name]
	switch {
	case ok && args.Create == nfsclient.Guarded:
		return nil, nfsclient.ErrExist
	case ok:
		of := c.openLocked(id, c.objs[id])
		of.Dir = nfsclient.DirChange{Atomic: true, Before: d.attr.Change, After: d.attr.Change, Attr: d.attrs(), AttrOK: true}
		return of, nil
	case args.Create == nfsclient.NoCreate:
		return nil, nfsclient.ErrNoEnt
	}
	id, o := c.newObjLocked(nfsclient.TypeReg, 0o644)
	c.applyLocked(o, args.Attr)
	d.children[name] = id
	of := c.openLocked(id, o)
	of.Created = true
	of.Dir = c.dirChangeLocked(d)
	return of, nil
}

func (c *memClient) OpenFH(ctx context.Context, cred oncrpc.Credential, fh []byte, access, deny uint32) (*nfsclient.OpenFile, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.sendLocked("OPEN"); err != nil {
		return nil, err
	}
	o, err := c.objLocked(fh)
	if err != nil {
		return nil, err
	}
	return c.openLocked(o.attr.FileID, o), nil
}

func (c *memClient) CloseFile(ctx context.Context, cred oncrpc.Credential, of *nfsclient.OpenFile) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.sendLocked("CLOSE"); err != nil {
		return err
	}
	c.opens--
	id := binary.BigEndian.Uint64(of.FH)
	locks := c.locks[id][:0]
	for _, l := range c.locks[id] {
		if l.owner.sid != of.StateID {
			locks = append(locks, l)
		}
	}
	c.locks[id] = locks
	return nil
}

// openStates returns the OPEN states not CLOSEd.
func (c *memClient) openStates() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.opens
}

func (c *memClient) Read(ctx context.Context, cred oncrpc.Credential, fh []byte, sid nfsclient.StateID, off uint64, view oncrpc.View) (int, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.sendLocked("READ"); err != nil {
		return 0, false, err
	}
	o, err := c.objLocked(fh)
	if err != nil {
		return 0, false, err
	}
	if off >= uint64(len(o.data)) {
		return 0, true, nil
	}
	n := copy(view.Bytes(), o.data[off:])
	return n, off+uint64(n) >= uint64(len(o.data)), nil
}

func (c *memClient) ReadInPlace(ctx context.Context, cred oncrpc.Credential, fh []byte, sid nfsclient.StateID, off uint64, dest []byte) ([]byte, func(), bool, error) {
	n, eof, err := c.Read(ctx, cred, fh, sid, off, oncrpc.Plain(dest))
	return dest[:n], nil, eof, err
}

// writeLocked writes data at off; op names it in the counts.
func (c *memClient) writeLocked(op string, fh []byte, off uint64, data []byte, stable nfsclient.Stable) (nfsclient.WriteResult, *memObj, error) {
	if err := c.sendLocked(op); err != nil {
		return nfsclient.WriteResult{}, nil, err
	}
	o, err := c.objLocked(fh)
	if err != nil {
		return nfsclient.WriteResult{}, nil, err
	}
	end := int(off) + len(data)
	if end > len(o.data) {
		o.data = resize(o.data, end)
	}
	copy(o.data[off:], data)
	c.touchLocked(o)
	return nfsclient.WriteResult{Count: uint32(len(data)), Committed: stable, Attr: o.attrs(), AttrOK: true}, o, nil
}

func (c *memClient) Write(ctx context.Context, cred oncrpc.Credential, fh []byte, sid nfsclient.StateID, off uint64, data oncrpc.View, stable nfsclient.Stable) (nfsclient.WriteResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	res, _, err := c.writeLocked("WRITE", fh, off, data.Bytes(), stable)
	res.AttrOK = false
	return res, err
}

func (c *memClient) WriteGetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte, sid nfsclient.StateID, off uint64, data oncrpc.View, stable nfsclient.Stable) (nfsclient.WriteResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	res, _, err := c.writeLocked("WRITE", fh, off, data.Bytes(), stable)
	return res, err
}

// WriteSetAttr is one COMPOUND: counted as WRITE+SETATTR. A failed
// WRITE stops it (RFC 8881 s16.2.3).
func (c *memClient) WriteSetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte, sid nfsclient.StateID, off uint64, data oncrpc.View, stable nfsclient.Stable, setSID nfsclient.StateID, sa *nfsclient.SetAttr) (nfsclient.WriteResult, nfsclient.Attr, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	res, o, err := c.writeLocked("WRITE+SETATTR", fh, off, data.Bytes(), stable)
	if err != nil {
		return res, nfsclient.Attr{}, err
	}
	c.applyLocked(o, sa)
	return res, o.attrs(), nil
}

func (c *memClient) Commit(ctx context.Context, cred oncrpc.Credential, fh []byte, off uint64, count uint32) (nfsclient.Verifier, error) {
	return nfsclient.Verifier{}, c.send("COMMIT")
}
