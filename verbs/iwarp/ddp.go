package iwarp

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// DDP (RFC 5041 s4) and RDMAP (RFC 5040 s4) header layout.
const (
	ddpFlagTagged  = 0x80 // RFC 5041 s4.2: T
	ddpFlagLast    = 0x40 // RFC 5041 s4.2: L
	ddpVersionMask = 0x03
	ddpVersion     = 1 // RFC 5041 s4.2: DV = 01b
	rdmapVersion   = 1 // RFC 5040 s4.2: RV = 01b in the top two bits
	rdmapOpMask    = 0x0f

	taggedHdrLen   = 14 // ctl(1) rdmap(1) STag(4) TO(8)
	untaggedHdrLen = 18 // ctl(1) rdmap(1) RsvdULP(4) QN(4) MSN(4) MO(4)
	readReqLen     = 28 // RFC 5040 s4.4: sink STag, sink TO, size, source STag, source TO

	// RFC 5040 s5.1: untagged queue numbers.
	qnSend      = 0
	qnReadReq   = 1
	qnTerminate = 2
)

// RDMAP opcodes, RFC 5040 s4.3.
const (
	opWrite       = 0
	opReadReq     = 1
	opReadResp    = 2
	opSend        = 3
	opSendInv     = 4
	opSendSE      = 5
	opSendSEInv   = 6
	opTerminate   = 7
	opLastDefined = opTerminate
)

// errDDP marks malformed DDP/RDMAP headers.
var errDDP = errors.New("iwarp: malformed DDP segment")

// ddpHeader is the DDP header with the RDMAP control byte.
type ddpHeader struct {
	ctl   byte // DDP control: T, L, reserved, DV
	rctl  byte // RDMAP control: RV, reserved, opcode
	stag  uint32
	to    uint64
	rsvd  uint32 // untagged RsvdULP: the STag to invalidate for Send with Invalidate
	qn    uint32
	msn   uint32
	mo    uint32
	hdlen int
}

func (h *ddpHeader) tagged() bool   { return h.ctl&ddpFlagTagged != 0 }
func (h *ddpHeader) last() bool     { return h.ctl&ddpFlagLast != 0 }
func (h *ddpHeader) ddpVer() byte   { return h.ctl & ddpVersionMask }
func (h *ddpHeader) rdmapVer() byte { return h.rctl >> 6 }
func (h *ddpHeader) opcode() byte   { return h.rctl & rdmapOpMask }

// headerLen is the DDP header length for the control byte ctl.
func headerLen(ctl byte) int {
	if ctl&ddpFlagTagged != 0 {
		return taggedHdrLen
	}
	return untaggedHdrLen
}

func rctlFor(op byte) byte { return rdmapVersion<<6 | op }

func ctlFor(tagged, last bool) byte {
	c := byte(ddpVersion)
	if tagged {
		c |= ddpFlagTagged
	}
	if last {
		c |= ddpFlagLast
	}
	return c
}

func putTagged(b []byte, last bool, op byte, stag uint32, to uint64) int {
	b[0] = ctlFor(true, last)
	b[1] = rctlFor(op)
	binary.BigEndian.PutUint32(b[2:], stag)
	binary.BigEndian.PutUint64(b[6:], to)
	return taggedHdrLen
}

func putUntagged(b []byte, last bool, op byte, rsvd, qn, msn, mo uint32) int {
	b[0] = ctlFor(false, last)
	b[1] = rctlFor(op)
	binary.BigEndian.PutUint32(b[2:], rsvd)
	binary.BigEndian.PutUint32(b[6:], qn)
	binary.BigEndian.PutUint32(b[10:], msn)
	binary.BigEndian.PutUint32(b[14:], mo)
	return untaggedHdrLen
}

// parseDDPHeader decodes the DDP/RDMAP header at the start of a ULPDU.
func parseDDPHeader(b []byte) (ddpHeader, error) {
	var h ddpHeader
	if len(b) < 2 {
		return h, fmt.Errorf("%w: %d bytes, no control field", errDDP, len(b))
	}
	h.ctl, h.rctl = b[0], b[1]
	h.hdlen = headerLen(h.ctl)
	if len(b) < h.hdlen {
		return h, fmt.Errorf("%w: %d bytes, header needs %d", errDDP, len(b), h.hdlen)
	}
	if h.tagged() {
		h.stag = binary.BigEndian.Uint32(b[2:])
		h.to = binary.BigEndian.Uint64(b[6:])
	} else {
		h.rsvd = binary.BigEndian.Uint32(b[2:])
		h.qn = binary.BigEndian.Uint32(b[6:])
		h.msn = binary.BigEndian.Uint32(b[10:])
		h.mo = binary.BigEndian.Uint32(b[14:])
	}
	return h, nil
}

// readRequest is the RDMA Read Request payload, RFC 5040 s4.4.
type readRequest struct {
	sinkSTag uint32
	sinkTO   uint64
	size     uint32
	srcSTag  uint32
	srcTO    uint64
}

func (r *readRequest) put(b []byte) int {
	binary.BigEndian.PutUint32(b, r.sinkSTag)
	binary.BigEndian.PutUint64(b[4:], r.sinkTO)
	binary.BigEndian.PutUint32(b[12:], r.size)
	binary.BigEndian.PutUint32(b[16:], r.srcSTag)
	binary.BigEndian.PutUint64(b[20:], r.srcTO)
	return readReqLen
}

func parseReadRequest(b []byte) (readRequest, error) {
	if len(b) != readReqLen {
		return readRequest{}, fmt.Errorf("%w: RDMA Read Request of %d bytes, want %d", errDDP, len(b), readReqLen)
	}
	return readRequest{
		sinkSTag: binary.BigEndian.Uint32(b),
		sinkTO:   binary.BigEndian.Uint64(b[4:]),
		size:     binary.BigEndian.Uint32(b[12:]),
		srcSTag:  binary.BigEndian.Uint32(b[16:]),
		srcTO:    binary.BigEndian.Uint64(b[20:]),
	}, nil
}
