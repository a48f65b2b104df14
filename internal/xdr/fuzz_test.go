package xdr

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzDecoder runs a program of decoder calls (one per byte of prog:
// which item, and for lengths which maximum) over arbitrary input. While
// no error is set, what was decoded encodes back to exactly the bytes
// consumed (padding excepted: RFC 4506 s3.9 says zero, the decoder does
// not insist), opaque data aliases the input at the offset it was read
// from, and lengths are within their maximum and the input. After the
// first error the decoder consumes nothing more and returns zero values.
func FuzzDecoder(f *testing.F) {
	var e Encoder
	e.Uint32(7)
	e.Uint64(1 << 40)
	e.Bool(true)
	e.Opaque([]byte("hello"))
	e.FixedOpaque([]byte{1, 2, 3})
	f.Add([]byte{0, 1, 2, 3, 4}, e.Bytes())
	f.Add([]byte{3, 0x13, 6}, []byte{0, 0, 0, 9, 'a'})
	f.Fuzz(func(t *testing.T, prog, in []byte) {
		d := NewDecoder(in)
		var re Encoder
		var pads []int // offsets of padding bytes in in
		errOff := -1   // the offset after the call that set the error
		for i, op := range prog {
			before := d.Offset()
			failed := d.Err() != nil
			switch op & 7 {
			case 0:
				v := d.Uint32()
				if failed && v != 0 {
					t.Fatalf("op %d: %d after the error", i, v)
				}
				re.Uint32(v)
			case 1:
				v := d.Uint64()
				if failed && v != 0 {
					t.Fatalf("op %d: %d after the error", i, v)
				}
				re.Uint64(v)
			case 2:
				re.Bool(d.Bool())
			case 3, 7:
				max := int(op >> 3) // 0..31
				b := d.Opaque(max)
				if d.Err() != nil && b != nil {
					t.Fatalf("op %d: opaque %x with the error %v", i, b, d.Err())
				}
				if d.Err() == nil {
					if len(b) > max || len(b) > d.Offset()-before-4 {
						t.Fatalf("op %d: opaque of %d bytes, max %d, %d consumed", i, len(b), max, d.Offset()-before)
					}
					if len(b) > 0 && &b[0] != &in[before+4] {
						t.Fatalf("op %d: opaque does not alias the input at offset %d", i, before+4)
					}
					for p := before + 4 + len(b); p < d.Offset(); p++ {
						pads = append(pads, p)
					}
				}
				re.Opaque(b)
			case 4:
				n := int(op >> 3)
				b := d.FixedOpaque(n)
				if d.Err() == nil {
					if len(b) != n || (n > 0 && &b[0] != &in[before]) {
						t.Fatalf("op %d: fixed opaque of %d bytes (want %d) not aliasing offset %d", i, len(b), n, before)
					}
					for p := before + n; p < d.Offset(); p++ {
						pads = append(pads, p)
					}
				} else {
					b = make([]byte, n) // what the encoder would write for it
				}
				re.FixedOpaque(b)
			case 5:
				max := int(op >> 3)
				n := d.Length(max)
				if n > max || n > d.Remaining() {
					t.Fatalf("op %d: length %d, max %d, %d bytes left", i, n, max, d.Remaining())
				}
				re.Uint32(uint32(n))
			case 6:
				n := int(op >> 3)
				d.Skip(n)
				if d.Err() == nil {
					re.buf = append(re.buf, in[before:before+n]...) // raw bytes, no padding
				}
			}
			if d.Offset() < before || d.Offset() > len(in) || d.Offset()+d.Remaining() != len(in) {
				t.Fatalf("op %d: offset %d after %d, remaining %d, input %d bytes", i, d.Offset(), before, d.Remaining(), len(in))
			}
			if d.Err() != nil {
				if errOff < 0 {
					errOff = d.Offset()
				}
				if d.Offset() != errOff {
					t.Fatalf("op %d: offset moved from %d to %d after the error %v", i, errOff, d.Offset(), d.Err())
				}
			}
		}
		if err := d.Err(); err != nil {
			if !errors.Is(err, ErrShort) && !errors.Is(err, ErrTooLong) && !bytes.Contains([]byte(err.Error()), []byte("bad boolean")) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		want := bytes.Clone(in[:d.Offset()])
		for _, p := range pads {
			want[p] = 0
		}
		if !bytes.Equal(re.Bytes(), want) {
			t.Fatalf("re-encoded %x, consumed %x", re.Bytes(), want)
		}
	})
}
