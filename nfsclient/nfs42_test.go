package nfsclient

import (
	"bytes"
	"encoding/hex"
	"errors"
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// The NFSv4.2 arguments spelled out from RFC 7862 s15 and RFC 8276 s8,
// in a COMPOUND whose header says minor version 2.
func TestNFS42EncodeGolden(t *testing.T) {
	sid := StateID{Seq: 1, Other: [12]byte{9}}
	sidHex := "00000001 090000000000000000000000"
	tests := []struct {
		name string
		op   nfsOp
		want string
	}{
		{"ALLOCATE", &allocateOp{args: allocate4args{stateid: sid, offset: 4096, length: 8192}},
			"0000003b" + sidHex + "0000000000001000 0000000000002000"},
		{"DEALLOCATE", &deallocateOp{args: deallocate4args{stateid: sid, offset: 1, length: 2}},
			"0000003e" + sidHex + "0000000000000001 0000000000000002"},
		{"SEEK hole", &seekOp{args: seek4args{stateid: sid, offset: 5, what: uint32(SeekHole)}},
			"00000045" + sidHex + "0000000000000005 00000001"},
		{"COPY", &copyOp{args: copy4args{srcStateid: sid, dstStateid: sid, srcOffset: 1, dstOffset: 2, count: 3, consecutive: true, synchronous: true}},
			"0000003c" + sidHex + sidHex + "0000000000000001 0000000000000002 0000000000000003 00000001 00000001 00000000"},
		{"CLONE", &cloneOp{args: clone4args{srcStateid: sid, dstStateid: sid, count: 7}},
			"00000047" + sidHex + sidHex + "0000000000000000 0000000000000000 0000000000000007"},
		{"GETXATTR", &getXattrOp{args: getxattr4args{name: "ab"}}, "00000048 00000002 61620000"},
		{"SETXATTR create", &setXattrOp{args: setxattr4args{option: uint32(XattrCreate), key: "k", value: []byte{1, 2, 3, 4, 5}}},
			"00000049 00000001 00000001 6b000000 00000005 0102030405000000"},
		{"LISTXATTRS", &listXattrsOp{args: listxattrs4args{cookie: 9, maxcount: 65536}}, "0000004a 0000000000000009 00010000"},
		{"REMOVEXATTR", &removeXattrOp{args: removexattr4args{name: "k"}}, "0000004b 00000001 6b000000"},
		{"READ_PLUS", &readPlusOp{args: readPlus4args{stateid: sid, offset: 8, count: 16}, dest: make([]byte, 16)},
			"00000044" + sidHex + "0000000000000008 00000010"},
	}
	rpc := oncrpc.NewClient(nil, nfsProgram, nfsVersion, oncrpc.ClientOptions{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cp compound
			cp.resetMinor(rpc, oncrpc.AuthNone, "", minorVersion2)
			cp.add(tt.op)
			got := hex.EncodeToString(cp.call().Head[40:])
			if want := words("00000000 00000002 00000001" + tt.want); got != want {
				t.Fatalf("\n got %s\nwant %s", got, want)
			}
		})
	}
}

// readPlusResult decodes a READ_PLUS result body (after PUTFH) for a
// read of n bytes at off.
func readPlusResult(t testing.TB, off uint64, n int, body string) (*readPlusOp, error) {
	rpc := oncrpc.NewClient(nil, nfsProgram, nfsVersion, oncrpc.ClientOptions{})
	var cp compound
	cp.reset(rpc, oncrpc.AuthNone, "")
	cp.sequence(testSession, 7, 3, 5)
	cp.putFH([]byte{1})
	dest := bytes.Repeat([]byte{0xee}, n)
	op := &readPlusOp{args: readPlus4args{offset: off, count: uint32(n)}, dest: dest}
	cp.add(op)
	var r results
	if err := r.init(&cp, compoundReply(t, 0, "00000003"+seqOK+"00000016 00000000 00000044 00000000"+body)); err != nil {
		return op, err
	}
	if _, _, _, err := r.decodeSequence(testSession); err != nil {
		return op, err
	}
	return op, r.decodeAll(&cp)
}

