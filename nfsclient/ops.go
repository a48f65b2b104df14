package nfsclient

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// Each method below sends one COMPOUND shaped like the Linux client's for
// the same system call (SEQUENCE first, then PUTFH and the operation,
// usually with a GETATTR so the caller's attribute cache stays fresh).
// The operations are typed (nfs4_xdr.go, compound.go): each is listed
// once, and decodes its own result.

// GetAttr returns the attributes of fh.
func (c *Client) GetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte) (Attr, error) {
	var a Attr
	err := c.do(ctx, cred, func(cp *compound) {
		cp.putFH(fh)
		cp.getAttr(fileAttrs, &a)
	})
	return a, err
}

// Lookup finds name in directory dir and returns its handle and attributes.
func (c *Client) Lookup(ctx context.Context, cred oncrpc.Credential, dir []byte, name string) ([]byte, Attr, error) {
	var a Attr
	var fh getFHOp
	err := c.do(ctx, cred, func(cp *compound) {
		cp.putFH(dir)
		cp.add(&lookupOp{args: lookup4args{objname: name}}, &fh)
		cp.getAttr(fileAttrs, &a)
	})
	if err != nil {
		return nil, a, err
	}
	return fh.res.object, a, nil
}

// LookupParent returns the handle and attributes of dir's parent.
func (c *Client) LookupParent(ctx context.Context, cred oncrpc.Credential, dir []byte) ([]byte, Attr, error) {
	var a Attr
	var fh getFHOp
	err := c.do(ctx, cred, func(cp *compound) {
		cp.putFH(dir)
		cp.add(&lookupPOp{}, &fh)
		cp.getAttr(fileAttrs, &a)
	})
	if err != nil {
		return nil, a, err
	}
	return fh.res.object, a, nil
}

// Access asks which of the ACCESS bits in mask the caller has on fh.
func (c *Client) Access(ctx context.Context, cred oncrpc.Credential, fh []byte, mask uint32) (granted uint32, err error) {
	op := &accessOp{args: access4args{access: mask}}
	err = c.do(ctx, cred, func(cp *compound) {
		cp.putFH(fh)
		cp.add(op)
	})
	return op.res.access, err
}

// SetAttr changes attributes of fh and returns the new attributes. sid is
// the open stateid for a size change, or the zero StateID.
func (c *Client) SetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, sa *SetAttr) (Attr, error) {
	var a Attr
	err := c.do(ctx, cred, func(cp *compound) {
		cp.putFH(fh)
		cp.add(&setAttrOp{args: setattr4args{stateid: c.sid(cp, sid), objAttributes: sa}})
		cp.getAttr(fileAttrs, &a)
	})
	return a, err
}

// OpenArgs says how to open a file.
type OpenArgs struct {
	Access uint32     // ShareAccessRead, ShareAccessWrite or ShareAccessBoth
	Deny   uint32     // ShareDeny*
	Create CreateMode // NoCreate to open an existing file
	Attr   *SetAttr   // initial attributes for Unchecked, Guarded and Exclusive41
	// Verifier identifies an exclusive create, so a retransmitted OPEN
	// finds the file it made (RFC 8881 s18.16.3).
	Verifier [8]byte
}

// OpenFile is open state on the server: a file handle and its stateid.
type OpenFile struct {
	FH []byte
	// StateID is the open stateid OPEN returned. Pass it on: after a
	// server restart the client sends the reclaimed stateid in its place.
	StateID StateID
	Attr    Attr
	Created bool // the OPEN created the file
	// Dir is what an OPEN that may create did to the directory (the
	// OPEN's change_info4 and the directory's attributes after it).
	Dir DirChange
	// Flags are the OPEN's rflags (RFC 8881 s18.16.4), e.g.
	// OPEN4_RESULT_PRESERVE_UNLINKED (PreserveUnlinked).
	Flags uint32

	st *openState // for reclaim (recovery.go)
}

// PreserveUnlinked reports whether the server keeps the file usable
// through this open after its last link is removed
// (OPEN4_RESULT_PRESERVE_UNLINKED, RFC 8881 s18.16.4); if not, a client
// renames an open file instead of removing it (silly rename).
func (of *OpenFile) PreserveUnlinked() bool { return of.Flags&open4ResultPreserveUnlinked != 0 }

// Open opens (and maybe creates) name in directory dir (CLAIM_NULL).
func (c *Client) Open(ctx context.Context, cred oncrpc.Credential, dir []byte, name string, args OpenArgs) (*OpenFile, error) {
	return c.open(ctx, cred, dir, name, args)
}

