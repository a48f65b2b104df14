package nfsclient

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// FuzzCompoundReply decodes arbitrary COMPOUND replies against several
// request shapes; nothing may panic or read past the reply, and what is
// decoded is what the reply holds where its encoding says. A READ whose
// data the transport placed (a Write chunk, nplaced bytes of it) counts
// no more bytes than were placed (RFC 8166 s3.4.6).
func FuzzCompoundReply(f *testing.F) {
	f.Add(uint8(0), false, uint8(0), unhex(f, "00000000 00000000 00000003"+seqOK+"00000016 00000000 00000019 00000000 00000001 00000005 6162636465000000"))
	f.Add(uint8(1), false, uint8(0), unhex(f, "00000000 00000000 00000003"+seqOK+"00000016 00000000 00000009 00000000 00000001 00000002 00000000 00000004 00000001"))
	f.Add(uint8(2), true, uint8(0), unhex(f, "00000000 00000000 00000003"+seqOK+"00000016 00000000 0000001a 00000000 0000000000000000 00000001 0000000000000001 00000001 61000000 00000000 00000000 00000000 00000001"))
	f.Add(uint8(3), false, uint8(0), unhex(f, "00000000 00000000 00000003"+seqOK+"00000016 00000000 00000012 00000000"))
	rpc := oncrpc.NewClient(nil, nfsProgram, nfsVersion, oncrpc.ClientOptions{})
	f.Add(uint8(0), true, uint8(5), unhex(f, "00000000 00000000 00000003"+seqOK+"00000016 00000000 00000019 00000000 00000001 00000005"))
	f.Fuzz(func(t *testing.T, shape uint8, placed bool, nplaced uint8, body []byte) {
		var cp compound
		dest := make([]byte, 64)
		cp.reset(rpc, oncrpc.AuthNone, "")
		cp.sequence(testSession, 1, 0, 0)
		cp.putFH([]byte{1})
		rd := &readDirOp{args: readdir4args{dircount: 1024, maxcount: 1024, attrRequest: dirAttrs}}
		open, gfh := &openOp{}, &getFHOp{}
		var wres write4resok
		setAttr := &setAttrOp{args: setattr4args{objAttributes: &SetAttr{}}}
		switch shape % 6 {
		case 0:
			cp.read(StateID{}, 0, oncrpc.Plain(dest), new(readOut))
		case 1:
			cp.getAttr(fileAttrs, nil)
		case 2:
			cp.add(rd)
		case 3:
			cp.add(open, gfh)
		case 4:
			cp.write(StateID{}, 0, Unstable, oncrpc.Plain([]byte("x")), &wres)
		case 5:
			cp.add(setAttr)
			cp.getAttr(fileAttrs, nil)
		}
		var r results
		if r.init(&cp, &oncrpc.Reply{Results: body, BulkPlaced: placed, BulkLen: int(nplaced)}) != nil {
			return
		}
		if st, _, _, err := r.decodeSequence(testSession); err != nil || st != StatusOK {
			return
		}
		if r.voidOp(opPutFH) != nil {
			return
		}
		// start is where the shape's first result begins; its body
		// follows the 8-byte op and status header.
		start := r.d.Offset()
		var a Attr
		switch shape % 6 {
		case 0:
			n, _, err := r.decodeRead()
			if err != nil {
				return
			}
			if n > len(dest) || be32(body, start+12) != uint32(n) {
				t.Fatalf("READ n=%d: length word %d, dest %d bytes", n, be32(body, start+12), len(dest))
			}
			if placed {
				if n > int(nplaced) {
					t.Fatalf("placed READ of %d bytes, the transport placed %d", n, nplaced)
				}
				if r.d.Offset() != start+16 {
					t.Fatalf("placed READ consumed %d bytes, want 16", r.d.Offset()-start)
				}
				return
			}
			if r.d.Offset() != start+16+xdr.RoundUp(n) || !bytes.Equal(dest[:n], body[start+16:start+16+n]) {
				t.Fatalf("READ n=%d: consumed %d bytes; data %x, reply has %x", n, r.d.Offset()-start, dest[:n], body[start+16:min(len(body), start+16+n)])
			}
		case 1:
			if r.decodeGetAttr(&a) == nil {
				checkFattrConsumed(t, body, start+8, r.d.Offset())
			}
		case 2:
			if r.decodeOp(rd) != nil {
				return
			}
			ents, verf := rd.entries, rd.verf
			if !bytes.Equal(verf[:], body[start+8:start+16]) {
				t.Fatalf("READDIR verifier %x, reply has %x", verf, body[start+8:start+16])
			}
			// An entry takes at least 24 bytes: more-flag, cookie, name
			// length, bitmap length, attribute length.
			if len(ents)*24 > len(body)-start {
				t.Fatalf("%d entries from %d bytes", len(ents), len(body)-start)
			}
			for _, e := range ents {
				if len(e.Name) > maxNameLen || !bytes.Contains(body[start:], []byte(e.Name)) {
					t.Fatalf("entry name %q (%d bytes) is not in the reply", e.Name, len(e.Name))
				}
			}
		case 3:
			if r.decodeOp(open) == nil {
				{
					if r.decodeOp(gfh) != nil {
						return
					}
					fh := gfh.res.object
					end := r.d.Offset()
					at := end - xdr.RoundUp(len(fh))
					if len(fh) > maxFHSize || be32(body, at-4) != uint32(len(fh)) || !bytes.Equal(fh, body[at:at+len(fh)]) {
						t.Fatalf("GETFH %x (%d bytes) is not the handle in the reply before offset %d", fh, len(fh), end)
					}
				}
			}
		case 4:
			if r.decodeOp(&cp.wr) != nil {
				return
			}
			n, committed, verf := wres.count, wres.committed, wres.writeverf
			var e xdr.Encoder
			e.Uint32(n)
			e.Uint32(uint32(committed))
			e.FixedOpaque(verf[:])
			if r.d.Offset() != start+24 || !bytes.Equal(e.Bytes(), body[start+8:start+24]) {
				t.Fatalf("WRITE result %x re-encodes differently from the reply's %x", e.Bytes(), body[start+8:min(len(body), start+24)])
			}
		case 5:
			if r.decodeOp(setAttr) == nil {
				at := r.d.Offset()
				if r.decodeGetAttr(&a) == nil {
					checkFattrConsumed(t, body, at+8, r.d.Offset())
				}
			}
		}
	})
}