func TestDecodeReadPlus(t *testing.T) {
	tests := []struct {
		name      string
		off       uint64
		n         int
		body      string
		want      string // dest[:n] in hex
		wantHoles int
		wantEOF   bool
		wantErr   error
	}{
		{"data then hole", 100, 8, "00000001 00000002 00000000 0000000000000064 00000003 61626300 00000001 0000000000000067 0000000000000005",
			"6162630000000000", 5, true, nil},
		{"hole past the request", 0, 4, "00000000 00000001 00000001 0000000000000000 0000000000001000", "00000000", 4, false, nil},
		{"gap", 0, 8, "00000001 00000001 00000000 0000000000000002 00000001 61000000", "", 0, false, ErrProtocol},
		{"data too long", 0, 2, "00000001 00000001 00000000 0000000000000000 00000003 61626300", "", 0, false, ErrProtocol},
		{"bad type", 0, 2, "00000001 00000001 00000007 0000000000000000", "", 0, false, ErrProtocol},
		{"empty and not at EOF", 0, 2, "00000000 00000000", "", 0, false, ErrProtocol},
		{"empty at EOF", 0, 2, "00000001 00000000", "", 0, true, nil},
		{"truncated", 0, 4, "00000001 00000001 00000000 0000000000000000 00000004 6162", "", 0, false, ErrProtocol},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			op, err := readPlusResult(t, tt.off, tt.n, tt.body)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("err %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if got := hex.EncodeToString(op.dest[:op.n]); got != tt.want || op.holes != tt.wantHoles || op.eof != tt.wantEOF {
				t.Fatalf("data %s holes %d eof %v, want %s %d %v", got, op.holes, op.eof, tt.want, tt.wantHoles, tt.wantEOF)
			}
		})
	}
}

// FuzzReadPlus decodes arbitrary READ_PLUS results: nothing may panic,
// the bytes filled stay within the destination, and what is reported
// read is data or zeroed hole, never the destination's old contents
// unless the reply put them there.
func FuzzReadPlus(f *testing.F) {
	f.Add(uint64(100), uint8(8), unhex(f, "00000001 00000002 00000000 0000000000000064 00000003 61626300 00000001 0000000000000067 0000000000000005"))
	f.Add(uint64(0), uint8(4), unhex(f, "00000000 00000001 00000001 0000000000000000 0000000000001000"))
	f.Fuzz(func(t *testing.T, off uint64, n uint8, body []byte) {
		op, err := readPlusResult(t, off, int(n), hex.EncodeToString(body))
		if err != nil {
			return
		}
		if op.n > int(n) || op.holes > op.n {
			t.Fatalf("read %d bytes (%d holes) into %d", op.n, op.holes, n)
		}
		if op.n == 0 && !op.eof && n > 0 {
			t.Fatal("empty result without EOF accepted")
		}
		for i, b := range op.dest[:op.n] {
			if b == 0xee && !bytes.Contains(body, []byte{0xee}) {
				t.Fatalf("byte %d of the result is the destination's old contents", i)
			}
		}
	})
}

func TestNFS42Errnos(t *testing.T) {
	for st, want := range map[Status]syscall.Errno{
		ErrNoXattr: syscall.ENODATA, ErrXattr2Big: syscall.E2BIG, ErrNotSupp: syscall.EOPNOTSUPP,
		ErrOffloadDenied: syscall.EOPNOTSUPP, ErrOffloadNoReqs: syscall.EOPNOTSUPP, ErrOpIllegal: syscall.EOPNOTSUPP,
		ErrNXIO: syscall.ENXIO, ErrWrongLFS: syscall.EINVAL,
	} {
		if got := Errno(&OpError{Op: "X", Status: st}); got != want {
			t.Errorf("%v -> %v, want %v", st, got, want)
		}
	}
}

// TestCopyOffloadCallback: a CB_OFFLOAD for an asynchronous COPY reaches
// its waiter, whether it comes before or after the waiter registers.
func TestCopyOffloadCallback(t *testing.T) {
	s := newTestCallbackServer()
	sid := StateID{Seq: 1, Other: [12]byte{7}}
	offload := func(e *xdr.Encoder) {
		e.Uint32(opCBOffload)
		e.Opaque([]byte{1, 2})
		sid.encode(e)
		e.Uint32(0)                // NFS4_OK
		e.Uint32(0)                // no callback id
		e.Uint64(12345)            // count
		e.Uint32(uint32(FileSync)) // committed
		e.FixedOpaque(make([]byte, 8))
	}
	reply := s.HandleCall(cbCall(1, cbSequence(testSession, 1, 0), offload))
	if st, res := cbStatuses(t, reply); st != StatusOK || len(res) != 2 || res[1] != [2]uint32{opCBOffload, 0} {
		t.Fatalf("CB_OFFLOAD: %v %v", st, res)
	}
	select {
	case out := <-s.c.copies.wait(sid):
		if out.err != nil || out.count != 12345 || out.committed != FileSync {
			t.Fatalf("copy outcome %+v", out)
		}
	default:
		t.Fatal("CB_OFFLOAD before the waiter was lost")
	}
}