// OpenFH opens an existing file by handle (CLAIM_FH, RFC 8881 s18.16).
func (c *Client) OpenFH(ctx context.Context, cred oncrpc.Credential, fh []byte, access, deny uint32) (*OpenFile, error) {
	return c.open(ctx, cred, fh, "", OpenArgs{Access: access, Deny: deny, Create: NoCreate})
}

// openArgs builds OPEN4args (RFC 8881 s18.16.1) for an open by owner.
func openArgs(clientID uint64, owner []byte, access, deny uint32, how openflag4, claim openClaim4) open4args {
	return open4args{shareAccess: access, shareDeny: deny,
		owner: stateOwner4{clientid: clientID, owner: owner}, openhow: how, claim: claim}
}

// createHow is the openflag4 for args.Create.
func createHow(args *OpenArgs) openflag4 {
	if args.Create == NoCreate {
		return openflag4{opentype: open4Nocreate}
	}
	how := createhow4{mode: args.Create}
	switch args.Create {
	case Unchecked, Guarded:
		how.createattrs = args.Attr
	case Exclusive:
		how.createverf = args.Verifier
	case Exclusive41:
		how.cva = creatverfattr{verf: args.Verifier, attrs: args.Attr}
	}
	return openflag4{opentype: open4Create, how: how}
}

func (c *Client) open(ctx context.Context, cred oncrpc.Credential, fh []byte, name string, args OpenArgs) (*OpenFile, error) {
	of := &OpenFile{}
	var owner [16]byte
	copy(owner[:], "rdmafs-o")
	// Each OPEN gets its own open-owner so that closing one FUSE handle
	// never closes another's share reservation.
	binary.BigEndian.PutUint64(owner[8:], c.ownerSeq.Add(1))
	claim := openClaim4{claim: claimNull, file: name}
	if name == "" {
		claim = openClaim4{claim: claimFh}
	}
	// An OPEN that may create changes the directory: its attributes come
	// back in the same COMPOUND (PUTFH dir again, GETATTR).
	postOp := claim.claim == claimNull && args.Create != NoCreate
	access := args.Access
	if !c.cb.wantDeleg() {
		// RFC 8881 s18.16.3: OPEN4_SHARE_ACCESS_WANT_NO_DELEG.
		access |= open4ShareAccessWantNoDeleg
	}
	var open openOp
	var gfh getFHOp
	err := c.do(ctx, cred, func(cp *compound) {
		open.args = openArgs(c.currentClientID(), owner[:], access, args.Deny, createHow(&args), claim)
		cp.putFH(fh)
		cp.add(&open, &gfh)
		cp.getAttr(fileAttrs, &of.Attr)
		if postOp {
			cp.optional()
			cp.putFH(fh)
			cp.getAttr(fileAttrs, &of.Dir.Attr, &of.Dir.AttrOK)
		}
	})
	if err != nil {
		return nil, err
	}
	res := &open.res
	of.FH, of.StateID, of.Flags = gfh.res.object, res.stateid, res.rflags
	of.Dir.setInfo(res.cinfo)
	of.Created = args.Create != NoCreate && res.cinfo.before != res.cinfo.after
	c.trackOpen(of, owner, args.Access, args.Deny, cred)
	if sid, write, ok := res.delegation.granted(); ok {
		c.cb.addDelegation(sid, of.FH, write)
	}
	if args.Create == Exclusive || args.Create == Exclusive41 {
		// RFC 8881 s18.16.4: after an exclusive create, set the attributes
		// the verifier occupied (Exclusive) or that were not set.
		if args.Create == Exclusive && !args.Attr.Empty() {
			if _, err := c.SetAttr(ctx, cred, of.FH, of.StateID, args.Attr); err != nil {
				c.CloseFile(ctx, cred, of)
				return nil, err
			}
		}
	}
	return of, nil
}

// granted returns the delegation an OPEN handed out, if any (RFC 8881
// s18.16.2, open_delegation4): its stateid and whether it is a write
// delegation.
func (d *openDelegation4) granted() (sid StateID, write, ok bool) {
	switch d.delegationType {
	case openDelegateRead:
		return d.read.stateid, false, true
	case openDelegateWrite:
		return d.write.stateid, true, true
	}
	return StateID{}, false, false
}

