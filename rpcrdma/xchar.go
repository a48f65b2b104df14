package rpcrdma

import (
	"errors"
	"fmt"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// Transport characteristics (draft-dnoveck-nfsv4-rpcrdma-xcharext-02, the
// version-2 extension carried in RDMA_OPTIONAL messages).

// Optional operation codes: values of rdma_opttype (xcharext s5.2).
const (
	OptInitXch = 1 // ROPT_INITXCH: initial characteristics, one-way
	OptReqXch  = 2 // ROPT_REQXCH: request a change, answered by RESPXCH
	OptRespXch = 3 // ROPT_RESPXCH: answer to REQXCH
	OptUpdXch  = 4 // ROPT_UPDXCH: a characteristic changed, one-way
)

// Characteristic ids (xcharext s3).
const (
	XCharRBSize    = 1 // XCHAR_RBSIZ: receive buffer size, uint32, default 4096
	XCharReqRemInv = 2 // XCHAR_REQREMINV: requester accepts remote invalidation, bool, default FALSE
	XCharBRS       = 3 // XCHAR_BRS: backward request support, enum bkreqsup, default INLINE

	// xcharExperimentalFirst starts the experimental id range (xcharext
	// s6.2): accepted and ignored unless configured.
	xcharExperimentalFirst = 0xFFFFFF00
)

// Backward request support levels (enum bkreqsup, xcharext s3.3).
const (
	BRSNone   = 0 // no backward calls
	BRSInline = 1 // backward calls and replies inline only
	BRSGenl   = 2 // backward messages may use chunks
)

// Bounds for decoded characteristics (xcharext s7: values travel in the
// clear and are range-checked before use; s2.1: a value that does not
// decode is an XDR error).
const (
	minRBSize      = 1024
	maxRBSize      = 1 << 20
	maxXCharVals   = 64
	maxXCharData   = 1024
	maxSubsetWords = 8
)

// errXDR marks a characteristic message that does not decode (xcharext
// s2.1 asks for an XDR error to be reported and names no code); it is
// answered with RDMA_ERROR / BAD_HEADER, the version-2 code for a header
// that does not decode (v2 draft s4.2).
var errXDR = errors.New("rpcrdma: malformed transport characteristics")

// XCharVal is one characteristic: its id and its XDR-encoded value.
type XCharVal struct {
	Which uint32
	Data  []byte
}

// Subset is an xcharsubset: element N of an xcharspec is bit N mod 32 of
// word N div 32 (xcharext s2.1), bit 0 being the least significant bit
// (the draft does not say; this is the NFSv4 bitmap4 convention); missing
// words read as zero.
type Subset []uint32

// Has reports whether element n is in the subset.
func (s Subset) Has(n int) bool {
	return n/32 < len(s) && s[n/32]&(1<<(n%32)) != 0
}

// With returns s with element n added.
func (s Subset) With(n int) Subset {
	for len(s) <= n/32 {
		s = append(s, 0)
	}
	s[n/32] |= 1 << (n % 32)
	return s
}

func encodeSubset(e *xdr.Encoder, s Subset) {
	e.Uint32(uint32(len(s)))
	for _, w := range s {
		e.Uint32(w)
	}
}

func decodeSubset(d *xdr.Decoder) Subset {
	n := d.Length(maxSubsetWords)
	s := make(Subset, 0, n)
	for range n {
		s = append(s, d.Uint32())
	}
	return s
}

func encodeSpec(e *xdr.Encoder, spec []XCharVal) {
	e.Uint32(uint32(len(spec)))
	for _, v := range spec {
		e.Uint32(v.Which)
		e.Opaque(v.Data)
	}
}

// decodeSpec decodes an xcharspec; an xchv_data that runs past the
// message is an XDR error (xcharext s2.1).
func decodeSpec(d *xdr.Decoder) []XCharVal {
	n := d.Length(maxXCharVals)
	spec := make([]XCharVal, 0, n)
	for range n {
		w := d.Uint32()
		spec = append(spec, XCharVal{Which: w, Data: d.Opaque(maxXCharData)})
	}
	return spec
}

// Uint32Val, BoolVal and EnumVal encode a characteristic's value.
func Uint32Val(which, v uint32) XCharVal {
	var e xdr.Encoder
	e.Uint32(v)
	return XCharVal{Which: which, Data: e.Bytes()}
}

// BoolVal encodes a boolean characteristic.
func BoolVal(which uint32, v bool) XCharVal {
	var e xdr.Encoder
	e.Bool(v)
	return XCharVal{Which: which, Data: e.Bytes()}
}

// InitXch is the optinfo of ROPT_INITXCH (xcharext s4.1).
type InitXch struct {
	Start []XCharVal
	NoChg Subset // characteristics that will not change
}

// ReqXch is the optinfo of ROPT_REQXCH (xcharext s4.2).
type ReqXch struct{ Want []XCharVal }

// RespXch is the optinfo of ROPT_RESPXCH (xcharext s4.3).
type RespXch struct{ Done, Rej, Pend Subset }

// UpdXch is the optinfo of ROPT_UPDXCH (xcharext s4.4).
type UpdXch struct {
	Now     XCharVal
	PendClr bool
}

// Marshal encodes the optinfo.
func (m InitXch) Marshal() []byte {
	var e xdr.Encoder
	encodeSpec(&e, m.Start)
	encodeSubset(&e, m.NoChg)
	return e.Bytes()
}

// Marshal encodes the optinfo.
func (m ReqXch) Marshal() []byte {
	var e xdr.Encoder
	encodeSpec(&e, m.Want)
	return e.Bytes()
}

// Marshal encodes the optinfo.
func (m RespXch) Marshal() []byte {
	var e xdr.Encoder
	encodeSubset(&e, m.Done)
	encodeSubset(&e, m.Rej)
	encodeSubset(&e, m.Pend)
	return e.Bytes()
}

// Marshal encodes the optinfo.
func (m UpdXch) Marshal() []byte {
	var e xdr.Encoder
	e.Uint32(m.Now.Which)
	e.Opaque(m.Now.Data)
	e.Bool(m.PendClr)
	return e.Bytes()
}

// decodeOptInfo decodes b whole with f; leftover or missing bytes are
// XDR errors, and decoding never goes beyond rdma_optinfo (v2 draft
// s3.1: the optinfo is opaque to the core protocol).
func decodeOptInfo(b []byte, f func(d *xdr.Decoder)) error {
	d := xdr.NewDecoder(b)
	f(d)
	if err := d.Err(); err != nil {
		return fmt.Errorf("%w: %v", errXDR, err)
	}
	if d.Remaining() != 0 {
		return fmt.Errorf("%w: %d bytes after the optinfo", errXDR, d.Remaining())
	}
	return nil
}

// ParseInitXch decodes ROPT_INITXCH optinfo.
func ParseInitXch(b []byte) (m InitXch, err error) {
	err = decodeOptInfo(b, func(d *xdr.Decoder) { m.Start, m.NoChg = decodeSpec(d), decodeSubset(d) })
	return m, err
}

// ParseReqXch decodes ROPT_REQXCH optinfo.
func ParseReqXch(b []byte) (m ReqXch, err error) {
	err = decodeOptInfo(b, func(d *xdr.Decoder) { m.Want = decodeSpec(d) })
	return m, err
}

// ParseRespXch decodes ROPT_RESPXCH optinfo.
func ParseRespXch(b []byte) (m RespXch, err error) {
	err = decodeOptInfo(b, func(d *xdr.Decoder) { m.Done, m.Rej, m.Pend = decodeSubset(d), decodeSubset(d), decodeSubset(d) })
	return m, err
}

// ParseUpdXch decodes ROPT_UPDXCH optinfo.
func ParseUpdXch(b []byte) (m UpdXch, err error) {
	err = decodeOptInfo(b, func(d *xdr.Decoder) {
		m.Now.Which = d.Uint32()
		m.Now.Data = d.Opaque(maxXCharData)
		m.PendClr = d.Bool()
	})
	return m, err
}

// Chars are the characteristics of one endpoint, as announced or learned.
type Chars struct {
	RBSize    uint32 // receive buffer size
	ReqRemInv bool   // accepts Send With Invalidate
	BRS       uint32 // backward request support
}

// DefaultChars are the values that hold until an INITXCH says otherwise
// (xcharext s3, Table 1).
var DefaultChars = Chars{RBSize: 4096, ReqRemInv: false, BRS: BRSInline}

// Spec returns the characteristics as an xcharspec, in id order.
func (c Chars) Spec() []XCharVal {
	return []XCharVal{Uint32Val(XCharRBSize, c.RBSize), BoolVal(XCharReqRemInv, c.ReqRemInv), Uint32Val(XCharBRS, c.BRS)}
}

// apply sets one characteristic from v. Unknown and experimental ids are
// ignored (xcharext s2.1, s4.1, s6.2); known ones must decode as their
// type and lie in range, else the message is an XDR error (s2.1, s7).
func (c *Chars) apply(v XCharVal) (known bool, err error) {
	d := xdr.NewDecoder(v.Data)
	switch v.Which {
	case XCharRBSize:
		n := d.Uint32()
		if d.Err() == nil && d.Remaining() == 0 && (n < minRBSize || n > maxRBSize) {
			return true, fmt.Errorf("%w: XCHAR_RBSIZ %d out of range", errXDR, n)
		}
		if err := checkValue(d, v); err != nil {
			return true, err
		}
		c.RBSize = n
	case XCharReqRemInv:
		b := d.Bool()
		if err := checkValue(d, v); err != nil {
			return true, err
		}
		c.ReqRemInv = b
	case XCharBRS:
		n := d.Uint32()
		if d.Err() == nil && n > BRSGenl {
			return true, fmt.Errorf("%w: XCHAR_BRS %d out of range", errXDR, n)
		}
		if err := checkValue(d, v); err != nil {
			return true, err
		}
		c.BRS = n
	default:
		return false, nil
	}
	return true, nil
}

func checkValue(d *xdr.Decoder, v XCharVal) error {
	if err := d.Err(); err != nil {
		return fmt.Errorf("%w: characteristic %d: %v", errXDR, v.Which, err)
	}
	if d.Remaining() != 0 {
		return fmt.Errorf("%w: characteristic %d has %d extra bytes", errXDR, v.Which, d.Remaining())
	}
	return nil
}

// applySpec applies every characteristic of spec to a copy of c, the last
// occurrence of an id winning (xcharext s2.1 imposes no order and says
// nothing of duplicates). On an XDR error nothing changes.
func (c *Chars) applySpec(spec []XCharVal) error {
	next := *c
	for _, v := range spec {
		if _, err := next.apply(v); err != nil {
			return err
		}
	}
	*c = next
	return nil
}

// xchAnswer is how a ROPT_RESPXCH answers one requested change.
type xchAnswer int

const (
	xchRej  xchAnswer = iota // refused
	xchDone                  // in effect
	xchPend                  // granted, in effect later (an UPDXCH tells when)
)

// answerReqXch answers a request to change the characteristics ours
// (xcharext s4.3): each entry is applied to ours on its own and decide
// judges the characteristics that would result, want. An unknown or
// malformed entry is rejected, and so is a later duplicate of an id:
// s2.1 imposes no order and says nothing of duplicates, so each id is
// answered once. Done, Rej and Pend come out disjoint and cover the
// request.
func answerReqXch(m ReqXch, ours Chars, decide func(v XCharVal, want Chars) xchAnswer) RespXch {
	var r RespXch
	seen := make(map[uint32]bool, len(m.Want))
	for i, v := range m.Want {
		ans := xchRej
		if !seen[v.Which] {
			seen[v.Which] = true
			want := ours
			if known, err := want.apply(v); known && err == nil {
				ans = decide(v, want)
			}
		}
		switch ans {
		case xchDone:
			r.Done = r.Done.With(i)
		case xchPend:
			r.Pend = r.Pend.With(i)
		default:
			r.Rej = r.Rej.With(i)
		}
	}
	return r
}
