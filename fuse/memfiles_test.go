package fuse_test

import (
	"context"
	"encoding/binary"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// The fake's open state and file data: OPEN state is counted until
// CLOSE (openStates), and writes are stable at once.
var _ fuse.FileData = (*memClient)(nil)

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
