package nfsclient

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

func words(s string) string { return strings.Join(strings.Fields(s), "") }

// lockCompoundHex builds SEQUENCE+PUTFH+op and returns the COMPOUND
// arguments after the RPC header, in hex, and whether the reply is to be
// cached.
func lockCompoundHex(build func(cp *compound)) (string, bool) {
	rpc := oncrpc.NewClient(nil, nfsProgram, nfsVersion, oncrpc.ClientOptions{})
	var cp compound
	cp.reset(rpc, oncrpc.AuthNone, "")
	cp.sequence(testSession, 7, 3, 5)
	cp.putFH([]byte{0xaa, 0xbb, 0xcc})
	build(&cp)
	call := cp.call()
	return hex.EncodeToString(call.Head[40:]), cp.cacheThis
}

// decodeLockResult reads the result of a LOCK or LOCKT: the lock stateid
// (LOCK only) on success, the conflicting lock for NFS4ERR_DENIED (RFC
// 8881 s18.10.2, s18.11.2).
func decodeLockResult(r *results, op uint32) (StateID, *LockDenied, error) {
	if op == opLock {
		var o lockOp
		err := r.decodeOp(&o)
		if o.failed {
			return StateID{}, o.fail.lockDenied(), err
		}
		if err != nil {
			return StateID{}, nil, err
		}
		return o.res.lockStateid, nil, nil
	}
	var o lockTOp
	err := r.decodeOp(&o)
	if o.failed {
		return StateID{}, o.fail.lockDenied(), err
	}
	return StateID{}, nil, err
}

// The arguments spelled out from RFC 8881 s18.10.1, s18.11.1, s18.12.1.
func TestLockEncodeGolden(t *testing.T) {
	owner := []byte("rdmafs-l")
	tests := []struct {
		name      string
		build     func(cp *compound)
		want      string // after SEQUENCE and PUTFH
		cacheThis bool
	}{
		{"LOCK open_to_lock_owner4", func(cp *compound) {
			cp.add(&lockOp{args: lockArgs(WriteWLT, 0, 101, false, true, StateID{Seq: 1, Other: [12]byte{9}}, 0x1122334455667788, owner, StateID{})})
		}, `0000000c 00000004 00000000 0000000000000000 0000000000000065
		    00000001 00000001 00000001 090000000000000000000000 00000000
		    1122334455667788 00000008 72646d6166732d6c`, true},
		{"LOCK exist_lock_owner4", func(cp *compound) {
			cp.add(&lockOp{args: lockArgs(ReadLT, 61, LengthToEOF, false, false, StateID{}, 0, nil, StateID{Seq: 2, Other: [12]byte{0: 5, 11: 6}})})
		}, `0000000c 00000001 00000000 000000000000003d ffffffffffffffff
		    00000000 00000002 050000000000000000000006 00000000`, true},
		{"LOCKT", func(cp *compound) {
			cp.add(&lockTOp{args: lockt4args{locktype: WriteLT, offset: 40, length: 21, owner: stateOwner4{clientid: 0x1122334455667788, owner: owner}}})
		}, `0000000d 00000002 0000000000000028 0000000000000015 1122334455667788 00000008 72646d6166732d6c`, false},
		{"LOCKU", func(cp *compound) {
			cp.add(&lockUOp{args: locku4args{locktype: WriteLT, lockStateid: StateID{Seq: 3, Other: [12]byte{1}}, offset: 40, length: 21}})
		}, `0000000e 00000002 00000000 00000003 010000000000000000000000 0000000000000028 0000000000000015`, true},
	}
	prefix := words(`00000000 00000001 00000003
		00000035 0102030405060708090a0b0c0d0e0f10 00000007 00000003 00000005 00000000
		00000016 00000003 aabbcc00`)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, cache := lockCompoundHex(tt.build)
			// sa_cachethis is set by call() for non-idempotent ops.
			wantPrefix := prefix
			if tt.cacheThis {
				wantPrefix = strings.Replace(prefix, "0000000500000000", "0000000500000001", 1)
			}
			if want := wantPrefix + words(tt.want); got != want {
				t.Fatalf("\n got %s\nwant %s", got, want)
			}
			if cache != tt.cacheThis {
				t.Fatalf("cacheThis %v, want %v", cache, tt.cacheThis)
			}
		})
	}
}

const deniedBody = `0000000000000028 0000000000000015 00000002 1122334455667788 00000005 6f74686572000000`

