package fuse_test

import (
	"context"
	"encoding/binary"
	"sort"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// The fake's names and directories: every change is atomic and returns
// the directory's attributes after it.
var (
	_ fuse.Namespace = (*memClient)(nil)
	_ fuse.DirReader = (*memClient)(nil)
)

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

func (c *memClient) ReadDirAll(ctx context.Context, cred oncrpc.Credential, dir []byte) ([]nfsclient.DirEntry, error) {
	return c.ReadDirPlusAll(ctx, cred, dir)
}
