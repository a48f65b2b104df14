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

// putFHAnd returns a builder that sets the current file handle to fh and
// then adds what build adds: most compounds start that way after SEQUENCE.
func putFHAnd(fh []byte, build func(cp *compound)) func(cp *compound) {
	return func(cp *compound) {
		cp.putFH(fh)
		build(cp)
	}
}

// GetAttr returns the attributes of fh.
func (c *Client) GetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte) (Attr, error) {
	var a Attr
	err := c.do(ctx, cred, putFHAnd(fh, func(cp *compound) { cp.getAttr(fileAttrs) }),
		func(r *results) error {
			if err := r.voidOp(opPutFH); err != nil {
				return err
			}
			return r.decodeGetAttr(&a)
		})
	return a, err
}

// Lookup finds name in directory dir and returns its handle and attributes.
func (c *Client) Lookup(ctx context.Context, cred oncrpc.Credential, dir []byte, name string) ([]byte, Attr, error) {
	var a Attr
	var fh []byte
	err := c.do(ctx, cred, putFHAnd(dir, func(cp *compound) {
		cp.lookup(name)
		cp.getFH()
		cp.getAttr(fileAttrs)
	}), func(r *results) (err error) {
		if err := r.voidOp(opPutFH); err != nil {
			return err
		}
		if err := r.voidOp(opLookup); err != nil {
			return err
		}
		if fh, err = r.decodeGetFH(); err != nil {
			return err
		}
		return r.decodeGetAttr(&a)
	})
	return fh, a, err
}

// LookupParent returns the handle and attributes of dir's parent.
func (c *Client) LookupParent(ctx context.Context, cred oncrpc.Credential, dir []byte) ([]byte, Attr, error) {
	var a Attr
	var fh []byte
	err := c.do(ctx, cred, putFHAnd(dir, func(cp *compound) {
		cp.lookupP()
		cp.getFH()
		cp.getAttr(fileAttrs)
	}), func(r *results) (err error) {
		if err := r.voidOp(opPutFH); err != nil {
			return err
		}
		if err := r.voidOp(opLookupP); err != nil {
			return err
		}
		if fh, err = r.decodeGetFH(); err != nil {
			return err
		}
		return r.decodeGetAttr(&a)
	})
	return fh, a, err
}

// Access asks which of the ACCESS bits in mask the caller has on fh.
func (c *Client) Access(ctx context.Context, cred oncrpc.Credential, fh []byte, mask uint32) (granted uint32, err error) {
	err = c.do(ctx, cred, putFHAnd(fh, func(cp *compound) { cp.access(mask) }),
		func(r *results) error {
			if err := r.voidOp(opPutFH); err != nil {
				return err
			}
			_, granted, err = r.decodeAccess()
			return err
		})
	return granted, err
}