// CloseFile releases open state (RFC 8881 s18.2). An open lost in a
// server restart has nothing left to close.
func (c *Client) CloseFile(ctx context.Context, cred oncrpc.Credential, of *OpenFile) error {
	defer c.untrackOpen(of)
	if c.OpenLost(of) != nil {
		return nil
	}
	return c.do(ctx, cred, func(cp *compound) {
		cp.putFH(of.FH)
		cp.add(&closeOp{args: close4args{openStateid: c.sid(cp, of.StateID)}})
	})
}

// Read reads up to dest.Len() bytes at off into dest: a view of
// registered memory the transport lent (oncrpc.Lent), or of ordinary
// memory (oncrpc.Plain). The transport places the data in registered
// memory directly (an RDMA Write chunk); into ordinary memory it copies.
func (c *Client) Read(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, off uint64, dest oncrpc.View) (n int, eof bool, err error) {
	var out readOut
	err = c.do(ctx, cred, func(cp *compound) {
		cp.putFH(fh)
		cp.read(c.sid(cp, sid), off, dest, &out)
	})
	return out.n, out.eof, err
}

// ReadInPlace is Read without copying the data out of the reply: data is
// the bytes read, in dest when the transport placed them there (RPC-over-
// RDMA), else in the reply's buffer, which stays the caller's until it
// calls release (nil when there is nothing to give back). dest bounds
// the count, as for Read.
func (c *Client) ReadInPlace(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, off uint64, dest []byte) (data []byte, release func(), eof bool, err error) {
	out := readOut{held: &release}
	err = c.do(ctx, cred, func(cp *compound) {
		cp.putFH(fh)
		cp.read(c.sid(cp, sid), off, oncrpc.Plain(dest), &out)
	})
	if err != nil {
		return nil, nil, false, err
	}
	return out.data, release, out.eof, nil
}

// WriteResult is what a WRITE reports.
type WriteResult struct {
	Count     uint32
	Committed Stable
	Verifier  Verifier
	// Attr is the file's attributes after the WRITE (WriteGetAttr),
	// when AttrOK.
	Attr   Attr
	AttrOK bool
}

func (wr *WriteResult) set(res *write4resok) {
	wr.Count, wr.Committed, wr.Verifier = res.count, res.committed, res.writeverf
}

// Write writes data at off with the given stability. As for Read, from
// a view of registered memory the server takes the data where it is (a
// Read chunk over RDMA); ordinary memory the transport copies.
func (c *Client) Write(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, off uint64, data oncrpc.View, stable Stable) (WriteResult, error) {
	return c.write(ctx, cred, fh, sid, off, data, stable, false)
}

// WriteGetAttr is Write with the file's attributes after it folded into
// the same COMPOUND (PUTFH, WRITE, GETATTR), as the Linux client's WRITE
// asks for them (nfs4_xdr_enc_write) so no GETATTR has to follow.
func (c *Client) WriteGetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, off uint64, data oncrpc.View, stable Stable) (WriteResult, error) {
	return c.write(ctx, cred, fh, sid, off, data, stable, true)
}

func (c *Client) write(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, off uint64, data oncrpc.View, stable Stable, getAttr bool) (WriteResult, error) {
	var wr WriteResult
	var res write4resok
	err := c.do(ctx, cred, func(cp *compound) {
		cp.putFH(fh)
		cp.write(c.sid(cp, sid), off, stable, data, &res)
		if getAttr {
			cp.optional()
			cp.getAttr(fileAttrs, &wr.Attr, &wr.AttrOK)
		}
	})
	wr.set(&res)
	return wr, err
}

// WriteSetAttr sends a WRITE and a SETATTR in one COMPOUND (PUTFH,
// WRITE, SETATTR, GETATTR): buffered data that must reach the server
// before a SETATTR (a utimes after write must not have its mtime moved
// by a later WRITE) goes out with it, one round trip instead of two.
// The server runs the operations in order and stops at the first that
// fails (RFC 8881 s16.2.3), so a failed WRITE leaves the attributes
// unset. sid is the WRITE's stateid, setSID the SETATTR's (see SetAttr).
//
// WriteResult.Count is zero when the WRITE did not succeed; when it did
// and the SETATTR failed, the error is the SETATTR's and the data is
// written. The returned Attr is the file's after both.
func (c *Client) WriteSetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, off uint64, data oncrpc.View, stable Stable, setSID StateID, sa *SetAttr) (WriteResult, Attr, error) {
	var wr WriteResult
	var a Attr
	var res write4resok
	err := c.do(ctx, cred, func(cp *compound) {
		res = write4resok{}
		cp.putFH(fh)
		cp.write(c.sid(cp, sid), off, stable, data, &res)
		cp.add(&setAttrOp{args: setattr4args{stateid: c.sid(cp, setSID), objAttributes: sa}})
		cp.getAttr(fileAttrs, &a, &wr.AttrOK)
	})
	wr.set(&res)
	if wr.AttrOK {
		wr.Attr = a
	}
	return wr, a, err
}

