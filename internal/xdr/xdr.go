// Package xdr holds the External Data Representation primitives (RFC 4506)
// that rdmafs's wire codecs are written with: an append-only Encoder and a
// bounds-checked Decoder with a sticky error.
//
// The decoder never panics and never allocates to read opaque data: it
// returns sub-slices of its input, so callers that keep them must copy.
//
//	var e xdr.Encoder
//	e.Uint32(42)
//	e.Opaque([]byte("hello"))
//	d := xdr.NewDecoder(e.Bytes())
//	n := d.Uint32()
//	s := d.Opaque(1024)
//	if err := d.Err(); err != nil { ... }
package xdr

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// ErrShort reports that the input ended before the item being decoded.
var ErrShort = errors.New("xdr: input truncated")

// ErrTooLong reports a length prefix larger than the limit the caller set.
var ErrTooLong = errors.New("xdr: length exceeds limit")

// Pad returns the number of zero bytes that follow n bytes of opaque data
// (RFC 4506 s4.10: opaque data is padded to a multiple of four bytes).
func Pad(n int) int { return (4 - n&3) & 3 }

// RoundUp returns n rounded up to a multiple of four.
func RoundUp(n int) int { return (n + 3) &^ 3 }

var zeros [4]byte

// Encoder appends XDR items to a byte slice. The zero value is ready to use.
type Encoder struct {
	buf []byte
}

// NewEncoder returns an Encoder that appends to buf[:0], reusing its storage.
func NewEncoder(buf []byte) *Encoder { return &Encoder{buf: buf[:0]} }

// Reset makes the encoder append to buf[:0].
func (e *Encoder) Reset(buf []byte) { e.buf = buf[:0] }

// Bytes returns the encoded bytes.
func (e *Encoder) Bytes() []byte { return e.buf }

// Len returns the number of bytes encoded so far.
func (e *Encoder) Len() int { return len(e.buf) }

// Uint32 appends an unsigned 32-bit integer.
func (e *Encoder) Uint32(v uint32) { e.buf = binary.BigEndian.AppendUint32(e.buf, v) }

// Int32 appends a signed 32-bit integer.
func (e *Encoder) Int32(v int32) { e.Uint32(uint32(v)) }

// Uint64 appends an unsigned hyper integer.
func (e *Encoder) Uint64(v uint64) { e.buf = binary.BigEndian.AppendUint64(e.buf, v) }

// Bool appends a boolean as 0 or 1.
func (e *Encoder) Bool(v bool) {
	if v {
		e.Uint32(1)
	} else {
		e.Uint32(0)
	}
}

// FixedOpaque appends fixed-length opaque data and its padding.
func (e *Encoder) FixedOpaque(b []byte) {
	e.buf = append(e.buf, b...)
	e.buf = append(e.buf, zeros[:Pad(len(b))]...)
}

// Opaque appends variable-length opaque data: length, bytes, padding.
func (e *Encoder) Opaque(b []byte) {
	e.Uint32(uint32(len(b)))
	e.FixedOpaque(b)
}

// String appends a string as variable-length opaque data.
func (e *Encoder) String(s string) {
	e.Uint32(uint32(len(s)))
	e.buf = append(e.buf, s...)
	e.buf = append(e.buf, zeros[:Pad(len(s))]...)
}

// Reserve appends n zero bytes and returns their offset, for fields that
// are filled in later with PutUint32At.
func (e *Encoder) Reserve(n int) int {
	off := len(e.buf)
	e.buf = slices.Grow(e.buf, n)[:off+n]
	clear(e.buf[off:])
	return off
}

// PutUint32At overwrites four bytes at off with v.
func (e *Encoder) PutUint32At(off int, v uint32) {
	binary.BigEndian.PutUint32(e.buf[off:off+4], v)
}

// Decoder reads XDR items from a byte slice. After the first error every
// method returns zero values and Err reports that error.
type Decoder struct {
	buf []byte
	off int
	err error
}

// NewDecoder returns a Decoder reading b.
func NewDecoder(b []byte) *Decoder { return &Decoder{buf: b} }

