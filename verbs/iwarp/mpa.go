package iwarp

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/rdmafs/rdmafs/verbs"
)

// MPA connection setup frames, RFC 5044 s7.1 and RFC 6581 s5.
const (
	mpaKeyReq = "MPA ID Req Frame"
	mpaKeyRep = "MPA ID Rep Frame"

	mpaFlagMarkers  = 0x80 // M: the sender wants markers (we refuse them)
	mpaFlagCRC      = 0x40 // C: the sender wants CRC
	mpaFlagReject   = 0x20 // R: reply only, the request is rejected
	mpaFlagEnhanced = 0x10 // RFC 6581 s5: enhanced connection setup (IRD/ORD word)
	mpaFlagReserved = 0x0f

	mpaHeaderLen = 20
	// RFC 5044 s7.1: "Private data length ... MUST be less than or equal
	// to 512".
	mpaMaxPrivateData = 512
	// The RFC 6581 s5 IRD/ORD word at the start of enhanced private data.
	irdOrdLen  = 4
	irdOrdMask = 0x3fff
)

// mpaFrame is an MPA Request or Reply frame.
type mpaFrame struct {
	reply bool
	flags byte
	rev   byte
	// pdata is the raw private data: with the enhanced flag it starts
	// with the IRD/ORD word.
	pdata []byte
}

// errMPA marks malformed MPA frames and failed negotiations.
var errMPA = errors.New("iwarp: MPA protocol error")

// RejectedError is returned by Dial when the peer answers with an MPA
// Reply whose R bit is set (RFC 5044 s7.1.2). It wraps verbs.ErrRejected.
type RejectedError struct {
	Rev         byte   // the revision in the reply
	Flags       byte   // the reply's flags byte
	PrivateData []byte // the reply's private data (raw)
}

// Error describes the rejection.
func (e *RejectedError) Error() string {
	return fmt.Sprintf("iwarp: MPA reply rev %d flags %#02x rejected the request (%d bytes private data)",
		e.Rev, e.Flags, len(e.PrivateData))
}

// Unwrap returns verbs.ErrRejected.
func (e *RejectedError) Unwrap() error { return verbs.ErrRejected }

// marshal encodes f: key(16) flags(1) rev(1) pdlen(2) pdata.
func (f *mpaFrame) marshal() []byte {
	b := make([]byte, mpaHeaderLen+len(f.pdata))
	if f.reply {
		copy(b, mpaKeyRep)
	} else {
		copy(b, mpaKeyReq)
	}
	b[16] = f.flags
	b[17] = f.rev
	binary.BigEndian.PutUint16(b[18:], uint16(len(f.pdata)))
	copy(b[20:], f.pdata)
	return b
}

// parseMPAHeader checks the fixed 20 bytes of an MPA frame and returns the
// frame without private data and the private data length.
func parseMPAHeader(b []byte) (mpaFrame, int, error) {
	var f mpaFrame
	if len(b) < mpaHeaderLen {
		return f, 0, fmt.Errorf("%w: frame of %d bytes, need %d", errMPA, len(b), mpaHeaderLen)
	}
	switch string(b[:16]) {
	case mpaKeyReq:
	case mpaKeyRep:
		f.reply = true
	default:
		return f, 0, fmt.Errorf("%w: bad key %q", errMPA, b[:16])
	}
	f.flags, f.rev = b[16], b[17]
	n := int(binary.BigEndian.Uint16(b[18:]))
	if n > mpaMaxPrivateData {
		return f, 0, fmt.Errorf("%w: private data length %d > %d", errMPA, n, mpaMaxPrivateData)
	}
	return f, n, nil
}

// parseMPAFrame parses a whole frame from b and returns it and the number
// of bytes it used.
func parseMPAFrame(b []byte) (mpaFrame, int, error) {
	f, n, err := parseMPAHeader(b)
	if err != nil {
		return f, 0, err
	}
	if len(b)-mpaHeaderLen < n {
		return f, 0, fmt.Errorf("%w: private data truncated: %d of %d bytes", errMPA, len(b)-mpaHeaderLen, n)
	}
	f.pdata = b[mpaHeaderLen : mpaHeaderLen+n]
	return f, mpaHeaderLen + n, nil
}

// enhanced reports whether the frame carries the RFC 6581 IRD/ORD word.
func (f *mpaFrame) enhanced() bool {
	return f.rev == 2 && f.flags&mpaFlagEnhanced != 0 && len(f.pdata) >= irdOrdLen
}

