package nfsclient

import (
	"errors"
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
	maxNameLen     = nfs4NameLimit
	maxCompoundOps = 64
)

func (s StateID) encode(e *xdr.Encoder) {
	e.Uint32(s.Seq)
	e.FixedOpaque(s.Other[:])
}

func (s *StateID) decode(d *xdr.Decoder) {
	s.Seq = d.Uint32()
	copy(s.Other[:], d.FixedOpaque(12))
}

func decodeStateID(d *xdr.Decoder) StateID {
	var s StateID
	s.decode(d)
	return s
}

// rawXDR is an item encoded already (an AUTH_SYS credential body).
type rawXDR []byte

func (r rawXDR) encode(e *xdr.Encoder) { e.FixedOpaque(r) }

// opSpec is what the client knows of an operation (declared once, in
// nfs4.x): its name, whether a non-idempotent COMPOUND holding it asks
// the server to cache the reply, its share of the reply-size estimate.
type opSpec struct {
	name   string
	cached bool
	reply  int
}

// An nfsOp is one operation of a COMPOUND with its codec: most are
// generated from nfs4.x (nfs4_xdr.go); the hot path's are below.
// encodeArgs appends the arguments after the operation number;
// decodeRes reads the result body after an NFS4_OK status, and copies
// what it keeps.
type nfsOp interface {
	num() uint32
	encodeArgs(cp *compound)
	decodeRes(r *results) error
}

// A failDecoder is an op with a result body after some failure status
// (LOCK4denied after NFS4ERR_DENIED; SETATTR's attrsset after any).
type failDecoder interface {
	decodeFail(r *results, st Status)
}

// compound builds the arguments of one COMPOUND request (RFC 8881
// s16.2.3) behind the RPC header, and remembers the operations so their
// results can be decoded from the reply.
type compound struct {
	e      xdr.Encoder
	xid    uint32
	numAt  int
	ops    []uint32
	decs   []nfsOp // per op: its result decoder; nil for a void result
	softAt int     // from this op on, a failure ends decoding without error; 0: none
	// bulk is the WRITE data, sent between Head and Tail; dest the
	// READ destination. Views of registered memory the transport moves
	// where they are (oncrpc.Call).
	bulk   oncrpc.View
	split  int                // where bulk goes in e; valid when bulk is not zero
	dest   oncrpc.View        // READ destination
	gss    *oncrpc.GSSContext // the context the call is made under, or nil
	maxRep int                // estimated reply size beyond dest

	// cacheThis asks the server to keep the reply in the slot's replay
	// cache; set for compounds that are not idempotent, so a
	// retransmission after a lost reply gets the original result (RFC
	// 8881 s2.10.6.1.3). cacheAt is where SEQUENCE's sa_cachethis is.
	cacheThis bool
	cacheAt   int

	// err, set by a builder, stops the compound before it is sent (an
	// open lost in a server restart).
	err error

	// Hot-path ops live in the compound, which is pooled, so that
	// building a READ, WRITE or GETATTR COMPOUND and decoding its reply
	// allocate nothing of their own (BenchmarkReadCompound). A call
	// through Client.do still allocates: the transport's round trip
	// (context, timer, record), a GETATTR's owner strings, the result
	// variables its operations decode into (BenchmarkGaneshaGetAttr).
	rd    readOp
	wr    writeOp
	attrs [4]getAttrOp
	nattr int

	rpcCall oncrpc.Call // returned by call, reused rather than allocated
	res     results     // Client.do's reply decoder, reused likewise
}

func (c *compound) reset(rpc *oncrpc.Client, cred oncrpc.Credential, tag string) {
	c.resetMinor(rpc, cred, tag, minorVersion1)
}

func (c *compound) resetMinor(rpc *oncrpc.Client, cred oncrpc.Credential, tag string, minor uint32) {
	c.e.Reset(c.e.Bytes())
	c.ops = c.ops[:0]
	clear(c.decs)
	c.decs = c.decs[:0]
	c.softAt = 0
	c.bulk, c.dest, c.maxRep = oncrpc.View{}, oncrpc.View{}, 0
	c.cacheThis, c.cacheAt = false, 0
	c.err = nil
	clear(c.attrs[:c.nattr]) // rd and wr are set whole when used
	c.nattr = 0
	c.xid = rpc.StartCall(&c.e, procCompound, cred)
	c.gss = cred.GSS
	c.e.String(tag)
	c.e.Uint32(minor)
	c.numAt = c.e.Reserve(4)
}

// op appends operation code with no arguments yet and a void result.
func (c *compound) op(code uint32) {
	spec, _ := opSpecOf(code)
	if spec.cached {
		c.cacheThis = true
	}
	c.ops = append(c.ops, code)
	c.decs = append(c.decs, nil)
	c.e.Uint32(code)
	c.maxRep += max(spec.reply, 128) // per-op result overhead, generous for small results
}

// add appends operations with their arguments; each decodes its own
// result from the reply.
func (c *compound) add(ops ...nfsOp) {
	for _, o := range ops {
		c.op(o.num())
		c.decs[len(c.decs)-1] = o
		o.encodeArgs(c)
	}
}