// Commit makes unstable writes in [off, off+count) stable; count 0 means
// to the end of the file. It returns the write verifier.
func (c *Client) Commit(ctx context.Context, cred oncrpc.Credential, fh []byte, off uint64, count uint32) (Verifier, error) {
	op := &commitOp{args: commit4args{offset: off, count: count}}
	err := c.do(ctx, cred, func(cp *compound) {
		cp.putFH(fh)
		cp.add(op)
	})
	return op.res.writeverf, err
}

// Made is an object CREATE made and what that did to its directory.
type Made struct {
	FH   []byte
	Attr Attr
	Dir  DirChange
}

// create makes a non-regular object in dir (RFC 8881 s18.4): PUTFH dir,
// CREATE, GETFH, GETATTR, then PUTFH dir, GETATTR for the directory's
// post-op attributes.
func (c *Client) create(ctx context.Context, cred oncrpc.Credential, dir []byte, name string, kind createtype4, sa *SetAttr) (Made, error) {
	var m Made
	op := &createOp{args: create4args{objtype: kind, objname: name, createattrs: sa}}
	var fh getFHOp
	err := c.do(ctx, cred, func(cp *compound) {
		cp.putFH(dir)
		cp.add(op, &fh)
		cp.getAttr(fileAttrs, &m.Attr)
		cp.optional()
		cp.putFH(dir)
		cp.getAttr(fileAttrs, &m.Dir.Attr, &m.Dir.AttrOK)
	})
	m.FH = fh.res.object
	m.Dir.setInfo(op.res.cinfo)
	return m, err
}

// Mkdir creates directory name in dir.
func (c *Client) Mkdir(ctx context.Context, cred oncrpc.Credential, dir []byte, name string, sa *SetAttr) (Made, error) {
	return c.create(ctx, cred, dir, name, createtype4{objtype: TypeDir}, sa)
}

// Symlink creates a symbolic link name in dir pointing at target.
func (c *Client) Symlink(ctx context.Context, cred oncrpc.Credential, dir []byte, name, target string, sa *SetAttr) (Made, error) {
	return c.create(ctx, cred, dir, name, createtype4{objtype: TypeLnk, linkdata: target}, sa)
}

// Mknod creates a special file (fifo, socket, device) name in dir.
func (c *Client) Mknod(ctx context.Context, cred oncrpc.Credential, dir []byte, name string, typ FileType, major, minor uint32, sa *SetAttr) (Made, error) {
	switch typ {
	case TypeFifo, TypeSock, TypeBlk, TypeChr:
	default:
		return Made{}, fmt.Errorf("mknod: %w", ErrBadType)
	}
	return c.create(ctx, cred, dir, name, createtype4{objtype: typ, devdata: specdata4{major: major, minor: minor}}, sa)
}

// Remove removes name (a file or an empty directory) from dir, with the
// directory's post-op attributes (PUTFH, REMOVE, GETATTR).
func (c *Client) Remove(ctx context.Context, cred oncrpc.Credential, dir []byte, name string) (DirChange, error) {
	var dc DirChange
	op := &removeOp{args: remove4args{target: name}}
	err := c.do(ctx, cred, func(cp *compound) {
		cp.putFH(dir)
		cp.add(op)
		cp.optional()
		cp.getAttr(fileAttrs, &dc.Attr, &dc.AttrOK)
	})
	dc.setInfo(op.res.cinfo)
	return dc, err
}

// Rename moves srcDir/srcName to dstDir/dstName, replacing a target that
// exists where POSIX allows. It returns what the move did to each
// directory (PUTFH src, SAVEFH, PUTFH dst, RENAME, GETATTR, RESTOREFH,
// GETATTR, as Linux's nfs4_xdr_enc_rename did).
func (c *Client) Rename(ctx context.Context, cred oncrpc.Credential, srcDir []byte, srcName string, dstDir []byte, dstName string) (src, dst DirChange, err error) {
	op := &renameOp{args: rename4args{oldname: srcName, newname: dstName}}
	err = c.do(ctx, cred, func(cp *compound) {
		cp.putFH(srcDir)
		cp.saveFH()
		cp.putFH(dstDir)
		cp.add(op)
		cp.optional()
		cp.getAttr(fileAttrs, &dst.Attr, &dst.AttrOK)
		cp.restoreFH()
		cp.getAttr(fileAttrs, &src.Attr, &src.AttrOK)
	})
	src.setInfo(op.res.sourceCinfo)
	dst.setInfo(op.res.targetCinfo)
	return src, dst, err
}

