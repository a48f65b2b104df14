// Package rpcrdma implements RPC-over-RDMA for rdmafs: version 1 (RFC
// 8166) and version 2 (draft-cel-nfsv4-rpcrdma-version-two, with
// RDMA_OPTIONAL and the transport characteristics of
// draft-dnoveck-rpcrdma-xcharext): the transport header, chunk
// marshalling, credits, inline thresholds, connection private data (RFC
// 8797) and the backward direction (RFC 8167), on both endpoints. The
// requester is an oncrpc.Transport, so an NFS client runs over it
// unchanged; the responder serves an RPC handler and is what tests use to
// inject faults.
//
// It knows nothing of NFS: which argument or result may move by RDMA
// (RFC 8166 s6, the Upper-Layer Binding) reaches it as data on each
// oncrpc.Call (Bulk, ReplyBulk, MaxReplySize).
//
// # The data path
//
// The transport owns its memory (package mrcache): a bounded slab mapped
// outside the Go heap and registered once per chunk. Receive buffers,
// send buffers and the buffers of a call come from it, and so do the
// upper layer's READ destinations and write-back buffers (Buffers):
//
//   - NFS WRITE: the data is in the slab already (the FUSE layer copied it
//     there from go-fuse's request buffer, the one copy a WRITE makes); a
//     fast registration exposes exactly its bytes as a Read chunk and the
//     server RDMA-Reads them. The Send carries the transport header and
//     the RPC header and arguments, copied into a send buffer.
//   - NFS READ: the destination is in the slab; a fast registration
//     exposes exactly it as a Write chunk, the server RDMA-Writes the data
//     there (the provider reads it from the socket straight into place)
//     and the FUSE layer hands the same memory to the kernel: no copy.
//   - An inline reply is lent to the upper layer in its receive buffer (a
//     spare buffer is posted in its place) and comes back at
//     oncrpc.Reply.Release; a Reply chunk's buffer goes up the same way.
//   - Bulk data outside the slab goes through a transport buffer: one
//     counted copy (Stats.BytesCopied).
//
// Before a reply is used, and whenever a call returns otherwise (timeout,
// cancellation, connection loss, a retransmission superseding it), every
// exposure of the call is invalidated and the invalidation waits for a
// placement in progress; one that stalls is ended by closing the
// connection, and an invalidation that fails closes the connection before
// the call completes (RFC 8166 s4.4.1, s4.5.4, s8.1). No peer can reach a
// byte outside, or after, its call.
//
// # A hostile peer
//
// Replies are checked against their call before they change anything;
// malformed ones are dropped (RFC 8166 s4.5). Every message sent counts
// against the responder's credits, one-way RDMA_OPTIONALs and RDMA_ERRORs
// included. Backward calls are bounded by the slots we grant. Send With
// Invalidate of an STag the reply's call did not offer closes the
// connection.
//
// # Files
//
// The files follow the split of Linux's xprtrdma: header.go is the wire
// format, privdata.go the RFC 8797 connection private data, marshal.go
// decides how a call is sent and exposes its memory, reply.go checks and
// takes replies apart, conn.go owns the queue pair, credits and buffers,
// requester.go is the oncrpc.Transport, negotiate.go is version
// negotiation, optional.go and xchar.go are RDMA_OPTIONAL and transport
// characteristics, backchannel.go is the backward direction, and
// responder.go and responder_v2.go the server side.
//
// A requester is used as any oncrpc.Transport:
//
//	tr := rpcrdma.NewTransport("server:20049", rpcrdma.Config{Provider: &iwarp.Provider{}})
//	defer tr.Close()
//	clnt := oncrpc.NewClient(tr, prog, vers, oncrpc.ClientOptions{})
//	rep, err := clnt.Do(ctx, &oncrpc.Call{XID: xid, Head: args, MaxReplySize: 4096})
package rpcrdma

