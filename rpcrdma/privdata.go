package rpcrdma

import (
	"encoding/binary"
	"fmt"
)

// RFC 8797 s5.1: RPC-over-RDMA connection parameters in CM private data.
const (
	privDataMagic   = 0xf6ab0e18
	privDataVersion = 1
	privDataLen     = 8
	// privFlagRemoteInvalidate: the sender accepts Send With Invalidate
	// (RFC 8797 s5.1).
	privFlagRemoteInvalidate = 0x01
	// maxEncodedInline is the largest size the 8-bit encoding can carry:
	// (255+1)*1024.
	maxEncodedInline = 256 * 1024
)

// PrivateData is the RPC-over-RDMA connection private data of RFC 8797.
type PrivateData struct {
	Version          uint8
	RemoteInvalidate bool // the sender accepts Send With Invalidate
	InlineSend       int  // the sender's inline send size in bytes
	InlineRecv       int  // the sender's inline receive size in bytes
}

// Marshal encodes p; sizes are rounded down to a multiple of 1 KiB and
// encoded as size/1024 - 1 (RFC 8797 s5.1).
func (p PrivateData) Marshal() []byte {
	b := make([]byte, privDataLen)
	binary.BigEndian.PutUint32(b, privDataMagic)
	b[4] = privDataVersion
	if p.RemoteInvalidate {
		b[5] = privFlagRemoteInvalidate
	}
	b[6] = encodeInline(p.InlineSend)
	b[7] = encodeInline(p.InlineRecv)
	return b
}

// recvFloor raises a configured receive size to the least one the
// private data can announce: its encoding has no size below 1024
// (RFC 8797 s5.1), and RFC 8166 s3.3.3 makes 1024 bytes the least every
// connection provides. Announcing 1024 over smaller receive buffers
// would make a peer's well-sized Send break the connection.
func recvFloor(n int) int { return max(n, 1024) }

// encodeInline encodes a size, rounded down to a multiple of 1 KiB (we
// never announce more than we have); sizes below 1024 cannot be encoded
// and come out as 1024, which is why receive sizes go through recvFloor.
func encodeInline(n int) uint8 {
	n = min(max(n, 1024), maxEncodedInline)
	return uint8(n/1024 - 1)
}

// ParsePrivateData decodes RFC 8797 private data. ok is false when b does
// not carry it (no magic, or too short): the peer then gets the defaults
// of RFC 8166 s3.3.3 (1024 bytes each way, no remote invalidation).
// Private data of an unknown version is an error.
func ParsePrivateData(b []byte) (p PrivateData, ok bool, err error) {
	if len(b) < privDataLen || binary.BigEndian.Uint32(b) != privDataMagic {
		return PrivateData{Version: privDataVersion, InlineSend: DefaultInline, InlineRecv: DefaultInline}, false, nil
	}
	if b[4] != privDataVersion {
		return PrivateData{}, false, fmt.Errorf("rpcrdma: private data version %d, want %d", b[4], privDataVersion)
	}
	return PrivateData{
		Version:          b[4],
		RemoteInvalidate: b[5]&privFlagRemoteInvalidate != 0,
		InlineSend:       (int(b[6]) + 1) * 1024,
		InlineRecv:       (int(b[7]) + 1) * 1024,
	}, true, nil
}