// optional marks the operations added from now on as ones the caller can
// do without (post-operation attributes): when one fails, or the server
// stopped before it, decoding ends there and the COMPOUND succeeds.
func (c *compound) optional() { c.softAt = len(c.ops) }

// call returns the RPC call in its parts.
func (c *compound) call() *oncrpc.Call {
	c.e.PutUint32At(c.numAt, uint32(len(c.ops)))
	if c.cacheThis && c.cacheAt > 0 {
		c.e.PutUint32At(c.cacheAt, 1)
	}
	b := c.e.Bytes()
	c.rpcCall = oncrpc.Call{XID: c.xid, Head: b, ReplyBulk: c.dest, MaxReplySize: c.maxRep + 256, GSS: c.gss}
	if !c.bulk.IsZero() {
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
	// held, set by a decoder that returns slices of the reply, receives
	// the reply's release once decoding succeeded (Client.do).
	held *func()
}

func (r *results) init(c *compound, rep *oncrpc.Reply) error {
	r.d.Reset(rep.Results)
	r.ops, r.i, r.placed, r.nplace, r.dest, r.copied, r.held = c.ops, 0, rep.BulkPlaced, rep.BulkLen, c.dest.Bytes(), 0, nil
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
// returns an *OpError when the operation failed.
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

// voidOp reads the result of an operation whose body is void.
func (r *results) voidOp(op uint32) error { return r.next(op) }

// decodeOp reads the result of op: its header, then its body after
// NFS4_OK or, for a failDecoder, the body that follows a failure.
func (r *results) decodeOp(op nfsOp) error {
	num := op.num()
	before := r.i
	err := r.next(num)
	if err != nil {
		var oe *OpError
		if fd, ok := op.(failDecoder); ok && r.i > before && errors.As(err, &oe) {
			fd.decodeFail(r, oe.Status)
			if cerr := r.check(num); cerr != nil {
				return cerr
			}
		}
		return err
	}
	if err := op.decodeRes(r); err != nil {
		return err
	}
	return r.check(num)
}

// decodeAll reads the results of the operations from r's position on
// (after SEQUENCE) into the operations, stopping at the first that
// failed; a failure among optional operations ends decoding without an
// error.
func (r *results) decodeAll(cp *compound) error {
	for i := r.i; i < len(cp.ops); i++ {
		var err error
		if op := cp.decs[i]; op != nil {
			err = r.decodeOp(op)
		} else {
			err = r.next(cp.ops[i])
		}
		if err != nil {
			if cp.softAt > 0 && i >= cp.softAt {
				return nil
			}
			return err
		}
	}
	return nil
}

// The hand-written operations: what must stay allocation- and copy-free
// (PUTFH, GETATTR, READ, WRITE; SEQUENCE is in session.go) and READDIR,
// whose entries are attribute lists.

func (c *compound) putFH(fh []byte) {
	c.op(opPutFH)
	c.e.Opaque(fh)
}

func (c *compound) putRootFH() { c.op(opPutRootFH) }
func (c *compound) saveFH()    { c.op(opSaveFH) }
func (c *compound) restoreFH() { c.op(opRestoreFH) }

// getAttrOp is GETATTR (RFC 8881 s18.7): the attributes go to dst, and
// ok (if set) says they came.
type getAttrOp struct {
	mask Bitmap
	dst  *Attr
	ok   *bool
}

func (*getAttrOp) num() uint32               { return opGetAttr }
func (o *getAttrOp) encodeArgs(cp *compound) { o.mask.encode(&cp.e) }
func (o *getAttrOp) decodeRes(r *results) error {
	var a Attr
	dst := o.dst
	if dst == nil {
		dst = &a
	}
	decodeFattr(&r.d, dst)
	if o.ok != nil && r.d.Err() == nil {
		*o.ok = true
	}
	return nil
}

// getAttr adds a GETATTR for mask whose attributes go to dst (nil: read
// and dropped); ok, if not nil, is set when they arrived.
func (c *compound) getAttr(mask Bitmap, dst *Attr, ok ...*bool) {
	var o *getAttrOp
	if c.nattr < len(c.attrs) {
		o = &c.attrs[c.nattr]
		c.nattr++
	} else {
		o = new(getAttrOp)
	}
	*o = getAttrOp{mask: mask, dst: dst}
	if len(ok) > 0 {
		o.ok = ok[0]
	}
	c.add(o)
}

// decodeGetAttr reads a GETATTR result into a.
func (r *results) decodeGetAttr(a *Attr) error {
	return r.decodeOp(&getAttrOp{dst: a})
}

// readOp is READ (RFC 8881 s18.22). The data is either in the reply
// stream, and copied to dest (or, for an in-place read, left there with
// the reply's release going to held), or was placed in dest by the
// transport (an RDMA Write chunk, RFC 8267 s4.1); the length word stays
// in the stream either way. The op lives in the pooled compound: its
// result goes to out, the caller's.
type readOp struct {
	args read4args
	out  *readOut
}

// readOut is what a READ returned.
type readOut struct {
	n    int
	eof  bool
	data []byte  // the bytes read: in dest, or in the reply for an in-place read
	held *func() // non-nil: read in place; receives the reply's release
}

func (*readOp) num() uint32 { return opRead }

func (o *readOp) encodeArgs(cp *compound) { o.args.encode(&cp.e) }

func (o *readOp) decodeRes(r *results) error {
	out := o.out
	out.eof = r.d.Bool()
	if r.placed {
		n := int(r.d.Uint32())
		if err := r.check(opRead); err != nil {
			return err
		}
		if n > len(r.dest) {
			return fmt.Errorf("%w: READ returned %d bytes for a %d-byte request", ErrProtocol, n, len(r.dest))
		}
		if n > r.nplace {
			// RFC 8166 s3.4.6: only the bytes the responder wrote are
			// data; the rest of dest holds whatever was there.
			return fmt.Errorf("%w: READ reports %d bytes, the server placed %d", ErrProtocol, n, r.nplace)
		}
		out.n, out.data = n, r.dest[:n]
		return nil
	}
	data := r.d.Opaque(len(r.dest))
	if err := r.check(opRead); err != nil {
		return err
	}
	out.n = len(data)
	if out.held != nil {
		out.data = data
		r.held = out.held
		return nil
	}
	copy(r.dest, data)
	out.data = r.dest[:out.n]
	r.copied += out.n
	return nil
}

// read adds a READ of dest.Len() bytes at off into dest; the result goes
// to out.
func (c *compound) read(sid StateID, off uint64, dest oncrpc.View, out *readOut) {
	c.rd = readOp{args: read4args{stateid: sid, offset: off, count: uint32(dest.Len())}, out: out}
	c.dest = dest
	c.add(&c.rd)
}

// decodeRead reads a READ result (see readOp).
func (r *results) decodeRead() (n int, eof bool, err error) {
	var out readOut
	err = r.decodeOp(&readOp{out: &out})
	return out.n, out.eof, err
}

// writeOp is WRITE (RFC 8881 s18.32): the data goes out as it is,
// between the call's Head and Tail (a Read chunk over RDMA). The result
// goes to res, the caller's.
type writeOp struct {
	sid    StateID
	off    uint64
	stable Stable
	data   oncrpc.View
	res    *write4resok
}

func (*writeOp) num() uint32 { return opWrite }

func (o *writeOp) encodeArgs(cp *compound) {
	o.sid.encode(&cp.e)
	cp.e.Uint64(o.off)
	cp.e.Uint32(uint32(o.stable))
	cp.e.Uint32(uint32(o.data.Len()))
	cp.split = cp.e.Len()
	cp.bulk = o.data
	if o.data.IsZero() {
		cp.bulk = oncrpc.Plain([]byte{})
	}
}

func (o *writeOp) decodeRes(r *results) error {
	o.res.decode(&r.d)
	if r.d.Err() == nil && int(o.res.count) > o.data.Len() {
		return fmt.Errorf("%w: WRITE of %d bytes reports %d written", ErrProtocol, o.data.Len(), o.res.count)
	}
	return nil
}

// write adds a WRITE of data at off; its result goes to res.
func (c *compound) write(sid StateID, off uint64, stable Stable, data oncrpc.View, res *write4resok) {
	c.wr = writeOp{sid: sid, off: off, stable: stable, data: data, res: res}
	c.add(&c.wr)
}

// Verifier is a write verifier (RFC 8881 s18.32.3).
type Verifier [8]byte

// readDirOp is READDIR (RFC 8881 s18.23); its entries go to entries.
type readDirOp struct {
	args    readdir4args
	entries []DirEntry
	verf    [8]byte
	eof     bool
}

func (*readDirOp) num() uint32 { return opReadDir }

func (o *readDirOp) encodeArgs(cp *compound) {
	o.args.encode(&cp.e)
	cp.maxRep += int(o.args.maxcount)
}

// decodeRes decodes READDIR4resok, which is at most maxcount bytes (RFC
// 8881 s18.23.3): a reply larger is refused before its entries cost more
// than the few a maxcount holds.
func (o *readDirOp) decodeRes(r *results) error {
	start := r.d.Offset()
	copy(o.verf[:], r.d.FixedOpaque(8))
	for r.d.Err() == nil && r.d.Bool() {
		var ent DirEntry
		ent.Cookie = r.d.Uint64()
		ent.Name = r.d.String(maxNameLen)
		decodeFattr(&r.d, &ent.Attr)
		if n := r.d.Offset() - start; n > int(o.args.maxcount) {
			return fmt.Errorf("%w: READDIR reply of more than its maxcount of %d bytes", ErrProtocol, o.args.maxcount)
		}
		o.entries = append(o.entries, ent)
	}
	o.eof = r.d.Bool()
	return nil
}

// DirEntry is one READDIR entry.
type DirEntry struct {
	Cookie uint64
	Name   string
	Attr   Attr
}