import (
	"errors"
	"fmt"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// Protocol versions and message types (RFC 8166 s4.2).
const (
	Version1 = 1
	Version2 = 2

	ProcMsg      = 0 // RDMA_MSG
	ProcNoMsg    = 1 // RDMA_NOMSG
	ProcMsgP     = 2 // RDMA_MSGP: RFC 8166 s4.5, not to be sent
	ProcDone     = 3 // RDMA_DONE: RFC 8166 s4.5, not to be sent
	ProcError    = 4 // RDMA_ERROR
	ProcOptional = 5 // RDMA_OPTIONAL (version 2 only)

	ErrVers   = 1 // ERR_VERS
	ErrChunk  = 2 // ERR_CHUNK (RDMA_ERR_BAD_HEADER in version 2)
	ErrOption = 3 // RDMA_ERR_INVAL_OPTION (version 2 only)

	// DefaultInline is the inline threshold a peer that sent no
	// RFC 8797 private data is assumed to have (RFC 8166 s3.3.3).
	DefaultInline = 1024
	// MinHeaderLen is an RDMA_MSG header with three empty chunk lists.
	MinHeaderLen = 28
)

// Limits on decoded chunk lists: far beyond what a real peer sends, small
// enough that a hostile header cannot make the decoder allocate much.
const (
	maxReadSegments  = 64
	maxWriteChunks   = 16
	maxChunkSegments = 64
)

// Segment is an RDMA segment: a remote memory region's handle (STag),
// length and offset (RFC 8166 s4.1.2, xdr_rdma_segment).
type Segment struct {
	Handle uint32
	Length uint32
	Offset uint64
}

// ReadSegment is one entry of a Read list: a segment and the XDR position
// in the payload stream where its data belongs (RFC 8166 s3.4.5).
type ReadSegment struct {
	Position uint32
	Segment
}

// Header is an RPC-over-RDMA transport header.
type Header struct {
	XID, Vers, Credit, Proc uint32

	// RDMA_MSG and RDMA_NOMSG.
	Reads  []ReadSegment
	Writes [][]Segment // the Write list: one element per Write chunk
	Reply  []Segment   // the Reply chunk; nil when absent

	// RDMA_ERROR.
	ErrCode           uint32
	VersLow, VersHigh uint32

	// RDMA_OPTIONAL (version 2).
	OptType uint32
	OptInfo []byte
}

// ErrBadHeader is wrapped by every header decoding error.
var ErrBadHeader = errors.New("rpcrdma: malformed transport header")

func encodeSegment(e *xdr.Encoder, s Segment) {
	e.Uint32(s.Handle)
	e.Uint32(s.Length)
	e.Uint64(s.Offset)
}

func encodeChunk(e *xdr.Encoder, segs []Segment) {
	e.Uint32(uint32(len(segs)))
	for _, s := range segs {
		encodeSegment(e, s)
	}
}

// Append appends the encoded header to e (RFC 8166 s4.1.2).
func (h *Header) Append(e *xdr.Encoder) {
	e.Uint32(h.XID)
	e.Uint32(h.Vers)
	e.Uint32(h.Credit)
	e.Uint32(h.Proc)
	switch h.Proc {
	case ProcMsg, ProcNoMsg:
		// Lists are XDR optional-data chains: a 1 before each entry, a 0 at
		// the end (RFC 8166 s4.3).
		for _, r := range h.Reads {
			e.Uint32(1)
			e.Uint32(r.Position)
			encodeSegment(e, r.Segment)
		}
		e.Uint32(0)
		for _, w := range h.Writes {
			e.Uint32(1)
			encodeChunk(e, w)
		}
		e.Uint32(0)
		if h.Reply != nil {
			e.Uint32(1)
			encodeChunk(e, h.Reply)
		} else {
			e.Uint32(0)
		}
	case ProcError:
		e.Uint32(h.ErrCode)
		if h.ErrCode == ErrVers {
			e.Uint32(h.VersLow)
			e.Uint32(h.VersHigh)
		}
	case ProcOptional:
		e.Uint32(h.OptType)
		e.Opaque(h.OptInfo)
	}
}

func decodeSegment(d *xdr.Decoder) Segment {
	return Segment{Handle: d.Uint32(), Length: d.Uint32(), Offset: d.Uint64()}
}

// decodeChunk decodes a chunk's segments, into buf's array when it has
// room. The result is never nil: a chunk with no segments is present.
func decodeChunk(d *xdr.Decoder, buf []Segment) []Segment {
	n := d.Length(maxChunkSegments)
	segs := buf[:0]
	if segs == nil || cap(segs) < n {
		segs = make([]Segment, 0, n)
	}
	for range n {
		segs = append(segs, decodeSegment(d))
	}
	return segs
}

// optional reads the discriminant of an XDR optional-data item.
func optional(d *xdr.Decoder) bool { return d.Bool() }

// Decode decodes a transport header from msg and returns the length of
// the header; any RPC payload follows it. Decoding is strict (RFC 8166
// s4.5 and s7): RDMA_MSGP and RDMA_DONE are refused, an unknown procedure
// is an error, and lists longer than the limits are rejected. A version-2
// procedure (RDMA_OPTIONAL, error code 3) is accepted only when v2 is set.
//
// ERR_VERS decodes whatever the version word says (RFC 8166 s7: its
// layout never changes).
//
// The lists decoded go into the arrays of the lists h holds where they
// fit (a Reply chunk's, if h has one), so that a receiver decoding every
// message into the same Header allocates nothing for a message shaped as
// the one before: whatever those arrays held is overwritten.
func (h *Header) Decode(msg []byte, v2 bool) (int, error) {
	writes, reply := h.Writes[:cap(h.Writes)], h.Reply
	*h = Header{Reads: h.Reads[:0], Writes: h.Writes[:0]}
	d := xdr.NewDecoder(msg)
	h.XID, h.Vers, h.Credit, h.Proc = d.Uint32(), d.Uint32(), d.Uint32(), d.Uint32()
	if err := d.Err(); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrBadHeader, err)
	}
	switch h.Proc {
	case ProcMsg, ProcNoMsg:
		for i := 0; optional(d); i++ {
			if i == maxReadSegments {
				return 0, fmt.Errorf("%w: more than %d read segments", ErrBadHeader, maxReadSegments)
			}
			h.Reads = append(h.Reads, ReadSegment{Position: d.Uint32(), Segment: decodeSegment(d)})
		}
		for i := 0; optional(d); i++ {
			if i == maxWriteChunks {
				return 0, fmt.Errorf("%w: more than %d write chunks", ErrBadHeader, maxWriteChunks)
			}
			var buf []Segment
			if i < len(writes) {
				buf = writes[i]
			}
			h.Writes = append(h.Writes, decodeChunk(d, buf))
		}
		if optional(d) {
			h.Reply = decodeChunk(d, reply)
		}
	case ProcError:
		h.ErrCode = d.Uint32()
		switch {
		case h.ErrCode == ErrVers:
			h.VersLow, h.VersHigh = d.Uint32(), d.Uint32()
		case h.ErrCode == ErrChunk, h.ErrCode == ErrOption && v2:
		case d.Err() == nil:
			return 0, fmt.Errorf("%w: unknown error code %d", ErrBadHeader, h.ErrCode)
		}
	case ProcOptional:
		if !v2 {
			return 0, fmt.Errorf("%w: RDMA_OPTIONAL in version %d", ErrBadHeader, h.Vers)
		}
		h.OptType = d.Uint32()
		h.OptInfo = d.Opaque(len(msg))
	case ProcMsgP, ProcDone:
		// RFC 8166 s4.5: these are not to be used; a receiver treats them
		// as an error.
		return 0, fmt.Errorf("%w: obsolete procedure %d (RDMA_MSGP/RDMA_DONE)", ErrBadHeader, h.Proc)
	default:
		return 0, fmt.Errorf("%w: unknown procedure %d", ErrBadHeader, h.Proc)
	}
	if err := d.Err(); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrBadHeader, err)
	}
	return d.Offset(), nil
}

func chunkLen(segs []Segment) int {
	n := 0
	for _, s := range segs {
		n += int(s.Length)
	}
	return n
}
