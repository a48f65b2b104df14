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

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var testSession = SessionID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}

// readCompound builds SEQUENCE+PUTFH+READ as Client.Read does.
func readCompound(cp *compound, rpc *oncrpc.Client, dest []byte) {
	cp.reset(rpc, oncrpc.AuthNone, "")
	cp.sequence(testSession, 7, 3, 5)
	cp.putFH([]byte{0xaa, 0xbb, 0xcc})
	cp.read(StateID{Seq: 1, Other: [12]byte{9}}, 0x1000, oncrpc.Plain(dest), new(readOut))
}

func TestReadCompoundGolden(t *testing.T) {
	rpc := oncrpc.NewClient(nil, nfsProgram, nfsVersion, oncrpc.ClientOptions{})
	var cp compound
	readCompound(&cp, rpc, make([]byte, 4096))
	call := cp.call()
	// Skip the 40-byte RPC header (XID, CALL, v2, prog, vers, proc, two
	// AUTH_NONE); the COMPOUND arguments follow (RFC 8881 s16.2.1).
	got := hex.EncodeToString(call.Head[40:])
	want := strings.Join(strings.Fields(`
		00000000 00000001 00000003
		00000035 0102030405060708090a0b0c0d0e0f10 00000007 00000003 00000005 00000000
		00000016 00000003 aabbcc00
		00000019 00000001 090000000000000000000000 0000000000001000 00001000`), "")
	if got != want {
		t.Fatalf("READ compound\n got %s\nwant %s", got, want)
	}
	if call.ReplyBulk.IsZero() || call.ReplyBulk.Len() != 4096 || !call.Bulk.IsZero() {
		t.Fatalf("READ call hints: bulk %v replybulk %d", !call.Bulk.IsZero(), call.ReplyBulk.Len())
	}
}

func TestWriteCompoundSplitsBulk(t *testing.T) {
	rpc := oncrpc.NewClient(nil, nfsProgram, nfsVersion, oncrpc.ClientOptions{})
	var cp compound
	cp.reset(rpc, oncrpc.AuthNone, "")
	cp.sequence(testSession, 1, 0, 0)
	cp.putFH([]byte{1})
	data := []byte("hello")
	cp.write(StateID{}, 8, Unstable, oncrpc.Plain(data), new(write4resok))
	cp.getAttr(fileAttrs, nil)
	call := cp.call()
	if !bytes.Equal(call.Bulk.Bytes(), data) {
		t.Fatalf("bulk %q", call.Bulk.Bytes())
	}
	// Head ends with the data length word; Tail starts with GETATTR.
	if l := call.Head[len(call.Head)-4:]; !bytes.Equal(l, []byte{0, 0, 0, 5}) {
		t.Fatalf("head ends %x, want the length 5", l)
	}
	if op := call.Tail[:4]; !bytes.Equal(op, []byte{0, 0, 0, opGetAttr}) {
		t.Fatalf("tail starts %x, want GETATTR", op)
	}
	if call.Len() != len(call.Head)+8+len(call.Tail) {
		t.Fatalf("Len %d does not count padding", call.Len())
	}
}

// reply builds a COMPOUND4res body from hex words.
func compoundReply(t testing.TB, status uint32, results string) *oncrpc.Reply {
	var e xdr.Encoder
	e.Uint32(status)
	e.String("")
	return &oncrpc.Reply{Results: append(e.Bytes(), unhex(t, results)...)}
}

const seqOK = "00000035 00000000 0102030405060708090a0b0c0d0e0f10 00000007 00000003 00000005 00000005 00000000"

func TestDecodeReadReply(t *testing.T) {
	rpc := oncrpc.NewClient(nil, nfsProgram, nfsVersion, oncrpc.ClientOptions{})
	tests := []struct {
		name    string
		reply   string
		placed  bool
		wantN   int
		wantEOF bool
		wantErr error
	}{
		{"inline data", "00000003" + seqOK + "00000016 00000000" + "00000019 00000000 00000001 00000005 6162636465000000", false, 5, true, nil},
		{"placed data", "00000003" + seqOK + "00000016 00000000" + "00000019 00000000 00000000 00000008", true, 8, false, nil},
		{"placed too long", "00000003" + seqOK + "00000016 00000000" + "00000019 00000000 00000000 00002000", true, 0, false, ErrProtocol},
		// RFC 8166 s3.4.6: the count says 9, the server wrote 8 bytes
		// into the Write chunk: the ninth byte is not data.
		{"count beyond placed", "00000003" + seqOK + "00000016 00000000" + "00000019 00000000 00000000 00000009", true, 0, false, ErrProtocol},
		{"inline too long", "00000003" + seqOK + "00000016 00000000" + "00000019 00000000 00000000 00002000", false, 0, false, ErrProtocol},
		{"truncated data", "00000003" + seqOK + "00000016 00000000" + "00000019 00000000 00000000 00000010 6162", false, 0, false, ErrProtocol},
		{"wrong op", "00000003" + seqOK + "00000016 00000000" + "00000009 00000000", false, 0, false, ErrProtocol},
		{"stale", "00000003" + seqOK + "00000016 00000046", false, 0, false, ErrStale},
		{"too many results", "00000004" + seqOK + "00000016 00000000" + "00000019 00000000 00000000 00000000 00000009 00000000", false, 0, false, ErrProtocol},
		{"too few results with OK", "00000002" + seqOK + "00000016 00000000", false, 0, false, ErrProtocol},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cp compound
			dest := make([]byte, 16)
			readCompound(&cp, rpc, dest)
			status := uint32(0)
			if tt.wantErr == ErrStale {
				status = uint32(ErrStale)
			}
			rep := compoundReply(t, status, tt.reply)
			rep.BulkPlaced = tt.placed
			if tt.placed {
				rep.BulkLen = 8 // the transport placed 8 bytes
			}
			var r results
			err := r.init(&cp, rep)
			var n int
			var eof bool
			if err == nil {
				var st Status
				st, _, _, err = r.decodeSequence(testSession)
				if err == nil && st != StatusOK {
					t.Fatalf("sequence status %v", st)
				}
			}
			if err == nil {
				err = r.voidOp(opPutFH)
			}
			if err == nil {
				n, eof, err = r.decodeRead()
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err == nil && (n != tt.wantN || eof != tt.wantEOF) {
				t.Fatalf("n=%d eof=%v, want %d %v", n, eof, tt.wantN, tt.wantEOF)
			}
			if tt.name == "inline data" && string(dest[:5]) != "abcde" {
				t.Fatalf("data %q", dest[:5])
			}
		})
	}
}