// Reset makes the decoder read b from the start and clears its error.
func (d *Decoder) Reset(b []byte) { *d = Decoder{buf: b} }

// Err returns the first error the decoder met, or nil.
func (d *Decoder) Err() error { return d.err }

// SetErr records err as the decoder's error unless one is already set, so
// callers can fail decoding on a semantic check with the same mechanism.
func (d *Decoder) SetErr(err error) {
	if d.err == nil {
		d.err = err
	}
}

// Offset returns the number of bytes consumed.
func (d *Decoder) Offset() int { return d.off }

// Remaining returns the number of unread bytes.
func (d *Decoder) Remaining() int { return len(d.buf) - d.off }

// Rest returns the unread bytes without consuming them.
func (d *Decoder) Rest() []byte { return d.buf[d.off:] }

func (d *Decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.buf)-d.off {
		d.err = fmt.Errorf("%w: need %d bytes at offset %d, have %d", ErrShort, n, d.off, len(d.buf)-d.off)
		return nil
	}
	b := d.buf[d.off : d.off+n : d.off+n]
	d.off += n
	return b
}

// Uint32 reads an unsigned 32-bit integer.
func (d *Decoder) Uint32() uint32 {
	b := d.take(4)
	if b == nil {
		return 0
	}
	return binary.BigEndian.Uint32(b)
}

// Int32 reads a signed 32-bit integer.
func (d *Decoder) Int32() int32 { return int32(d.Uint32()) }

// Uint64 reads an unsigned hyper integer.
func (d *Decoder) Uint64() uint64 {
	b := d.take(8)
	if b == nil {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

// Bool reads a boolean. Values other than 0 and 1 are an error.
func (d *Decoder) Bool() bool {
	v := d.Uint32()
	if v > 1 {
		d.SetErr(fmt.Errorf("xdr: bad boolean %d at offset %d", v, d.off-4))
		return false
	}
	return v == 1
}

// FixedOpaque reads n bytes of opaque data and skips their padding. The
// result aliases the input.
func (d *Decoder) FixedOpaque(n int) []byte {
	b := d.take(n)
	d.take(Pad(n))
	if d.err != nil {
		return nil
	}
	return b
}

// Opaque reads variable-length opaque data of at most max bytes. The
// result aliases the input.
func (d *Decoder) Opaque(max int) []byte {
	n := d.Length(max)
	return d.FixedOpaque(n)
}

// Length reads a length or array count and checks it against max and
// against the bytes left (each counted item takes at least one byte on the
// wire, so a count larger than the remaining input is always an error).
func (d *Decoder) Length(max int) int {
	v := d.Uint32()
	if d.err != nil {
		return 0
	}
	if uint64(v) > uint64(max) {
		d.err = fmt.Errorf("%w: %d > %d at offset %d", ErrTooLong, v, max, d.off-4)
		return 0
	}
	if int(v) > len(d.buf)-d.off {
		d.err = fmt.Errorf("%w: length %d at offset %d, have %d", ErrShort, v, d.off-4, len(d.buf)-d.off)
		return 0
	}
	return int(v)
}

// Count reads an array's count and checks it against max and against
// the bytes left, each element taking at least minSize bytes on the wire
// (its least XDR encoding): a count its bytes cannot hold is an error
// before anything is allocated for it, so a decoder's allocations stay
// within a multiple of its input.
func (d *Decoder) Count(max, minSize int) int {
	n := d.Length(max)
	if d.err != nil || minSize <= 1 {
		return n
	}
	if left := len(d.buf) - d.off; n > left/minSize {
		d.err = fmt.Errorf("%w: %d items of at least %d bytes at offset %d, have %d", ErrShort, n, minSize, d.off-4, left)
		return 0
	}
	return n
}

// String reads a string of at most max bytes.
func (d *Decoder) String(max int) string { return string(d.Opaque(max)) }

// Skip consumes n bytes.
func (d *Decoder) Skip(n int) { d.take(n) }