// Link makes a hard link dir/name to the file fh and returns its new
// attributes (the link count changed) and what the link did to dir.
func (c *Client) Link(ctx context.Context, cred oncrpc.Credential, fh, dir []byte, name string) (Attr, DirChange, error) {
	var a Attr
	var dc DirChange
	op := &linkOp{args: link4args{newname: name}}
	err := c.do(ctx, cred, func(cp *compound) {
		cp.putFH(fh)
		cp.saveFH()
		cp.putFH(dir)
		cp.add(op)
		cp.restoreFH()
		cp.getAttr(fileAttrs, &a)
		cp.optional()
		cp.putFH(dir)
		cp.getAttr(fileAttrs, &dc.Attr, &dc.AttrOK)
	})
	dc.setInfo(op.res.cinfo)
	return a, dc, err
}

// Readlink returns the target of the symbolic link fh.
func (c *Client) Readlink(ctx context.Context, cred oncrpc.Credential, fh []byte) (string, error) {
	op := &readLinkOp{}
	err := c.do(ctx, cred, func(cp *compound) {
		cp.putFH(fh)
		cp.add(op)
	})
	return op.res.link, err
}

// ReadDirPage is one READDIR reply.
type ReadDirPage struct {
	Entries []DirEntry
	Verf    [8]byte
	EOF     bool
}

// dirAttrs are the attributes READDIR asks for per entry, enough for
// readdirplus without a GETATTR per entry.
var dirAttrs = func() Bitmap {
	b := fileAttrs
	b[attrRdattrError/32] |= 1 << (attrRdattrError % 32)
	return b
}()

// ReadDir reads one page of directory entries after cookie. maxBytes
// bounds the reply (maxcount); 0 means 32 KiB.
func (c *Client) ReadDir(ctx context.Context, cred oncrpc.Credential, dir []byte, cookie uint64, verf [8]byte, maxBytes int) (ReadDirPage, error) {
	return c.readDir(ctx, cred, dir, cookie, verf, max(maxBytes, 0), 32<<10, dirAttrs)
}

// ReadDirAll reads a whole directory.
func (c *Client) ReadDirAll(ctx context.Context, cred oncrpc.Credential, dir []byte) ([]DirEntry, error) {
	return c.readDirAll(ctx, cred, dir, c.ReadDir)
}

// readDir sends one READDIR (RFC 8881 s18.23) asking for mask per entry;
// maxBytes 0 means def.
func (c *Client) readDir(ctx context.Context, cred oncrpc.Credential, dir []byte, cookie uint64, verf [8]byte, maxBytes, def int, mask Bitmap) (ReadDirPage, error) {
	if maxBytes <= 0 {
		maxBytes = def
	}
	maxBytes = min(maxBytes, c.rsize)
	op := &readDirOp{args: readdir4args{cookie: cookie, cookieverf: verf,
		dircount: uint32(maxBytes), maxcount: uint32(maxBytes), attrRequest: mask}}
	err := c.do(ctx, cred, func(cp *compound) {
		op.entries = op.entries[:0]
		cp.putFH(dir)
		cp.add(op)
	})
	return ReadDirPage{Entries: op.entries, Verf: op.verf, EOF: op.eof}, err
}

// StatFS returns the file system attributes of fh's file system.
func (c *Client) StatFS(ctx context.Context, cred oncrpc.Credential, fh []byte) (Attr, error) {
	var a Attr
	err := c.do(ctx, cred, func(cp *compound) {
		cp.putFH(fh)
		cp.getAttr(fsAttrs, &a)
	})
	return a, err
}

// SecInfoNoName returns the security flavors the server accepts for the
// export root (RFC 8881 s18.45).
func (c *Client) SecInfoNoName(ctx context.Context) ([]uint32, error) {
	op := &secInfoNoNameOp{args: secinfoNoName4args{style: secinfoStyle4CurrentFh}}
	err := c.do(ctx, c.sysCred, func(cp *compound) {
		cp.putFH(c.rootFH)
		cp.add(op)
	})
	var flavors []uint32
	for _, f := range op.res.flavors {
		flavors = append(flavors, f.flavor)
	}
	return flavors, err
}