// be32 reads the XDR word at off in b, or 0xffffffff outside it.
func be32(b []byte, off int) uint32 {
	if off < 0 || off+4 > len(b) {
		return 0xffffffff
	}
	return binary.BigEndian.Uint32(b[off:])
}

// fattrEnd returns where the fattr4 that starts at off in b ends: a
// bitmap4 (count and words), then attrlist4 (length and padded bytes).
func fattrEnd(b []byte, off int) (int, bool) {
	words := be32(b, off)
	if words > 8 {
		return 0, false
	}
	l := be32(b, off+4+4*int(words))
	if l > uint32(len(b)) {
		return 0, false
	}
	end := off + 8 + 4*int(words) + xdr.RoundUp(int(l))
	return end, end <= len(b)
}

// checkFattrConsumed checks that a decoded fattr4 starting at off ended
// at got: its decoder took exactly the bytes the encoding says.
func checkFattrConsumed(t *testing.T, b []byte, off, got int) {
	t.Helper()
	end, ok := fattrEnd(b, off)
	if !ok || got != end {
		t.Fatalf("fattr4 at %d decoded up to %d; its encoding ends at %d (%v)", off, got, end, ok)
	}
}

// FuzzCallback feeds arbitrary backward-direction RPC calls to the
// callback service: a malformed call is dropped; any other gets a reply
// for its XID with the status its program, version and procedure call
// for; a CB_COMPOUND's results are well formed (RFC 8881 s20.2: the
// request's tag, no more results than operations, processing stops at
// the first failure, whose status is the compound's).
func FuzzCallback(f *testing.F) {
	f.Add(cbCall(1, cbSequence(testSession, 1, 0), cbRecall))
	f.Add(cbCall(2, cbSequence(testSession, 1, 1), func(e *xdr.Encoder) {
		e.Uint32(opCBRecallAny)
		e.Uint32(0)
		bitmapOf(0).encode(e)
	}))
	f.Add(cbCall(3, cbRecall))
	f.Add(cbCall(4, cbSequence(testSession, 1, 0), func(e *xdr.Encoder) { e.Uint32(999) }))
	f.Add(cbCall(4, cbSequence(testSession, 1, 0), func(e *xdr.Encoder) {
		e.Uint32(opCBNotifyLock)
		e.Opaque([]byte{1, 2, 3})
		e.Uint64(42)
		e.Opaque([]byte("rdmafs-lowner"))
	}))
	f.Fuzz(func(t *testing.T, msg []byte) {
		s := newTestCallbackServer()
		reply := s.HandleCall(msg)
		h, args, perr := oncrpc.ParseCall(msg)
		if perr != nil {
			if reply != nil {
				t.Fatalf("malformed call (%v) answered", perr)
			}
			return
		}
		if reply == nil {
			t.Fatalf("call %+v not answered", h)
		}
		xid, res, err := oncrpc.ParseReply(reply)
		if xid != h.XID {
			t.Fatalf("reply xid %#x to call %#x", xid, h.XID)
		}
		got := oncrpc.Success
		var ae *oncrpc.AcceptError
		if errors.As(err, &ae) {
			got = ae.Stat
		} else if err != nil {
			t.Fatalf("reply does not parse: %v", err)
		}
		switch {
		case h.Prog != cbProgram:
			expectStat(t, got, oncrpc.ProgUnavail)
		case h.Vers != cbVersion:
			expectStat(t, got, oncrpc.ProgMismatch)
			if ae.Low != cbVersion || ae.High != cbVersion {
				t.Fatalf("PROG_MISMATCH %d..%d, want %d..%d", ae.Low, ae.High, cbVersion, cbVersion)
			}
		case h.Proc == cbProcNull:
			expectStat(t, got, oncrpc.Success)
			if len(res) != 0 {
				t.Fatalf("CB_NULL returned %d bytes", len(res))
			}
		case h.Proc == cbProcCompound:
			if got == oncrpc.GarbageArgs {
				return
			}
			expectStat(t, got, oncrpc.Success)
			checkCBCompoundRes(t, args, res)
		default:
			expectStat(t, got, oncrpc.ProcUnavail)
		}
	})
}

