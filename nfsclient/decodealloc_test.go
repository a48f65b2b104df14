package nfsclient

import (
	"encoding/binary"
	"runtime"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// allocDecoders decode a result that holds lists, as the client does:
// LISTXATTRS (a list of strings), READDIR (entries with attributes),
// fattr4, EXCHANGE_ID (implementation ids), SECINFO_NO_NAME (flavors).
var allocDecoders = []struct {
	name   string
	decode func(b []byte)
}{
	{"LISTXATTRS4resok", func(b []byte) {
		var v listxattrs4resok
		v.decode(xdr.NewDecoder(b))
	}},
	{"READDIR4resok", func(b []byte) {
		op := &readDirOp{args: readdir4args{maxcount: 1 << 20}}
		var r results
		r.d.Reset(b)
		op.decodeRes(&r)
	}},
	{"fattr4", func(b []byte) {
		var a Attr
		decodeFattr(xdr.NewDecoder(b), &a)
	}},
	{"EXCHANGE_ID4resok", func(b []byte) {
		var v exchangeId4resok
		v.decode(xdr.NewDecoder(b))
	}},
	{"SECINFO_NO_NAME4resok", func(b []byte) {
		var v secinfoNoName4resok
		v.decode(xdr.NewDecoder(b))
	}},
}

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// allocBound is what decoding n bytes may allocate: a small multiple of
// them, and some fixed cost.
func allocBound(n int) uint64 { return 8*uint64(n) + 64<<10 }

// TestListXattrsCountBeyondBytes: a 4 MiB LISTXATTRS reply that claims
// a name for each of its bytes is refused before 4M strings are made (it
// allocated 64 MiB, 16 times the reply, before): each name takes at
// least 4 bytes.
func TestListXattrsCountBeyondBytes(t *testing.T) {
	b := make([]byte, 4<<20)
	binary.BigEndian.PutUint32(b[8:], uint32(len(b)-12)) // the count after the cookie
	var v listxattrs4resok
	d := xdr.NewDecoder(b)
	n := allocated(func() { v.decode(d) })
	if d.Err() == nil {
		t.Fatalf("decoded %d names from %d bytes", len(v.names), len(b))
	}
	if n > uint64(len(b)) {
		t.Fatalf("decoding a %d-byte reply allocated %d bytes", len(b), n)
	}
}

// FuzzDecodeAllocations decodes arbitrary bytes as results that hold
// lists: whatever a count claims, what is allocated stays within a small
// multiple of the input.
func FuzzDecodeAllocations(f *testing.F) {
	f.Add(uint8(0), []byte{0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff})
	f.Add(uint8(1), []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 'a', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add(uint8(2), []byte{0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	f.Add(uint8(3), make([]byte, 64))
	f.Fuzz(func(t *testing.T, which uint8, b []byte) {
		c := allocDecoders[int(which)%len(allocDecoders)]
		if n := allocated(func() { c.decode(b) }); n > allocBound(len(b)) {
			t.Fatalf("%s: %d bytes of input allocated %d", c.name, len(b), n)
		}
	})
}