func TestDecodeLockResults(t *testing.T) {
	rpc := oncrpc.NewClient(nil, nfsProgram, nfsVersion, oncrpc.ClientOptions{})
	wantDenied := &LockDenied{Offset: 40, Length: 21, Type: WriteLT, ClientID: 0x1122334455667788, Owner: []byte("other")}
	tests := []struct {
		name       string
		op         uint32
		reply      string
		wantSID    StateID
		wantDenied *LockDenied
		wantErr    error
	}{
		{"LOCK ok", opLock, "00000003" + seqOK + "00000016 00000000 0000000c 00000000 00000001 0a0000000000000000000000",
			StateID{Seq: 1, Other: [12]byte{10}}, nil, nil},
		{"LOCK denied", opLock, "00000003" + seqOK + "00000016 00000000 0000000c 0000271a " + deniedBody,
			StateID{}, wantDenied, ErrDenied},
		{"LOCKT denied", opLockT, "00000003" + seqOK + "00000016 00000000 0000000d 0000271a " + deniedBody,
			StateID{}, wantDenied, ErrDenied},
		{"LOCKT ok", opLockT, "00000003" + seqOK + "00000016 00000000 0000000d 00000000", StateID{}, nil, nil},
		{"LOCK denied truncated", opLock, "00000003" + seqOK + "00000016 00000000 0000000c 0000271a 0000000000000028",
			StateID{}, nil, ErrProtocol},
		{"LOCK denied owner too long", opLock, "00000003" + seqOK + "00000016 00000000 0000000c 0000271a 0000000000000028 0000000000000015 00000002 1122334455667788 00100000",
			StateID{}, nil, ErrProtocol},
		{"LOCK grace", opLock, "00000003" + seqOK + "00000016 00000000 0000000c 0000271d", StateID{}, nil, ErrGrace},
		{"LOCK stopped at PUTFH", opLock, "00000002" + seqOK + "00000016 00000046", StateID{}, nil, ErrStale},
		{"LOCK ok truncated stateid", opLock, "00000003" + seqOK + "00000016 00000000 0000000c 00000000 00000001",
			StateID{}, nil, ErrProtocol},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cp compound
			cp.reset(rpc, oncrpc.AuthNone, "")
			cp.sequence(testSession, 7, 3, 5)
			cp.putFH([]byte{1})
			cp.op(tt.op)
			// The COMPOUND status is the last result's (RFC 8881 s16.2.3).
			st := uint32(0)
			if f := strings.Fields(tt.reply); len(f) > 1 && f[len(f)-1] != "00000000" {
				switch {
				case strings.HasPrefix(tt.reply, "00000002"):
					st = uint32(ErrStale)
				case strings.Contains(tt.reply, "0000271a"):
					st = uint32(ErrDenied)
				case strings.Contains(tt.reply, "0000271d"):
					st = uint32(ErrGrace)
				}
			}
			var r results
			if err := r.init(&cp, compoundReply(t, st, tt.reply)); err != nil {
				t.Fatal(err)
			}
			if s, _, _, err := r.decodeSequence(testSession); err != nil || s != StatusOK {
				t.Fatalf("sequence: %v %v", s, err)
			}
			err := r.voidOp(opPutFH)
			var sid StateID
			var dn *LockDenied
			if err == nil {
				sid, dn, err = decodeLockResult(&r, tt.op)
			}
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("err %v, want %v", err, tt.wantErr)
			}
			if sid != tt.wantSID {
				t.Errorf("stateid %+v, want %+v", sid, tt.wantSID)
			}
			if (dn == nil) != (tt.wantDenied == nil) || dn != nil && (dn.Offset != tt.wantDenied.Offset ||
				dn.Length != tt.wantDenied.Length || dn.Type != tt.wantDenied.Type ||
				dn.ClientID != tt.wantDenied.ClientID || !bytes.Equal(dn.Owner, tt.wantDenied.Owner)) {
				t.Errorf("denied %+v, want %+v", dn, tt.wantDenied)
			}
		})
	}
}

func TestDecodeLockU(t *testing.T) {
	rpc := oncrpc.NewClient(nil, nfsProgram, nfsVersion, oncrpc.ClientOptions{})
	var cp compound
	cp.reset(rpc, oncrpc.AuthNone, "")
	cp.sequence(testSession, 7, 3, 5)
	cp.putFH([]byte{1})
	cp.add(&lockUOp{args: locku4args{locktype: WriteLT, length: LengthToEOF}})
	var r results
	if err := r.init(&cp, compoundReply(t, 0, "00000003"+seqOK+"00000016 00000000 0000000e 00000000 00000004 0b0000000000000000000000")); err != nil {
		t.Fatal(err)
	}
	r.decodeSequence(testSession)
	r.voidOp(opPutFH)
	var op lockUOp
	err := r.decodeOp(&op)
	sid := op.res
	if err != nil || sid != (StateID{Seq: 4, Other: [12]byte{11}}) {
		t.Fatalf("LOCKU: %+v %v", sid, err)
	}
}