// SetAttr changes attributes of fh and returns the new attributes. sid is
// the open stateid for a size change, or the zero StateID.
func (c *Client) SetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, sa *SetAttr) (Attr, error) {
	var a Attr
	err := c.do(ctx, cred, putFHAnd(fh, func(cp *compound) {
		cp.setAttr(c.sid(cp, sid), sa)
		cp.getAttr(fileAttrs)
	}), func(r *results) error {
		if err := r.voidOp(opPutFH); err != nil {
			return err
		}
		if err := r.decodeSetAttr(); err != nil {
			return err
		}
		return r.decodeGetAttr(&a)
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

	st *openState // for reclaim (recovery.go)
}

// Open opens (and maybe creates) name in directory dir (CLAIM_NULL).
func (c *Client) Open(ctx context.Context, cred oncrpc.Credential, dir []byte, name string, args OpenArgs) (*OpenFile, error) {
	return c.open(ctx, cred, dir, name, args)
}

// OpenFH opens an existing file by handle (CLAIM_FH, RFC 8881 s18.16).
func (c *Client) OpenFH(ctx context.Context, cred oncrpc.Credential, fh []byte, access, deny uint32) (*OpenFile, error) {
	return c.open(ctx, cred, fh, "", OpenArgs{Access: access, Deny: deny, Create: NoCreate})
}

func (c *Client) open(ctx context.Context, cred oncrpc.Credential, fh []byte, name string, args OpenArgs) (*OpenFile, error) {
	of := &OpenFile{}
	var owner [16]byte
	copy(owner[:], "rdmafs-o")
	// Each OPEN gets its own open-owner so that closing one FUSE handle
	// never closes another's share reservation.
	binary.BigEndian.PutUint64(owner[8:], c.ownerSeq.Add(1))
	claimFH := name == ""
	// An OPEN that may create changes the directory: its attributes come
	// back in the same COMPOUND (PUTFH dir again, GETATTR).
	postOp := !claimFH && args.Create != NoCreate
	var deleg StateID
	var gotDeleg, writeDeleg bool
	wantDeleg := c.cb.wantDeleg()
	err := c.do(ctx, cred, putFHAnd(fh, func(cp *compound) {
		cp.op(opOpen)
		cp.e.Uint32(0) // seqid, ignored in 4.1
		access := args.Access
		if !wantDeleg {
			// RFC 8881 s18.16.3: OPEN4_SHARE_ACCESS_WANT_NO_DELEG.
			access |= shareAccessWantNoDeleg
		}
		cp.e.Uint32(access)
		cp.e.Uint32(args.Deny)
		cp.e.Uint64(c.currentClientID())
		cp.e.Opaque(owner[:])
		if args.Create == NoCreate {
			cp.e.Uint32(open4NoCreate)
		} else {
			cp.e.Uint32(open4Create)
			cp.e.Uint32(uint32(args.Create))
			switch args.Create {
			case Unchecked, Guarded:
				args.Attr.encode(&cp.e)
			case Exclusive:
				cp.e.FixedOpaque(args.Verifier[:])
			case Exclusive41:
				cp.e.FixedOpaque(args.Verifier[:])
				args.Attr.encode(&cp.e)
			}
		}
		if claimFH {
			cp.e.Uint32(openClaimFH)
		} else {
			cp.e.Uint32(openClaimNull)
			cp.e.String(name)
		}
		cp.getFH()
		cp.getAttr(fileAttrs)
		if postOp {
			cp.putFH(fh)
			cp.getAttr(fileAttrs)
		}
	}), func(r *results) (err error) {
		if err := r.voidOp(opPutFH); err != nil {
			return err
		}
		if err := r.next(opOpen); err != nil {
			return err
		}
		d := &r.d
		of.StateID = decodeStateID(d)
		ci := decodeChangeInfo(d)
		of.Dir.setInfo(ci)
		d.Uint32() // rflags
		of.Created = args.Create != NoCreate && ci.Before != ci.After
		attrset := decodeBitmap(d)
		_ = attrset
		gotDeleg, writeDeleg, deleg = decodeDelegation(r)
		if err := r.check(opOpen); err != nil {
			return err
		}
		if of.FH, err = r.decodeGetFH(); err != nil {
			return err
		}
		if err := r.decodeGetAttr(&of.Attr); err != nil {
			return err
		}
		if postOp && r.voidOp(opPutFH) == nil {
			of.Dir.AttrOK = r.decodePostOpAttr(&of.Dir.Attr)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	c.trackOpen(of, owner, args.Access, args.Deny, cred)
	if gotDeleg {
		c.cb.addDelegation(deleg, of.FH, writeDeleg)
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

// decodeDelegation decodes an open_delegation4 (RFC 8881 s18.16.2): was
// one granted, is it a write delegation, its stateid.
func decodeDelegation(r *results) (bool, bool, StateID) {
	d := &r.d
	switch t := d.Uint32(); t {
	case openDelegateNone:
		return false, false, StateID{}
	case openDelegateNoneExt:
		if why := d.Uint32(); why == 3 || why == 4 { // WND4_CONTENTION, WND4_RESOURCE
			d.Bool()
		}
		return false, false, StateID{}
	case openDelegateRead, openDelegateWrite:
		sid := decodeStateID(d)
		d.Bool() // recall
		if t == openDelegateWrite {
			// nfs_space_limit4: limitby then 8 (size) or 2x4 (blocks)
			if lb := d.Uint32(); lb == 1 {
				d.Uint64()
			} else {
				d.Uint32()
				d.Uint32()
			}
		}
		// nfsace4 permissions: type, flag, access_mask, who
		d.Uint32()
		d.Uint32()
		d.Uint32()
		d.Opaque(maxOwnerLen)
		return true, t == openDelegateWrite, sid
	default:
		d.SetErr(fmt.Errorf("delegation type %d", t))
		return false, false, StateID{}
	}
}

// CloseFile releases open state (RFC 8881 s18.2). An open lost in a
// server restart has nothing left to close.
func (c *Client) CloseFile(ctx context.Context, cred oncrpc.Credential, of *OpenFile) error {
	defer c.untrackOpen(of)
	if c.OpenLost(of) != nil {
		return nil
	}
	return c.do(ctx, cred, putFHAnd(of.FH, func(cp *compound) { cp.close(c.sid(cp, of.StateID)) }),
		func(r *results) error {
			if err := r.voidOp(opPutFH); err != nil {
				return err
			}
			return r.decodeClose()
		})
}

// Read reads up to len(dest) bytes at off into dest. The data goes into
// dest directly where the transport can place it (RDMA Write chunk).
func (c *Client) Read(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, off uint64, dest []byte) (n int, eof bool, err error) {
	err = c.do(ctx, cred, putFHAnd(fh, func(cp *compound) { cp.read(c.sid(cp, sid), off, dest) }),
		func(r *results) error {
			if err := r.voidOp(opPutFH); err != nil {
				return err
			}
			n, eof, err = r.decodeRead()
			return err
		})
	return n, eof, err
}

// ReadInPlace is Read without copying the data out of the reply: data is
// the bytes read, in dest when the transport placed them there (RPC-over-
// RDMA), else in the reply's buffer, which stays the caller's until it
// calls release (nil when there is nothing to give back). dest bounds
// the count, as for Read.
func (c *Client) ReadInPlace(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, off uint64, dest []byte) (data []byte, release func(), eof bool, err error) {
	err = c.do(ctx, cred, putFHAnd(fh, func(cp *compound) { cp.read(c.sid(cp, sid), off, dest) }),
		func(r *results) error {
			if err := r.voidOp(opPutFH); err != nil {
				return err
			}
			data, eof, err = r.decodeReadInPlace(&release)
			return err
		})
	if err != nil {
		return nil, nil, false, err
	}
	return data, release, eof, nil
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

// Write writes data at off with the given stability. data is sent
// without copying (a Read chunk over RDMA).
func (c *Client) Write(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, off uint64, data []byte, stable Stable) (WriteResult, error) {
	return c.write(ctx, cred, fh, sid, off, data, stable, false)
}

// WriteGetAttr is Write with the file's attributes after it folded into
// the same COMPOUND (PUTFH, WRITE, GETATTR), as the Linux client's WRITE
// asks for them (nfs4_xdr_enc_write) so no GETATTR has to follow.
func (c *Client) WriteGetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, off uint64, data []byte, stable Stable) (WriteResult, error) {
	return c.write(ctx, cred, fh, sid, off, data, stable, true)
}

func (c *Client) write(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, off uint64, data []byte, stable Stable, getAttr bool) (WriteResult, error) {
	var wr WriteResult
	err := c.do(ctx, cred, putFHAnd(fh, func(cp *compound) {
		cp.write(c.sid(cp, sid), off, stable, data)
		if getAttr {
			cp.getAttr(fileAttrs)
		}
	}), func(r *results) (err error) {
		if err := r.voidOp(opPutFH); err != nil {
			return err
		}
		wr.Count, wr.Committed, wr.Verifier, err = r.decodeWrite()
		if err == nil && int(wr.Count) > len(data) {
			return fmt.Errorf("%w: WRITE of %d bytes reports %d written", ErrProtocol, len(data), wr.Count)
		}
		if err == nil && getAttr {
			wr.AttrOK = r.decodePostOpAttr(&wr.Attr)
		}
		return err
	})
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
func (c *Client) WriteSetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte, sid StateID, off uint64, data []byte, stable Stable, setSID StateID, sa *SetAttr) (WriteResult, Attr, error) {
	var wr WriteResult
	var a Attr
	err := c.do(ctx, cred, putFHAnd(fh, func(cp *compound) {
		cp.write(c.sid(cp, sid), off, stable, data)
		cp.setAttr(c.sid(cp, setSID), sa)
		cp.getAttr(fileAttrs)
	}), func(r *results) (err error) {
		wr = WriteResult{}
		if err := r.voidOp(opPutFH); err != nil {
			return err
		}
		n, committed, verf, err := r.decodeWrite()
		if err != nil {
			return err
		}
		if int(n) > len(data) {
			return fmt.Errorf("%w: WRITE of %d bytes reports %d written", ErrProtocol, len(data), n)
		}
		wr.Count, wr.Committed, wr.Verifier = n, committed, verf
		if err := r.decodeSetAttr(); err != nil {
			return err
		}
		if err := r.decodeGetAttr(&a); err != nil {
			return err
		}
		wr.Attr, wr.AttrOK = a, true
		return nil
	})
	return wr, a, err
}

// Commit makes unstable writes in [off, off+count) stable; count 0 means
// to the end of the file. It returns the write verifier.
func (c *Client) Commit(ctx context.Context, cred oncrpc.Credential, fh []byte, off uint64, count uint32) (Verifier, error) {
	var v Verifier
	err := c.do(ctx, cred, putFHAnd(fh, func(cp *compound) { cp.commit(off, count) }),
		func(r *results) (err error) {
			if err := r.voidOp(opPutFH); err != nil {
				return err
			}
			v, err = r.decodeCommit()
			return err
		})
	return v, err
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
func (c *Client) create(ctx context.Context, cred oncrpc.Credential, dir []byte, name string, kind createKind, sa *SetAttr) (Made, error) {
	var m Made
	err := c.do(ctx, cred, putFHAnd(dir, func(cp *compound) {
		cp.create(kind, name, sa)
		cp.getFH()
		cp.getAttr(fileAttrs)
		cp.putFH(dir)
		cp.getAttr(fileAttrs)
	}), func(r *results) (err error) {
		if err := r.voidOp(opPutFH); err != nil {
			return err
		}
		ci, err := r.decodeCreate()
		if err != nil {
			return err
		}
		m.Dir.setInfo(ci)
		if m.FH, err = r.decodeGetFH(); err != nil {
			return err
		}
		if err := r.decodeGetAttr(&m.Attr); err != nil {
			return err
		}
		if r.voidOp(opPutFH) == nil {
			m.Dir.AttrOK = r.decodePostOpAttr(&m.Dir.Attr)
		}
		return nil
	})
	return m, err
}

// Mkdir creates directory name in dir.
func (c *Client) Mkdir(ctx context.Context, cred oncrpc.Credential, dir []byte, name string, sa *SetAttr) (Made, error) {
	return c.create(ctx, cred, dir, name, createKind{Type: TypeDir}, sa)
}

// Symlink creates a symbolic link name in dir pointing at target.
func (c *Client) Symlink(ctx context.Context, cred oncrpc.Credential, dir []byte, name, target string, sa *SetAttr) (Made, error) {
	return c.create(ctx, cred, dir, name, createKind{Type: TypeLnk, LinkData: target}, sa)
}

// Mknod creates a special file (fifo, socket, device) name in dir.
func (c *Client) Mknod(ctx context.Context, cred oncrpc.Credential, dir []byte, name string, typ FileType, major, minor uint32, sa *SetAttr) (Made, error) {
	switch typ {
	case TypeFifo, TypeSock, TypeBlk, TypeChr:
	default:
		return Made{}, fmt.Errorf("mknod: %w", ErrBadType)
	}
	return c.create(ctx, cred, dir, name, createKind{Type: typ, Major: major, Minor: minor}, sa)
}

// Remove removes name (a file or an empty directory) from dir, with the
// directory's post-op attributes (PUTFH, REMOVE, GETATTR).
func (c *Client) Remove(ctx context.Context, cred oncrpc.Credential, dir []byte, name string) (DirChange, error) {
	var dc DirChange
	err := c.do(ctx, cred, putFHAnd(dir, func(cp *compound) {
		cp.remove(name)
		cp.getAttr(fileAttrs)
	}), func(r *results) error {
		if err := r.voidOp(opPutFH); err != nil {
			return err
		}
		ci, _, err := r.decodeChangeOp(opRemove)
		if err != nil {
			return err
		}
		dc.setInfo(ci)
		dc.AttrOK = r.decodePostOpAttr(&dc.Attr)
		return nil
	})
	return dc, err
}

// Rename moves srcDir/srcName to dstDir/dstName, replacing a target that
// exists where POSIX allows. It returns what the move did to each
// directory (PUTFH src, SAVEFH, PUTFH dst, RENAME, GETATTR, RESTOREFH,
// GETATTR, as Linux's nfs4_xdr_enc_rename did).
func (c *Client) Rename(ctx context.Context, cred oncrpc.Credential, srcDir []byte, srcName string, dstDir []byte, dstName string) (src, dst DirChange, err error) {
	err = c.do(ctx, cred, func(cp *compound) {
		cp.putFH(srcDir)
		cp.saveFH()
		cp.putFH(dstDir)
		cp.rename(srcName, dstName)
		cp.getAttr(fileAttrs)
		cp.restoreFH()
		cp.getAttr(fileAttrs)
	}, func(r *results) error {
		for _, op := range []uint32{opPutFH, opSaveFH, opPutFH} {
			if err := r.voidOp(op); err != nil {
				return err
			}
		}
		sci, dci, err := r.decodeChangeOp(opRename)
		if err != nil {
			return err
		}
		src.setInfo(sci)
		dst.setInfo(dci)
		dst.AttrOK = r.decodePostOpAttr(&dst.Attr)
		if dst.AttrOK && r.voidOp(opRestoreFH) == nil {
			src.AttrOK = r.decodePostOpAttr(&src.Attr)
		}
		return nil
	})
	return src, dst, err
}

// Link makes a hard link dir/name to the file fh and returns its new
// attributes (the link count changed) and what the link did to dir.
func (c *Client) Link(ctx context.Context, cred oncrpc.Credential, fh, dir []byte, name string) (Attr, DirChange, error) {
	var a Attr
	var dc DirChange
	err := c.do(ctx, cred, func(cp *compound) {
		cp.putFH(fh)
		cp.saveFH()
		cp.putFH(dir)
		cp.link(name)
		cp.restoreFH()
		cp.getAttr(fileAttrs)
		cp.putFH(dir)
		cp.getAttr(fileAttrs)
	}, func(r *results) error {
		for _, op := range []uint32{opPutFH, opSaveFH, opPutFH} {
			if err := r.voidOp(op); err != nil {
				return err
			}
		}
		ci, _, err := r.decodeChangeOp(opLink)
		if err != nil {
			return err
		}
		dc.setInfo(ci)
		if err := r.voidOp(opRestoreFH); err != nil {
			return err
		}
		if err := r.decodeGetAttr(&a); err != nil {
			return err
		}
		if r.voidOp(opPutFH) == nil {
			dc.AttrOK = r.decodePostOpAttr(&dc.Attr)
		}
		return nil
	})
	return a, dc, err
}

// Readlink returns the target of the symbolic link fh.
func (c *Client) Readlink(ctx context.Context, cred oncrpc.Credential, fh []byte) (string, error) {
	var target string
	err := c.do(ctx, cred, putFHAnd(fh, func(cp *compound) { cp.readLink() }),
		func(r *results) (err error) {
			if err := r.voidOp(opPutFH); err != nil {
				return err
			}
			target, err = r.decodeReadLink()
			return err
		})
	return target, err
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
	var p ReadDirPage
	err := c.do(ctx, cred, putFHAnd(dir, func(cp *compound) {
		cp.readdir(cookie, verf, uint32(maxBytes), uint32(maxBytes), mask)
	}), func(r *results) (err error) {
		if err := r.voidOp(opPutFH); err != nil {
			return err
		}
		p.Entries, p.Verf, p.EOF, err = r.decodeReadDir(nil)
		return err
	})
	return p, err
}

type readDirFunc func(ctx context.Context, cred oncrpc.Credential, dir []byte, cookie uint64, verf [8]byte, maxBytes int) (ReadDirPage, error)

// readDirAll reads pages with page until the server says EOF.
func (c *Client) readDirAll(ctx context.Context, cred oncrpc.Credential, dir []byte, page readDirFunc) ([]DirEntry, error) {
	var all []DirEntry
	var cookie uint64
	var verf [8]byte
	for {
		p, err := page(ctx, cred, dir, cookie, verf, 0)
		if err != nil {
			return all, err
		}
		all = append(all, p.Entries...)
		if p.EOF {
			return all, nil
		}
		if len(p.Entries) == 0 {
			return all, fmt.Errorf("%w: READDIR returned no entries and no EOF", ErrProtocol)
		}
		cookie, verf = p.Entries[len(p.Entries)-1].Cookie, p.Verf
	}
}

// StatFS returns the file system attributes of fh's file system.
func (c *Client) StatFS(ctx context.Context, cred oncrpc.Credential, fh []byte) (Attr, error) {
	var a Attr
	err := c.do(ctx, cred, putFHAnd(fh, func(cp *compound) { cp.getAttr(fsAttrs) }),
		func(r *results) error {
			if err := r.voidOp(opPutFH); err != nil {
				return err
			}
			return r.decodeGetAttr(&a)
		})
	return a, err
}

// SecInfoNoName returns the security flavors the server accepts for the
// export root (RFC 8881 s18.45).
func (c *Client) SecInfoNoName(ctx context.Context) ([]uint32, error) {
	var flavors []uint32
	err := c.do(ctx, c.sysCred, putFHAnd(c.rootFH, func(cp *compound) { cp.secInfoNoName() }),
		func(r *results) (err error) {
			if err := r.voidOp(opPutFH); err != nil {
				return err
			}
			flavors, err = r.decodeSecInfo()
			return err
		})
	return flavors, err
}
