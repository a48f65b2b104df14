package nfsclient

import (
	"fmt"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// StateID is an NFSv4 stateid4 (RFC 8881 s8.2).
type StateID struct {
	Seq   uint32
	Other [12]byte
}

// Decoding limits: generous bounds that no real server reaches.
const (
	maxTagLen      = 1024
	maxNameLen     = 4096
	maxCompoundOps = 64
)

func (s StateID) encode(e *xdr.Encoder) {
	e.Uint32(s.Seq)
	e.FixedOpaque(s.Other[:])
}

func decodeStateID(d *xdr.Decoder) StateID {
	var s StateID
	s.Seq = d.Uint32()
	copy(s.Other[:], d.FixedOpaque(12))
	return s
}

// compound builds the arguments of one COMPOUND request (RFC 8881
// s16.2.3) behind the RPC header, and remembers the operation list so
// the reply can be checked against it.
type compound struct {
	e      xdr.Encoder
	xid    uint32
	numAt  int
	ops    []uint32
	bulk   []byte // WRITE data, sent between Head and Tail
	split  int    // where bulk goes in e; valid when bulk != nil
	dest   []byte // READ/READLINK destination
	maxRep int    // estimated reply size beyond dest

	// cacheThis asks the server to keep the reply in the slot's replay
	// cache; set for compounds that are not idempotent, so a
	// retransmission after a lost reply gets the original result (RFC
	// 8881 s2.10.6.1.3). cacheAt is where SEQUENCE's sa_cachethis is.
	cacheThis bool
	cacheAt   int

	// err, set by a builder, stops the compound before it is sent (an
	// open lost in a server restart).
	err error

	rpcCall oncrpc.Call // returned by call, reused to keep the hot path allocation-free
}

func (c *compound) reset(rpc *oncrpc.Client, cred oncrpc.Credential, tag string) {
	c.e.Reset(c.e.Bytes())
	c.ops = c.ops[:0]
	c.bulk, c.dest, c.maxRep = nil, nil, 0
	c.cacheThis, c.cacheAt = false, 0
	c.err = nil
	c.xid = rpc.StartCall(&c.e, procCompound, cred)
	c.e.String(tag)
	c.e.Uint32(minorVersion1)
	c.numAt = c.e.Reserve(4)
}

func (c *compound) op(code uint32) {
	switch code {
	case opOpen, opClose, opCreate, opRemove, opRename, opLink, opSetAttr, opDelegReturn, opReclaimComplete:
		c.cacheThis = true
	}
	c.ops = append(c.ops, code)
	c.e.Uint32(code)
	c.maxRep += 128 // per-op result overhead, generous for small results
}

// call returns the RPC call in its parts.
func (c *compound) call() *oncrpc.Call {
	c.e.PutUint32At(c.numAt, uint32(len(c.ops)))
	if c.cacheThis && c.cacheAt > 0 {
		c.e.PutUint32At(c.cacheAt, 1)
	}
	b := c.e.Bytes()
	c.rpcCall = oncrpc.Call{XID: c.xid, Head: b, ReplyBulk: c.dest, MaxReplySize: c.maxRep + 256}
	if c.bulk != nil {
		c.rpcCall.Head, c.rpcCall.Bulk, c.rpcCall.Tail = b[:c.split], c.bulk, b[c.split:]
	}
	return &c.rpcCall
}

// results walks a COMPOUND reply (RFC 8881 s16.2.3, COMPOUND4res).
type results struct {
	d      xdr.Decoder
	ops    []uint32
	nres   int
	i      int
	status Status
	placed bool   // READ data was placed by the transport in dest
	nplace int    // how many bytes it placed
	dest   []byte // READ/READLINK destination
	copied int    // READ data bytes copied from the reply into dest
	// held, set by a parse that returns slices of the reply, receives
	// the reply's release once the parse succeeded (Client.do).
	held *func()
}

func (r *results) init(c *compound, rep *oncrpc.Reply) error {
	r.d.Reset(rep.Results)
	r.ops, r.i, r.placed, r.nplace, r.dest, r.copied, r.held = c.ops, 0, rep.BulkPlaced, rep.BulkLen, c.dest, 0, nil
	r.status = Status(r.d.Uint32())
	r.d.Opaque(maxTagLen)
	r.nres = r.d.Length(maxCompoundOps)
	if err := r.d.Err(); err != nil {
		return fmt.Errorf("%w: COMPOUND reply header: %w", ErrProtocol, err)
	}
	if r.nres > len(r.ops) {
		return fmt.Errorf("%w: %d results for %d operations", ErrProtocol, r.nres, len(r.ops))
	}
	if r.nres < len(r.ops) && r.status == StatusOK {
		return fmt.Errorf("%w: %d results for %d operations with status OK", ErrProtocol, r.nres, len(r.ops))
	}
	return nil
}

// next reads the header of the next result, which must be for op. It
// returns an *OpError when the operation failed; the result body of a
// failed operation is void except where the caller decodes it.
func (r *results) next(op uint32) error {
	if r.i >= len(r.ops) || r.ops[r.i] != op {
		return fmt.Errorf("%w: decoder out of step at result %d", ErrProtocol, r.i)
	}
	if r.i >= r.nres {
		// The server stopped before this op; the last result failed.
		return &OpError{Op: opName(op), Status: r.status}
	}
	r.i++
	got := r.d.Uint32()
	st := Status(r.d.Uint32())
	if err := r.d.Err(); err != nil {
		return fmt.Errorf("%w: %s result: %w", ErrProtocol, opName(op), err)
	}
	if got != op {
		return fmt.Errorf("%w: result %d is %s, want %s", ErrProtocol, r.i-1, opName(got), opName(op))
	}
	if st != StatusOK {
		return &OpError{Op: opName(op), Status: st}
	}
	return nil
}

// check turns a decoding error into a protocol error for op.
func (r *results) check(op uint32) error {
	if err := r.d.Err(); err != nil {
		return fmt.Errorf("%w: %s result: %w", ErrProtocol, opName(op), err)
	}
	return nil
}

// Operation encoders (RFC 8881 s18) and their result decoders. Each
// decodeX reads the header with next and then the op's resok body.

func (c *compound) putFH(fh []byte) {
	c.op(opPutFH)
	c.e.Opaque(fh)
}

func (c *compound) putRootFH() { c.op(opPutRootFH) }
func (c *compound) getFH()     { c.op(opGetFH) }
func (c *compound) saveFH()    { c.op(opSaveFH) }
func (c *compound) restoreFH() { c.op(opRestoreFH) }
func (c *compound) lookupP()   { c.op(opLookupP) }

func (c *compound) lookup(name string) {
	c.op(opLookup)
	c.e.String(name)
}

func (c *compound) getAttr(mask Bitmap) {
	c.op(opGetAttr)
	mask.encode(&c.e)
	c.maxRep += 512
}

func (r *results) voidOp(op uint32) error { return r.next(op) }

func (r *results) decodeGetFH() ([]byte, error) {
	if err := r.next(opGetFH); err != nil {
		return nil, err
	}
	fh := r.d.Opaque(maxFHSize)
	if err := r.check(opGetFH); err != nil {
		return nil, err
	}
	return append([]byte(nil), fh...), nil
}

func (r *results) decodeGetAttr(a *Attr) error {
	if err := r.next(opGetAttr); err != nil {
		return err
	}
	decodeFattr(&r.d, a)
	return r.check(opGetAttr)
}

func (c *compound) access(mask uint32) {
	c.op(opAccess)
	c.e.Uint32(mask)
}

func (r *results) decodeAccess() (supported, granted uint32, err error) {
	if err := r.next(opAccess); err != nil {
		return 0, 0, err
	}
	supported, granted = r.d.Uint32(), r.d.Uint32()
	return supported, granted, r.check(opAccess)
}

func (c *compound) setAttr(sid StateID, sa *SetAttr) {
	c.op(opSetAttr)
	sid.encode(&c.e)
	sa.encode(&c.e)
}

// decodeSetAttr reads a SETATTR result; attrsset follows the status on
// success and failure alike (RFC 8881 s18.30.2).
func (r *results) decodeSetAttr() error {
	err := r.next(opSetAttr)
	if _, ok := err.(*OpError); err != nil && !ok {
		return err
	}
	if r.i <= r.nres {
		decodeBitmap(&r.d)
		if cerr := r.check(opSetAttr); cerr != nil {
			return cerr
		}
	}
	return err
}

// changeInfo is a change_info4 (RFC 8881 s3.3.12).
type changeInfo struct {
	Atomic        bool
	Before, After uint64
}

func decodeChangeInfo(d *xdr.Decoder) changeInfo {
	return changeInfo{Atomic: d.Bool(), Before: d.Uint64(), After: d.Uint64()}
}

func (c *compound) remove(name string) {
	c.op(opRemove)
	c.e.String(name)
}

// decodeChangeOp decodes REMOVE, LINK or RENAME: the directory's
// change_info4, and for RENAME the source's then the target's
// (RFC 8881 s18.26.2).
func (r *results) decodeChangeOp(op uint32) (ci, ci2 changeInfo, err error) {
	if err := r.next(op); err != nil {
		return ci, ci2, err
	}
	ci = decodeChangeInfo(&r.d)
	if op == opRename {
		ci2 = decodeChangeInfo(&r.d)
	}
	return ci, ci2, r.check(op)
}

func (c *compound) rename(oldName, newName string) {
	c.op(opRename)
	c.e.String(oldName)
	c.e.String(newName)
}

func (c *compound) link(name string) {
	c.op(opLink)
	c.e.String(name)
}

func (c *compound) readLink() { c.op(opReadLink) }

func (r *results) decodeReadLink() (string, error) {
	if err := r.next(opReadLink); err != nil {
		return "", err
	}
	s := r.d.String(maxNameLen)
	return s, r.check(opReadLink)
}

// createKind is the createtype4 of CREATE (RFC 8881 s18.4).
type createKind struct {
	Type         FileType
	LinkData     string // TypeLnk
	Major, Minor uint32 // TypeBlk, TypeChr
}

func (c *compound) create(kind createKind, name string, sa *SetAttr) {
	c.op(opCreate)
	c.e.Uint32(uint32(kind.Type))
	switch kind.Type {
	case TypeLnk:
		c.e.String(kind.LinkData)
	case TypeBlk, TypeChr:
		c.e.Uint32(kind.Major)
		c.e.Uint32(kind.Minor)
	}
	c.e.String(name)
	sa.encode(&c.e)
}

func (r *results) decodeCreate() (changeInfo, error) {
	if err := r.next(opCreate); err != nil {
		return changeInfo{}, err
	}
	ci := decodeChangeInfo(&r.d)
	decodeBitmap(&r.d)
	return ci, r.check(opCreate)
}

func (c *compound) read(sid StateID, off uint64, dest []byte) {
	c.op(opRead)
	sid.encode(&c.e)
	c.e.Uint64(off)
	c.e.Uint32(uint32(len(dest)))
	c.dest = dest
}

// decodeRead reads a READ result (RFC 8881 s18.22). The data is either
// in the reply stream, and copied to dest, or was placed in dest by the
// transport (an RDMA Write chunk, RFC 8267 s4.1); the length word stays
// in the stream either way.
func (r *results) decodeRead() (n int, eof bool, err error) {
	if err := r.next(opRead); err != nil {
		return 0, false, err
	}
	eof = r.d.Bool()
	if r.placed {
		n = int(r.d.Uint32())
		if err := r.check(opRead); err != nil {
			return 0, false, err
		}
		if n > len(r.dest) {
			return 0, false, fmt.Errorf("%w: READ returned %d bytes for a %d-byte request", ErrProtocol, n, len(r.dest))
		}
		if n > r.nplace {
			// RFC 8166 s3.4.6: only the bytes the responder wrote are
			// data; the rest of dest holds whatever was there.
			return 0, false, fmt.Errorf("%w: READ reports %d bytes, the server placed %d", ErrProtocol, n, r.nplace)
		}
		return n, eof, nil
	}
	data := r.d.Opaque(len(r.dest))
	if err := r.check(opRead); err != nil {
		return 0, false, err
	}
	n = len(data)
	copy(r.dest, data)
	r.copied += n
	return n, eof, nil
}

// decodeReadInPlace is decodeRead without the copy: data is in dest if
// the transport placed it there, else where it is in the reply, whose
// release goes to *held.
func (r *results) decodeReadInPlace(held *func()) (data []byte, eof bool, err error) {
	if r.placed {
		n, eof, err := r.decodeRead()
		return r.dest[:n], eof, err
	}
	if err := r.next(opRead); err != nil {
		return nil, false, err
	}
	eof = r.d.Bool()
	data = r.d.Opaque(len(r.dest))
	if err := r.check(opRead); err != nil {
		return nil, false, err
	}
	r.held = held
	return data, eof, nil
}

func (c *compound) write(sid StateID, off uint64, stable Stable, data []byte) {
	c.op(opWrite)
	sid.encode(&c.e)
	c.e.Uint64(off)
	c.e.Uint32(uint32(stable))
	c.e.Uint32(uint32(len(data)))
	c.split = c.e.Len()
	c.bulk = data
	if data == nil {
		c.bulk = []byte{}
	}
}

// Verifier is a write verifier (RFC 8881 s18.32.3).
type Verifier [8]byte

func (r *results) decodeWrite() (n uint32, committed Stable, verf Verifier, err error) {
	if err := r.next(opWrite); err != nil {
		return 0, 0, verf, err
	}
	n = r.d.Uint32()
	committed = Stable(r.d.Uint32())
	copy(verf[:], r.d.FixedOpaque(8))
	return n, committed, verf, r.check(opWrite)
}

func (c *compound) commit(off uint64, count uint32) {
	c.op(opCommit)
	c.e.Uint64(off)
	c.e.Uint32(count)
}

func (r *results) decodeCommit() (verf Verifier, err error) {
	if err := r.next(opCommit); err != nil {
		return verf, err
	}
	copy(verf[:], r.d.FixedOpaque(8))
	return verf, r.check(opCommit)
}

func (c *compound) close(sid StateID) {
	c.op(opClose)
	c.e.Uint32(0) // seqid: ignored in NFSv4.1 (RFC 8881 s18.2.3)
	sid.encode(&c.e)
}

func (r *results) decodeClose() error {
	if err := r.next(opClose); err != nil {
		return err
	}
	decodeStateID(&r.d)
	return r.check(opClose)
}

func (c *compound) delegReturn(sid StateID) {
	c.op(opDelegReturn)
	sid.encode(&c.e)
}

func (c *compound) secInfoNoName() {
	c.op(opSecInfoNoName)
	c.e.Uint32(0) // SECINFO_STYLE4_CURRENT_FH
}

// decodeSecInfo returns the flavors of a SECINFO_NO_NAME result; for
// RPCSEC_GSS entries (flavor 6) it skips the GSS triple.
func (r *results) decodeSecInfo() ([]uint32, error) {
	if err := r.next(opSecInfoNoName); err != nil {
		return nil, err
	}
	n := r.d.Length(64)
	var flavors []uint32
	for range n {
		f := r.d.Uint32()
		if f == 6 {
			r.d.Opaque(1024) // oid
			r.d.Uint32()     // qop
			r.d.Uint32()     // service
		}
		flavors = append(flavors, f)
	}
	return flavors, r.check(opSecInfoNoName)
}

// readdir encodes READDIR (RFC 8881 s18.23).
func (c *compound) readdir(cookie uint64, verf [8]byte, dircount, maxcount uint32, mask Bitmap) {
	c.op(opReadDir)
	c.e.Uint64(cookie)
	c.e.FixedOpaque(verf[:])
	c.e.Uint32(dircount)
	c.e.Uint32(maxcount)
	mask.encode(&c.e)
	c.maxRep += int(maxcount)
}

// DirEntry is one READDIR entry.
type DirEntry struct {
	Cookie uint64
	Name   string
	Attr   Attr
}

func (r *results) decodeReadDir(entries []DirEntry) (out []DirEntry, verf [8]byte, eof bool, err error) {
	if err := r.next(opReadDir); err != nil {
		return entries, verf, false, err
	}
	copy(verf[:], r.d.FixedOpaque(8))
	for r.d.Err() == nil && r.d.Bool() {
		var ent DirEntry
		ent.Cookie = r.d.Uint64()
		ent.Name = r.d.String(maxNameLen)
		decodeFattr(&r.d, &ent.Attr)
		entries = append(entries, ent)
	}
	eof = r.d.Bool()
	return entries, verf, eof, r.check(opReadDir)
}