func TestCallbackNotifyLock(t *testing.T) {
	s := newTestCallbackServer()
	fh, owner := []byte{1, 2, 3}, []byte("rdmafs-lowner")
	w := s.locks.add(fh, 42, owner)
	other := s.locks.add(fh, 42, []byte("someone else"))
	defer s.locks.remove(w)
	defer s.locks.remove(other)
	reply := s.HandleCall(cbCall(1, cbSequence(testSession, 1, 0), func(e *xdr.Encoder) {
		e.Uint32(opCBNotifyLock)
		e.Opaque(fh)
		e.Uint64(42)
		e.Opaque(owner)
	}))
	st, ops := cbStatuses(t, reply)
	if st != StatusOK || len(ops) != 2 || ops[1] != [2]uint32{opCBNotifyLock, 0} {
		t.Fatalf("status %v ops %v", st, ops)
	}
	select {
	case <-w.ch:
	default:
		t.Fatal("waiter not woken")
	}
	select {
	case <-other.ch:
		t.Fatal("another owner's waiter woken")
	default:
	}
	if s.locks.notifies != 1 {
		t.Fatalf("notifies %d", s.locks.notifies)
	}
}

// encodeLockDenied is the inverse of decodeLockDenied.
func encodeLockDenied(e *xdr.Encoder, dn *LockDenied) {
	e.Uint64(dn.Offset)
	e.Uint64(dn.Length)
	e.Uint32(uint32(dn.Type))
	e.Uint64(dn.ClientID)
	e.Opaque(dn.Owner)
}

// FuzzLockResult decodes arbitrary LOCK and LOCKT results. Property:
// whatever decodes without error re-encodes to exactly the bytes it was
// decoded from (a stateid for LOCK, a LOCK4denied for NFS4ERR_DENIED),
// and a denied lock is only reported with ErrDenied.
func FuzzLockResult(f *testing.F) {
	ok := unhex(f, "00000003"+seqOK+"00000016 00000000 0000000c 00000000 00000001 0a0000000000000000000000")
	denied := unhex(f, "00000003"+seqOK+"00000016 00000000 0000000c 0000271a "+deniedBody)
	f.Add(false, uint32(0), ok)
	f.Add(false, uint32(10010), denied)
	f.Add(true, uint32(10010), denied)
	rpc := oncrpc.NewClient(nil, nfsProgram, nfsVersion, oncrpc.ClientOptions{})
	f.Fuzz(func(t *testing.T, lockT bool, status uint32, body []byte) {
		op := uint32(opLock)
		if lockT {
			op = opLockT
		}
		var cp compound
		cp.reset(rpc, oncrpc.AuthNone, "")
		cp.sequence(testSession, 7, 3, 5)
		cp.putFH([]byte{1})
		cp.op(op)
		var hdr xdr.Encoder
		hdr.Uint32(status)
		hdr.String("")
		var r results
		if r.init(&cp, &oncrpc.Reply{Results: append(hdr.Bytes(), body...)}) != nil {
			return
		}
		if st, _, _, err := r.decodeSequence(testSession); err != nil || st != StatusOK {
			return
		}
		if r.voidOp(opPutFH) != nil {
			return
		}
		start := r.d.Offset() + 8 // past the op and status words
		sid, dn, err := decodeLockResult(&r, op)
		if errors.Is(err, ErrProtocol) {
			return
		}
		var e xdr.Encoder
		pad := 0 // the decoder does not insist on zero padding (RFC 4506 s4.10 says zero)
		switch {
		case dn != nil:
			if !errors.Is(err, ErrDenied) {
				t.Fatalf("denied lock reported with %v", err)
			}
			encodeLockDenied(&e, dn)
			pad = xdr.Pad(len(dn.Owner))
		case err == nil && op == opLock:
			sid.encode(&e)
		default:
			return
		}
		end := r.d.Offset()
		if start > end {
			t.Fatalf("offsets %d > %d", start, end)
		}
		consumed := append(hdr.Bytes(), body...)[start:end]
		if len(e.Bytes()) != len(consumed) || !bytes.Equal(e.Bytes()[:len(consumed)-pad], consumed[:len(consumed)-pad]) {
			t.Fatalf("re-encoded %x, decoded from %x", e.Bytes(), consumed)
		}
	})
}