// irdOrd decodes the RFC 6581 s5 IRD/ORD word (bits 31..16 IRD with the
// peer-to-peer and zero-length-Send-RTR flags, bits 15..0 ORD with the
// zero-length Write/Read RTR flags, each depth in the low 14 bits).
func (f *mpaFrame) irdOrd() (ird, ord int, ctl uint16) {
	if !f.enhanced() {
		return 0, 0, 0
	}
	i := binary.BigEndian.Uint16(f.pdata)
	o := binary.BigEndian.Uint16(f.pdata[2:])
	return int(i & irdOrdMask), int(o & irdOrdMask), i&^irdOrdMask | (o&^irdOrdMask)>>2
}

// ulpData returns the upper layer's private data.
func (f *mpaFrame) ulpData() []byte {
	if f.enhanced() {
		return f.pdata[irdOrdLen:]
	}
	return f.pdata
}

// enhancedPData builds enhanced private data: IRD/ORD word then ulp.
func enhancedPData(ird, ord int, ulp []byte) []byte {
	b := make([]byte, irdOrdLen+len(ulp))
	binary.BigEndian.PutUint16(b, uint16(clampDepth(ird)))
	binary.BigEndian.PutUint16(b[2:], uint16(clampDepth(ord)))
	copy(b[irdOrdLen:], ulp)
	return b
}

func clampDepth(n int) int {
	if n < 0 {
		return 0
	}
	if n > irdOrdMask {
		return irdOrdMask
	}
	return n
}

// readMPAFrame reads one frame from r.
func readMPAFrame(r *bufio.Reader) (mpaFrame, error) {
	var hdr [mpaHeaderLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return mpaFrame{}, fmt.Errorf("iwarp: read MPA frame: %w", err)
	}
	f, n, err := parseMPAHeader(hdr[:])
	if err != nil {
		return f, err
	}
	f.pdata = make([]byte, n)
	if _, err := io.ReadFull(r, f.pdata); err != nil {
		return f, fmt.Errorf("iwarp: read MPA private data: %w", err)
	}
	return f, nil
}

// negotiated is the result of the MPA exchange.
type negotiated struct {
	crc      bool
	ird, ord int    // effective local depths
	peerPD   []byte // the peer's upper-layer private data
	active   bool   // we are the initiator
}

// withDeadline applies ctx to conn for the duration of the MPA exchange.
// The returned function clears the deadline; it fails if ctx ended first
// (the connection may then carry an expired deadline).
func withDeadline(ctx context.Context, conn net.Conn) func() error {
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(aLongTimeAgo) })
	return func() error {
		if !stop() {
			return fmt.Errorf("iwarp: MPA exchange: %w", ctx.Err())
		}
		return conn.SetDeadline(noDeadline)
	}
}

// mpaInitiate runs the active side: send the Request, read the Reply.
// RFC 6581: we always speak revision 2 with the enhanced flag and send
// IRD >= 1 (Linux siw/knfsd reject IRD 0).
func mpaInitiate(ctx context.Context, conn net.Conn, br *bufio.Reader, p *params) (negotiated, error) {
	done := withDeadline(ctx, conn)
	n, err := mpaInitiateFrames(ctx, conn, br, p)
	if derr := done(); err == nil {
		err = derr
	}
	return n, err
}

func mpaInitiateFrames(ctx context.Context, conn net.Conn, br *bufio.Reader, p *params) (negotiated, error) {
	req := mpaFrame{flags: mpaFlagEnhanced, rev: 2, pdata: enhancedPData(max(p.ird, 1), p.ord, p.pdata)}
	if p.crc {
		req.flags |= mpaFlagCRC
	}
	if len(req.pdata) > mpaMaxPrivateData {
		return negotiated{}, fmt.Errorf("iwarp: %d bytes private data, at most %d: %w",
			len(p.pdata), mpaMaxPrivateData-irdOrdLen, verbs.ErrInvalidWR)
	}
	if _, err := conn.Write(req.marshal()); err != nil {
		return negotiated{}, fmt.Errorf("iwarp: send MPA request: %w", ctxErr(ctx, err))
	}
	rep, err := readMPAFrame(br)
	if err != nil {
		return negotiated{}, ctxErr(ctx, err)
	}
	if !rep.reply {
		return negotiated{}, fmt.Errorf("%w: expected MPA Reply, got a Request", errMPA)
	}
	if rep.flags&mpaFlagReject != 0 {
		return negotiated{}, &RejectedError{Rev: rep.rev, Flags: rep.flags, PrivateData: rep.pdata}
	}
	if rep.rev != 1 && rep.rev != 2 {
		return negotiated{}, fmt.Errorf("%w: reply revision %d", errMPA, rep.rev)
	}
	// RFC 5044 s7.1.1: we asked for no markers, so markers in the reply
	// direction are refused.
	if rep.flags&mpaFlagMarkers != 0 {
		return negotiated{}, fmt.Errorf("%w: peer requires markers", errMPA)
	}
	n := negotiated{crc: p.crc || rep.flags&mpaFlagCRC != 0, ird: p.ird, ord: p.ord, peerPD: rep.ulpData(), active: true}
	if rep.enhanced() {
		peerIRD, _, _ := rep.irdOrd()
		n.ord = min(p.ord, peerIRD)
	}
	return n, nil
}

