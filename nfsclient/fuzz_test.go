package nfsclient

import (
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// FuzzCompoundReply decodes arbitrary COMPOUND replies against several
// request shapes; nothing may panic or read past the reply.
func FuzzCompoundReply(f *testing.F) {
	f.Add(uint8(0), false, unhex(f, "00000000 00000000 00000003"+seqOK+"00000016 00000000 00000019 00000000 00000001 00000005 6162636465000000"))
	f.Add(uint8(1), false, unhex(f, "00000000 00000000 00000003"+seqOK+"00000016 00000000 00000009 00000000 00000001 00000002 00000000 00000004 00000001"))
	f.Add(uint8(2), true, unhex(f, "00000000 00000000 00000003"+seqOK+"00000016 00000000 0000001a 00000000 0000000000000000 00000001 0000000000000001 00000001 61000000 00000000 00000000 00000000 00000001"))
	f.Add(uint8(3), false, unhex(f, "00000000 00000000 00000003"+seqOK+"00000016 00000000 00000012 00000000"))
	rpc := oncrpc.NewClient(nil, nfsProgram, nfsVersion, oncrpc.ClientOptions{})
	f.Fuzz(func(t *testing.T, shape uint8, placed bool, body []byte) {
		var cp compound
		dest := make([]byte, 64)
		cp.reset(rpc, oncrpc.AuthNone, "")
		cp.sequence(testSession, 1, 0, 0)
		cp.putFH([]byte{1})
		switch shape % 6 {
		case 0:
			cp.read(StateID{}, 0, dest)
		case 1:
			cp.getAttr(fileAttrs)
		case 2:
			cp.readdir(0, [8]byte{}, 1024, 1024, dirAttrs)
		case 3:
			cp.op(opOpen)
			cp.getFH()
		case 4:
			cp.write(StateID{}, 0, Unstable, []byte("x"))
		case 5:
			cp.setAttr(StateID{}, &SetAttr{})
			cp.getAttr(fileAttrs)
		}
		var r results
		if r.init(&cp, &oncrpc.Reply{Results: body, BulkPlaced: placed}) != nil {
			return
		}
		if st, _, _, err := r.decodeSequence(testSession); err != nil || st != StatusOK {
			return
		}
		if r.voidOp(opPutFH) != nil {
			return
		}
		var a Attr
		switch shape % 6 {
		case 0:
			if n, _, err := r.decodeRead(); err == nil && n > len(dest) {
				t.Fatalf("READ n=%d > %d", n, len(dest))
			}
		case 1:
			r.decodeGetAttr(&a)
		case 2:
			r.decodeReadDir(nil)
		case 3:
			if r.next(opOpen) == nil {
				decodeStateID(&r.d)
				decodeChangeInfo(&r.d)
				r.d.Uint32()
				decodeBitmap(&r.d)
				decodeDelegation(&r)
				if r.check(opOpen) == nil {
					r.decodeGetFH()
				}
			}
		case 4:
			r.decodeWrite()
		case 5:
			if r.decodeSetAttr() == nil {
				r.decodeGetAttr(&a)
			}
		}
	})
}

// FuzzCallback feeds arbitrary backward-direction RPC calls to the
// callback service.
func FuzzCallback(f *testing.F) {
	f.Add(cbCall(1, cbSequence(testSession, 1, 0), cbRecall))
	f.Add(cbCall(2, cbSequence(testSession, 1, 1), func(e *xdr.Encoder) {
		e.Uint32(opCBRecallAny)
		e.Uint32(0)
		bitmapOf(0).encode(e)
	}))
	f.Add(cbCall(3, cbRecall))
	f.Fuzz(func(t *testing.T, msg []byte) {
		s := newTestCallbackServer()
		reply := s.HandleCall(msg)
		if reply != nil {
			if _, _, err := oncrpc.ParseReply(reply); err != nil && err.Error() == "" {
				t.Fatal("unreachable")
			}
		}
	})
}

// FuzzFattr decodes arbitrary fattr4 values.
func FuzzFattr(f *testing.F) {
	var e xdr.Encoder
	fileAttrs.encode(&e)
	e.Opaque(make([]byte, 200))
	f.Add(e.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		var a Attr
		decodeFattr(xdr.NewDecoder(b), &a)
	})
}
