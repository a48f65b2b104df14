package iwarp

import (
	"encoding/binary"
	"fmt"

	"github.com/rdmafs/rdmafs/verbs"
)

// Terminate layers, RFC 5040 s7.
const (
	LayerRDMAP = 0 // RDMAP
	LayerDDP   = 1 // DDP
	LayerLLP   = 2 // MPA (lower layer protocol)
)

// Terminate error types and codes, RFC 5040 s7 (table "Terminate Error
// Codes"). Names follow the RFC's wording.
const (
	// Layer RDMAP.
	RDMAPEtypeCatastrophic     = 0
	RDMAPEtypeRemoteProtection = 1
	RDMAPEtypeRemoteOperation  = 2

	RDMAPCodeInvalidSTag      = 0x00
	RDMAPCodeBaseBounds       = 0x01
	RDMAPCodeAccessRights     = 0x02
	RDMAPCodeSTagNotAssoc     = 0x03
	RDMAPCodeTOWrap           = 0x04
	RDMAPCodeInvalidVersion   = 0x05
	RDMAPCodeUnexpectedOpcode = 0x06
	RDMAPCodeCatastrophicStrm = 0x07
	RDMAPCodeCatastrophicGlob = 0x08
	RDMAPCodeCannotInvalidate = 0x09
	RDMAPCodeUnspecified      = 0xff

	// Layer DDP.
	DDPEtypeCatastrophic = 0
	DDPEtypeTaggedBuf    = 1
	DDPEtypeUntaggedBuf  = 2

	DDPCodeTInvalidSTag  = 0x00
	DDPCodeTBaseBounds   = 0x01
	DDPCodeTSTagNotAssoc = 0x02
	DDPCodeTTOWrap       = 0x03
	DDPCodeTVersion      = 0x04
	DDPCodeUInvalidQN    = 0x01
	DDPCodeUNoBuffer     = 0x02 // invalid MSN, no buffer available
	DDPCodeUMSNRange     = 0x03
	DDPCodeUInvalidMO    = 0x04
	DDPCodeUTooLong      = 0x05
	DDPCodeUVersion      = 0x06

	// Layer LLP (MPA), RFC 5044 s8 and RFC 6581 s6.
	LLPEtypeMPA          = 0
	LLPCodeStreamLost    = 0x01
	LLPCodeCRC           = 0x02
	LLPCodeFPDUStart     = 0x03
	LLPCodeInvalidReqRep = 0x04
)

// Terminate control word flags, RFC 5040 s4.8 (HdrCt).
const (
	termFlagM = 1 << 15 // DDP Segment Length valid
	termFlagD = 1 << 14 // terminated DDP header included
	termFlagR = 1 << 13 // terminated RDMA Read Request header included
)

// Terminate is the payload of an RDMAP Terminate message (RFC 5040 s4.8).
type Terminate struct {
	Layer, EType, Code byte
	// SegLenValid and SegLen are the DDP Segment Length (M flag).
	SegLenValid bool
	SegLen      uint16
	// DDPHeader is the terminated DDP header (D flag), 14 or 18 bytes.
	DDPHeader []byte
	// ReadRequest is the terminated RDMA Read Request header (R flag).
	ReadRequest []byte
}

// String describes t.
func (t *Terminate) String() string {
	return fmt.Sprintf("terminate layer %d etype %d code %#02x", t.Layer, t.EType, t.Code)
}

// marshal appends the encoded terminate payload to b.
func (t *Terminate) marshal(b []byte) []byte {
	ctl := uint32(t.Layer&0xf)<<28 | uint32(t.EType&0xf)<<24 | uint32(t.Code)<<16
	if t.SegLenValid {
		ctl |= termFlagM
	}
	if t.DDPHeader != nil {
		ctl |= termFlagD
	}
	if t.ReadRequest != nil {
		ctl |= termFlagR
	}
	b = binary.BigEndian.AppendUint32(b, ctl)
	if t.SegLenValid || t.DDPHeader != nil {
		b = binary.BigEndian.AppendUint16(b, t.SegLen)
	}
	b = append(b, t.DDPHeader...)
	return append(b, t.ReadRequest...)
}

// parseTerminate decodes a terminate payload. RFC 5040 s4.8: the segment
// length field precedes the DDP header; the DDP header's length follows
// from its T bit.
func parseTerminate(b []byte) (Terminate, error) {
	var t Terminate
	if len(b) < 4 {
		return t, fmt.Errorf("%w: terminate of %d bytes", errDDP, len(b))
	}
	ctl := binary.BigEndian.Uint32(b)
	t.Layer, t.EType, t.Code = byte(ctl>>28), byte(ctl>>24)&0xf, byte(ctl>>16)
	b = b[4:]
	m, d, r := ctl&termFlagM != 0, ctl&termFlagD != 0, ctl&termFlagR != 0
	if m || d {
		if len(b) < 2 {
			return t, fmt.Errorf("%w: terminate lacks the segment length", errDDP)
		}
		t.SegLenValid, t.SegLen = m, binary.BigEndian.Uint16(b)
		b = b[2:]
	}
	if d {
		if len(b) < 1 {
			return t, fmt.Errorf("%w: terminate lacks the DDP header", errDDP)
		}
		n := headerLen(b[0])
		if len(b) < n {
			return t, fmt.Errorf("%w: terminated DDP header of %d bytes, need %d", errDDP, len(b), n)
		}
		t.DDPHeader = b[:n:n]
		b = b[n:]
	}
	if r {
		if len(b) < readReqLen {
			return t, fmt.Errorf("%w: terminated Read Request header of %d bytes, need %d", errDDP, len(b), readReqLen)
		}
		t.ReadRequest = b[:readReqLen:readReqLen]
	}
	return t, nil
}

// status maps a terminate to the status of the work request it ends.
func (t *Terminate) status() verbs.Status {
	switch {
	case t.Layer == LayerRDMAP && t.EType == RDMAPEtypeRemoteProtection,
		t.Layer == LayerDDP && t.EType == DDPEtypeTaggedBuf:
		return verbs.StatusRemoteAccessErr
	case t.Layer == LayerLLP:
		return verbs.StatusFatalErr
	default:
		return verbs.StatusRemoteOpErr
	}
}

// TerminateError is the error of a queue pair that a Terminate message
// ended. It wraps verbs.ErrTerminated.
type TerminateError struct {
	Terminate
	// Sent is true when this side detected the error and sent the
	// Terminate, false when the peer sent it.
	Sent bool
	// Cause is the local reason (Sent only).
	Cause error
}

// Error says who sent the Terminate and what it reported.
func (e *TerminateError) Error() string {
	if e.Sent {
		return fmt.Sprintf("iwarp: sent %v: %v", &e.Terminate, e.Cause)
	}
	return fmt.Sprintf("iwarp: peer sent %v", &e.Terminate)
}

// Unwrap returns verbs.ErrTerminated and the cause.
func (e *TerminateError) Unwrap() []error {
	if e.Cause != nil {
		return []error{verbs.ErrTerminated, e.Cause}
	}
	return []error{verbs.ErrTerminated}
}