func expectStat(t *testing.T, got, want oncrpc.AcceptStat) {
	t.Helper()
	if got != want {
		t.Fatalf("reply status %v, want %v", got, want)
	}
}

// checkCBCompoundRes checks a CB_COMPOUND4res against its arguments.
func checkCBCompoundRes(t *testing.T, args, res []byte) {
	t.Helper()
	a := xdr.NewDecoder(args)
	tag := a.Opaque(maxTagLen)
	minor := a.Uint32()
	a.Uint32()
	nops := a.Length(maxCompoundOps)
	op0 := a.Uint32()
	d := xdr.NewDecoder(res)
	status := Status(d.Uint32())
	rtag := d.Opaque(maxTagLen)
	n := d.Length(maxCompoundOps)
	if d.Err() != nil || !bytes.Equal(rtag, tag) {
		t.Fatalf("CB_COMPOUND4res header: %v, tag %q, want %q", d.Err(), rtag, tag)
	}
	if n > nops {
		t.Fatalf("%d results for %d operations", n, nops)
	}
	if minor != minorVersion1 && (status != ErrMinorVersMismatch || n != 0) {
		t.Fatalf("minor version %d: status %v with %d results, want MINOR_VERS_MISMATCH and none", minor, status, n)
	}
	last := StatusOK
	for i := range n {
		op, st := d.Uint32(), Status(d.Uint32())
		if d.Err() != nil {
			t.Fatalf("result %d of %d: %v", i, n, d.Err())
		}
		if last != StatusOK {
			t.Fatalf("result %d follows a failed operation (%v)", i, last)
		}
		if i == 0 && op != op0 {
			t.Fatalf("first result is for op %d, the call's first op is %d", op, op0)
		}
		if op == opCBSequence && st == StatusOK {
			d.Skip(16 + 16) // sessionid, sequenceid, slotid, highest and target highest slot
		}
		last = st
	}
	if n > 0 && status != last {
		t.Fatalf("compound status %v, last result %v", status, last)
	}
	if d.Err() != nil || d.Remaining() != 0 {
		t.Fatalf("CB_COMPOUND4res: %v, %d bytes after the results", d.Err(), d.Remaining())
	}
}

// FuzzFattr decodes arbitrary fattr4 values: a successful decode takes
// exactly the fattr4's bytes, and the attribute mask is the one on the
// wire.
func FuzzFattr(f *testing.F) {
	var e xdr.Encoder
	fileAttrs.encode(&e)
	e.Opaque(make([]byte, 200))
	f.Add(e.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		var a Attr
		d := xdr.NewDecoder(b)
		decodeFattr(d, &a)
		if d.Err() != nil {
			return
		}
		checkFattrConsumed(t, b, 0, d.Offset())
		words := int(be32(b, 0))
		for i := range a.Mask {
			w := uint32(0)
			if i < words {
				w = be32(b, 4+4*i)
			}
			if a.Mask[i] != w {
				t.Fatalf("mask word %d = %#x, wire has %#x", i, a.Mask[i], w)
			}
		}
		if len(a.FileHandle) > maxFHSize {
			t.Fatalf("file handle of %d bytes", len(a.FileHandle))
		}
	})
}