// mpaRespond runs the passive side: read the Request, let the upper layer
// decide, send the Reply. RFC 6581: revision 1 and 2 are accepted.
// prepare runs after the decision to accept and before the Reply is sent;
// an error turns the Reply into a reject.
func mpaRespond(ctx context.Context, conn net.Conn, br *bufio.Reader, p *params, prepare func(negotiated) error) (negotiated, error) {
	done := withDeadline(ctx, conn)
	n, err := mpaRespondFrames(ctx, conn, br, p, prepare)
	if derr := done(); err == nil {
		err = derr
	}
	return n, err
}

func mpaRespondFrames(ctx context.Context, conn net.Conn, br *bufio.Reader, p *params, prepare func(negotiated) error) (negotiated, error) {
	req, err := readMPAFrame(br)
	if err != nil {
		return negotiated{}, ctxErr(ctx, err)
	}
	if req.reply {
		return negotiated{}, fmt.Errorf("%w: expected MPA Request, got a Reply", errMPA)
	}
	reject := func(rev byte, why error) (negotiated, error) {
		rep := mpaFrame{reply: true, flags: mpaFlagReject, rev: rev}
		_, _ = conn.Write(rep.marshal())
		return negotiated{}, why
	}
	if req.rev != 1 && req.rev != 2 {
		return reject(2, fmt.Errorf("%w: request revision %d", errMPA, req.rev))
	}
	if req.flags&mpaFlagMarkers != 0 {
		return reject(req.rev, fmt.Errorf("%w: initiator requires markers", errMPA))
	}
	n := negotiated{crc: p.crc || req.flags&mpaFlagCRC != 0, ird: p.ird, ord: p.ord, peerPD: req.ulpData()}
	peerIRD, peerORD := n.ord, 0
	if req.enhanced() {
		peerIRD, peerORD, _ = req.irdOrd()
		n.ord = min(p.ord, peerIRD)
	}
	replyPD := p.pdata
	if p.onConnect != nil {
		cr := &verbs.ConnRequest{RemoteAddr: conn.RemoteAddr(), PrivateData: n.peerPD, IRD: peerIRD, ORD: peerORD, CRC: req.flags&mpaFlagCRC != 0}
		pd, err := p.onConnect(cr)
		if err != nil {
			return reject(req.rev, fmt.Errorf("iwarp: connection request refused by upper layer: %w", err))
		}
		if pd != nil {
			replyPD = pd
		}
	}
	rep := mpaFrame{reply: true, rev: req.rev, pdata: replyPD}
	if req.enhanced() {
		rep.flags |= mpaFlagEnhanced
		rep.pdata = enhancedPData(n.ird, n.ord, replyPD)
	}
	if n.crc {
		rep.flags |= mpaFlagCRC
	}
	if len(rep.pdata) > mpaMaxPrivateData {
		return reject(req.rev, fmt.Errorf("iwarp: %d bytes reply private data: %w", len(replyPD), verbs.ErrInvalidWR))
	}
	if prepare != nil {
		if err := prepare(n); err != nil {
			return reject(req.rev, fmt.Errorf("iwarp: queue pair setup: %w", err))
		}
	}
	if _, err := conn.Write(rep.marshal()); err != nil {
		return negotiated{}, fmt.Errorf("iwarp: send MPA reply: %w", ctxErr(ctx, err))
	}
	return n, nil
}

// ctxErr prefers the context's error when the context ended.
func ctxErr(ctx context.Context, err error) error {
	if ce := ctx.Err(); ce != nil {
		return fmt.Errorf("%w (%v)", ce, err)
	}
	return err
}
