package xdr

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var e Encoder
	e.Uint32(7)
	e.Uint64(1 << 40)
	e.Bool(true)
	e.Opaque([]byte("abcde"))
	e.String("xy")
	e.FixedOpaque([]byte{1, 2, 3, 4, 5, 6, 7, 8})
	want := "00000007" + "0000010000000000" + "00000001" + "00000005" + "6162636465000000" + "00000002" + "78790000" + "0102030405060708"
	if got := hex.EncodeToString(e.Bytes()); got != want {
		t.Fatalf("encoding\n got %s\nwant %s", got, want)
	}
	d := NewDecoder(e.Bytes())
	if d.Uint32() != 7 || d.Uint64() != 1<<40 || !d.Bool() {
		t.Fatal("scalar mismatch")
	}
	if b := d.Opaque(5); !bytes.Equal(b, []byte("abcde")) {
		t.Fatalf("opaque %q", b)
	}
	if s := d.String(10); s != "xy" {
		t.Fatalf("string %q", s)
	}
	if b := d.FixedOpaque(8); len(b) != 8 || b[7] != 8 {
		t.Fatalf("fixed %v", b)
	}
	if d.Err() != nil || d.Remaining() != 0 {
		t.Fatalf("err %v remaining %d", d.Err(), d.Remaining())
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		dec  func(d *Decoder)
		want error
	}{
		{"short uint32", "000000", func(d *Decoder) { d.Uint32() }, ErrShort},
		{"opaque over limit", "00000010" + "00", func(d *Decoder) { d.Opaque(8) }, ErrTooLong},
		{"opaque past end", "00000008" + "0102", func(d *Decoder) { d.Opaque(100) }, ErrShort},
		{"missing pad", "00000003" + "010203", func(d *Decoder) { d.Opaque(100) }, ErrShort},
		{"huge length", "ffffffff", func(d *Decoder) { d.Opaque(1 << 30) }, ErrTooLong},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, _ := hex.DecodeString(tt.in)
			d := NewDecoder(b)
			tt.dec(d)
			if !errors.Is(d.Err(), tt.want) {
				t.Fatalf("err = %v, want %v", d.Err(), tt.want)
			}
			// sticky: later reads return zero values
			if d.Uint32() != 0 || d.Err() == nil {
				t.Fatal("error not sticky")
			}
		})
	}
}

func TestBadBool(t *testing.T) {
	d := NewDecoder([]byte{0, 0, 0, 2})
	d.Bool()
	if d.Err() == nil {
		t.Fatal("bool 2 accepted")
	}
}

// TestCount: a count is bounded by the bytes left over the elements'
// least size, where Length bounds it by the bytes alone.
func TestCount(t *testing.T) {
	b := []byte{0, 0, 0, 3, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
	if n := NewDecoder(b).Length(100); n != 3 {
		t.Fatalf("Length = %d, want 3", n)
	}
	for _, tc := range []struct {
		min, want int
		ok        bool
	}{{1, 3, true}, {2, 3, true}, {3, 3, true}, {4, 0, false}, {16, 0, false}} {
		d := NewDecoder(b)
		if n := d.Count(100, tc.min); n != tc.want || (d.Err() == nil) != tc.ok {
			t.Errorf("Count(100, %d) = %d, %v; want %d, ok %v", tc.min, n, d.Err(), tc.want, tc.ok)
		}
	}
}