func TestDecodeAttrs(t *testing.T) {
	// type=REG size=4097 mode=0644 owner="1000" owner_group="users@example.org" mtime
	var v xdr.Encoder
	v.Uint32(uint32(TypeReg))
	v.Uint64(4097)
	v.Uint32(0o100644)
	v.String("1000")
	v.String("nobody-such-group-xyz@example.org")
	v.Uint64(1700000000)
	v.Uint32(5)
	var e xdr.Encoder
	bitmapOf(attrType, attrSize, attrMode, attrOwner, attrOwnerGroup, attrTimeModify).encode(&e)
	e.Opaque(v.Bytes())
	var a Attr
	d := xdr.NewDecoder(e.Bytes())
	decodeFattr(d, &a)
	if err := d.Err(); err != nil {
		t.Fatal(err)
	}
	if a.Type != TypeReg || a.Size != 4097 || a.Mode != 0o644 || a.UID != 1000 || a.GID != nobody || a.Mtime.Unix() != 1700000000 {
		t.Fatalf("attrs %+v", a)
	}
	// An attribute that was not asked for cannot be skipped: error.
	e.Reset(nil)
	bitmapOf(attrType, 12).encode(&e)
	e.Opaque([]byte{0, 0, 0, 1, 0, 0, 0, 0})
	d = xdr.NewDecoder(e.Bytes())
	decodeFattr(d, &a)
	if d.Err() == nil {
		t.Fatal("undecodable attribute accepted")
	}
	// Values shorter than the bitmap says.
	e.Reset(nil)
	bitmapOf(attrType, attrSize).encode(&e)
	e.Opaque([]byte{0, 0, 0, 1})
	d = xdr.NewDecoder(e.Bytes())
	decodeFattr(d, &a)
	if d.Err() == nil {
		t.Fatal("truncated attribute values accepted")
	}
}

func TestSetAttrEncoding(t *testing.T) {
	var e xdr.Encoder
	size := uint64(10)
	mode := uint32(0o4755)
	uid := uint32(0)
	(&SetAttr{Size: &size, Mode: &mode, UID: &uid, MtimeNow: true}).encode(&e)
	want := "00000002 00000010 00400012 00000018 000000000000000a 000009ed 00000001 30000000 00000000"
	if got := hex.EncodeToString(e.Bytes()); got != strings.Join(strings.Fields(want), "") {
		t.Fatalf("got %s", got)
	}
}

func TestErrnoMapping(t *testing.T) {
	for st, want := range map[Status]string{
		ErrNoEnt: "no such file or directory", ErrExist: "file exists", ErrNotEmpty: "directory not empty",
		ErrAccess: "permission denied", ErrStale: "stale file handle", ErrServerFault: "input/output error",
		ErrROFS: "read-only file system", ErrNameTooLong: "file name too long",
	} {
		if got := st.Errno().Error(); got != want {
			t.Errorf("%v -> %q, want %q", st, got, want)
		}
		if got := Errno(&OpError{Op: "X", Status: st}).Error(); got != want {
			t.Errorf("wrapped %v -> %q", st, got)
		}
	}
	if Errno(oncrpc.ErrTimeout).Error() != "connection timed out" {
		t.Errorf("timeout maps to %v", Errno(oncrpc.ErrTimeout))
	}
}

func TestSlotTable(t *testing.T) {
	st := newSlotTable(2)
	ctx := t.Context()
	s0, q0, _, _ := st.acquire(ctx)
	s1, _, h, _ := st.acquire(ctx)
	if s0 != 0 || s1 != 1 || q0 != 1 || h != 1 {
		t.Fatalf("slots %d %d seq %d highest %d", s0, s1, q0, h)
	}
	st.release(0, slotProcessed, -1)
	if s, q, _, _ := st.acquire(ctx); s != 0 || q != 2 {
		t.Fatalf("reacquired slot %d seq %d, want 0 2", s, q)
	}
	// A slot whose outcome is unknown is never reused.
	st.release(0, slotUnknown, -1)
	st.release(1, slotProcessed, -1)
	if s, _, _, _ := st.acquire(ctx); s != 1 {
		t.Fatalf("got slot %d, want 1 (0 is retired)", s)
	}
	st.release(1, slotUnknown, -1)
	if _, _, _, err := st.acquire(ctx); !errors.Is(err, errNoSlots) {
		t.Fatalf("all slots retired: err = %v", err)
	}
}
