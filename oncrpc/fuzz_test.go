package oncrpc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// suffixOf reports whether sub is a suffix of msg by address: the same
// memory, not just equal bytes. A decoder's "rest" must alias its input.
func suffixOf(sub, msg []byte) bool {
	if len(sub) > len(msg) {
		return false
	}
	if len(sub) == 0 {
		return true
	}
	return &sub[len(sub)-1] == &msg[len(msg)-1] && &sub[0] == &msg[len(msg)-len(sub)]
}

// within reports whether sub lies inside msg by address.
func within(sub, msg []byte) bool {
	if len(sub) == 0 {
		return true
	}
	for i := 0; i+len(sub) <= len(msg); i++ {
		if &msg[i] == &sub[0] {
			return true
		}
	}
	return false
}

// word returns the XDR word at off in b, and whether b holds it.
func word(b []byte, off int) (uint32, bool) {
	if off < 0 || off+4 > len(b) {
		return 0, false
	}
	return binary.BigEndian.Uint32(b[off:]), true
}

// FuzzParseReply checks ParseReply, ParseCall and ParseAuthSys on
// arbitrary input: results and bodies alias the input; every decoded
// field is the word at its place in the message, found by walking the
// RFC 5531 s9 layout independently of the parser (header lengths
// included, so a verifier or credential parsed wrongly is caught); what
// is decoded encodes back to a message that decodes to the same values;
// every error is one of the documented kinds.
func FuzzParseReply(f *testing.F) {
	f.Add(mustHex(f, "00000001 00000001 00000000 00000000 00000000 00000000 cafebabe"))
	f.Add(mustHex(f, "00000002 00000001 00000000 00000000 00000000 00000002 00000004 00000004"))
	f.Add(mustHex(f, "00000003 00000001 00000001 00000001 00000005"))
	f.Add(mustHex(f, "00000004 00000001 00000001 00000000 00000002 00000002"))
	var call xdr.Encoder
	AppendCallHeader(&call, 5, 100003, 4, 1, AuthSys{Stamp: 9, MachineName: "host", UID: 1000, GID: 100, GIDs: []uint32{4, 24}}.Credential())
	call.Uint32(42)
	f.Add(call.Bytes())
	f.Add(AuthSys{MachineName: "abcde", UID: 1, GIDs: []uint32{1, 2, 3}}.Credential().Body)
	f.Fuzz(func(t *testing.T, msg []byte) {
		checkParseReply(t, msg)
		checkParseCall(t, msg)
		checkParseAuthSys(t, msg)
	})
}

