package fuse_test

import (
	"context"
	"encoding/binary"
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

// The fake is a whole Client, but for Delegations, which a Client may
// lack: its files are never delegated. Its Namespace and DirReader are
// in memnames_test.go, its FileData in memfiles_test.go, its Locks and
// UnstableWriter in memhandles_test.go.
var (
	_ fuse.Client     = (*memClient)(nil)
	_ fuse.Session    = (*memClient)(nil)
	_ fuse.Attributes = (*memClient)(nil)
)

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
func (c *memClient) RootFH() []byte              { return fhOf(memRoot) }
func (c *memClient) RSize() int                  { return c.rsize }
func (c *memClient) WSize() int                  { return c.wsize }
func (c *memClient) MaxFileSize() uint64         { return 0 }
func (c *memClient) Abandon()                    {}
func (c *memClient) Close(context.Context) error { return c.send("DESTROY_SESSION") }

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