func checkParseReply(t *testing.T, msg []byte) {
	xid, res, err := ParseReply(msg)
	var e xdr.Encoder
	var ae *AcceptError
	var de *DeniedError
	// RFC 5531 s9: xid, REPLY, reply_stat, then for MSG_ACCEPTED the
	// verifier (flavor, length, padded body) and accept_stat, for
	// MSG_DENIED reject_stat and its arm.
	w := func(off int) uint32 {
		v, ok := word(msg, off)
		if !ok {
			t.Fatalf("decoded a reply without the word at offset %d (%d bytes)", off, len(msg))
		}
		return v
	}
	if err == nil || errors.As(err, &ae) || errors.As(err, &de) {
		if w(0) != xid || w(4) != MsgReply {
			t.Fatalf("xid %#x, message type %d: not the message's %#x, %d", xid, MsgReply, w(0), w(4))
		}
	}
	// stat is where accept_stat is in an accepted reply.
	stat := func() int {
		vlen := w(16)
		if w(8) != replyAccepted || vlen > maxAuthBody {
			t.Fatalf("accepted reply with reply_stat %d, verifier of %d bytes", w(8), vlen)
		}
		return 20 + xdr.RoundUp(int(vlen))
	}
	switch {
	case err == nil:
		if !suffixOf(res, msg) {
			t.Fatalf("results (%d bytes) are not the tail of the %d-byte message", len(res), len(msg))
		}
		at := stat()
		if w(at) != uint32(Success) || len(msg)-len(res) != at+4 {
			t.Fatalf("results start at byte %d; the reply's accept_stat %d is at %d", len(msg)-len(res), w(at), at)
		}
		AppendAcceptedReply(&e, xid, Success, 0, 0)
	case errors.As(err, &ae):
		if ae.Stat == Success {
			t.Fatalf("AcceptError with status SUCCESS")
		}
		at := stat()
		if w(at) != uint32(ae.Stat) {
			t.Fatalf("accept_stat %v, the reply has %d", ae.Stat, w(at))
		}
		if ae.Stat == ProgMismatch && (w(at+4) != ae.Low || w(at+8) != ae.High) {
			t.Fatalf("PROG_MISMATCH %d..%d, the reply has %d..%d", ae.Low, ae.High, w(at+4), w(at+8))
		}
		AppendAcceptedReply(&e, xid, ae.Stat, ae.Low, ae.High)
	case errors.As(err, &de):
		switch {
		case w(8) != replyDenied:
			t.Fatalf("DeniedError for reply_stat %d", w(8))
		case de.RPCMismatch && (w(12) != 0 || w(16) != de.Low || w(20) != de.High):
			t.Fatalf("RPC_MISMATCH %d..%d, the reply has reject_stat %d, %d..%d", de.Low, de.High, w(12), w(16), w(20))
		case !de.RPCMismatch && (w(12) != 1 || w(16) != de.AuthStat):
			t.Fatalf("AUTH_ERROR %d, the reply has reject_stat %d, %d", de.AuthStat, w(12), w(16))
		}
		e.Uint32(xid)
		e.Uint32(MsgReply)
		e.Uint32(replyDenied)
		if de.RPCMismatch {
			e.Uint32(0)
			e.Uint32(de.Low)
			e.Uint32(de.High)
		} else {
			e.Uint32(1)
			e.Uint32(de.AuthStat)
		}
	default:
		if !errors.Is(err, ErrBadReply) {
			t.Fatalf("error %v is neither an AcceptError, a DeniedError nor ErrBadReply", err)
		}
		return
	}
	// What was decoded encodes to a reply that decodes the same.
	xid2, res2, err2 := ParseReply(append(e.Bytes(), res...))
	if xid2 != xid || !bytes.Equal(res2, res) || !reflect.DeepEqual(err2, err) {
		t.Fatalf("re-encoded reply decodes differently: xid %#x/%#x results %x/%x err %v/%v", xid, xid2, res, res2, err, err2)
	}
}

func checkParseCall(t *testing.T, msg []byte) {
	h, args, err := ParseCall(msg)
	if err != nil {
		if args != nil {
			t.Fatalf("arguments returned with error %v", err)
		}
		return
	}
	if !suffixOf(args, msg) {
		t.Fatalf("arguments (%d bytes) are not the tail of the %d-byte message", len(args), len(msg))
	}
	if !within(h.Cred.Body, msg) || len(h.Cred.Body) > maxAuthBody {
		t.Fatalf("credential body of %d bytes does not lie in the message", len(h.Cred.Body))
	}
	// RFC 5531 s9: xid, CALL, rpcvers, prog, vers, proc, then the
	// credential and the verifier (flavor, length, padded body each).
	w := func(off int) uint32 {
		v, ok := word(msg, off)
		if !ok {
			t.Fatalf("decoded a call without the word at offset %d (%d bytes)", off, len(msg))
		}
		return v
	}
	if w(0) != h.XID || w(4) != MsgCall || w(8) != RPCVersion || w(12) != h.Prog || w(16) != h.Vers || w(20) != h.Proc || w(24) != h.Cred.Flavor {
		t.Fatalf("call header %+v is not the message's words", h)
	}
	clen := w(28)
	if clen > maxAuthBody || int(clen) != len(h.Cred.Body) || (clen > 0 && &h.Cred.Body[0] != &msg[32]) {
		t.Fatalf("credential body of %d bytes; the message's is %d bytes at offset 32", len(h.Cred.Body), clen)
	}
	voff := 32 + xdr.RoundUp(int(clen))
	vlen := w(voff + 4)
	if vlen > maxAuthBody || len(msg)-len(args) != voff+8+xdr.RoundUp(int(vlen)) {
		t.Fatalf("arguments start at byte %d; the %d-byte verifier at %d ends at %d", len(msg)-len(args), vlen, voff, voff+8+xdr.RoundUp(int(vlen)))
	}
	var e xdr.Encoder
	AppendCallHeader(&e, h.XID, h.Prog, h.Vers, h.Proc, h.Cred)
	enc := append(e.Bytes(), args...)
	h2, args2, err := ParseCall(enc)
	if err != nil || !reflect.DeepEqual(h2, h) || !bytes.Equal(args2, args) {
		t.Fatalf("re-encoded call decodes differently: %+v %x %v, want %+v %x", h2, args2, err, h, args)
	}
	if len(enc) > len(msg) {
		t.Fatalf("re-encoded call (AUTH_NONE verifier) is longer than the original: %d > %d", len(enc), len(msg))
	}
}

func checkParseAuthSys(t *testing.T, body []byte) {
	a, err := ParseAuthSys(body)
	if err != nil {
		return
	}
	if len(a.MachineName) > 255 || len(a.GIDs) > maxAuthSysGroups {
		t.Fatalf("decoded name of %d bytes, %d groups: over the protocol's limits", len(a.MachineName), len(a.GIDs))
	}
	enc := a.Credential().Body
	if len(enc) > len(body) {
		t.Fatalf("re-encoded AUTH_SYS body is %d bytes, decoded from %d", len(enc), len(body))
	}
	a2, err := ParseAuthSys(enc)
	if err != nil || !reflect.DeepEqual(a2, a) {
		t.Fatalf("re-encoded AUTH_SYS decodes to %+v %v, want %+v", a2, err, a)
	}
}

// FuzzReadRecord feeds arbitrary byte streams to the record-marking
// reader and compares what it returns with a reference reading of the
// same stream (RFC 5531 s11): a call's bytes beyond maxCall are dropped,
// its size still counted.
func FuzzReadRecord(f *testing.F) {
	f.Add(mustHex(f, "80000004 01020304"))
	f.Add(mustHex(f, "00000002 0102 80000002 0304"))
	f.Add(mustHex(f, "ffffffff"))
	f.Add(mustHex(f, "80000000 80000001 ff"))
	f.Fuzz(func(t *testing.T, stream []byte) {
		const limit, maxCall = 1 << 16, 64
		want, wantErr := referenceRecords(stream, limit)
		r := bytes.NewReader(stream)
		for i := 0; ; i++ {
			msg, size, err := readRecord(r, limit, maxCall)
			if err != nil {
				if i != len(want) {
					t.Fatalf("record %d: %v, want %d records", i, err, len(want))
				}
				if got := errors.Is(err, errRecordTooLarge); got != errors.Is(wantErr, errRecordTooLarge) {
					t.Fatalf("after %d records: error %v, want %v", i, err, wantErr)
				}
				if errors.Is(wantErr, io.EOF) != errors.Is(err, io.EOF) {
					t.Fatalf("after %d records: error %v, want %v", i, err, wantErr)
				}
				return
			}
			if i >= len(want) {
				t.Fatalf("record %d (%d bytes) beyond the %d in the stream", i, len(msg.buf), len(want))
			}
			w := want[i]
			if size != len(w) {
				t.Fatalf("record %d: size %d, want %d", i, size, len(w))
			}
			if mt, ok := MessageType(w); ok && mt == MsgCall {
				w = w[:min(len(w), maxCall)]
			}
			if !bytes.Equal(msg.buf, w) {
				t.Fatalf("record %d: got %x, want %x", i, msg.buf, w)
			}
			putBuffer(msg)
		}
	})
}

// referenceRecords splits stream into records the simple way, and
// returns the error that ends it: io.EOF at a record boundary,
// io.ErrUnexpectedEOF inside one, errRecordTooLarge over limit.
func referenceRecords(stream []byte, limit int) ([][]byte, error) {
	var recs [][]byte
	var cur []byte
	for {
		if len(stream) == 0 && cur == nil {
			return recs, io.EOF
		}
		if len(stream) < 4 {
			if len(stream) == 0 {
				return recs, io.EOF // a record without its last fragment
			}
			return recs, io.ErrUnexpectedEOF
		}
		w := binary.BigEndian.Uint32(stream)
		n := int(w & 0x7fffffff)
		stream = stream[4:]
		if len(cur)+n > limit {
			return recs, errRecordTooLarge
		}
		if len(stream) < n {
			return recs, io.ErrUnexpectedEOF
		}
		cur = append(cur, stream[:n]...)
		if cur == nil {
			cur = []byte{}
		}
		stream = stream[n:]
		if w&lastFragment != 0 {
			recs = append(recs, cur)
			cur = nil
		}
	}
}
