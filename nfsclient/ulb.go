package nfsclient

import (
	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// ReplyBulk is the NFSv4 upper-layer binding for RPC-over-RDMA replies
// (RFC 8267 s4.1): it finds the DDP-eligible item of a COMPOUND reply,
// the data of the first READ or the text of a READLINK, and returns the
// offset and length of its bytes (after the length word) in the reply
// message. It walks only the results it knows how to skip, which cover
// the compounds this client sends; for anything else it says no, and
// the reply goes inline or in a Reply chunk. A responder calls it with
// the call and reply messages (rpcrdma.ResponderConfig.ReplyBulk).
func ReplyBulk(call, reply []byte) (off, n int, ok bool) {
	_, res, err := oncrpc.ParseReply(reply)
	if err != nil {
		return 0, 0, false
	}
	base := len(reply) - len(res)
	d := xdr.NewDecoder(res)
	if Status(d.Uint32()) != StatusOK {
		return 0, 0, false
	}
	d.Opaque(maxTagLen)
	nres := d.Length(maxCompoundOps)
	for range nres {
		op := d.Uint32()
		if Status(d.Uint32()) != StatusOK || d.Err() != nil {
			return 0, 0, false
		}
		switch op {
		case opSequence:
			d.Skip(16 + 5*4)
		case opPutFH, opPutRootFH, opSaveFH, opRestoreFH, opLookup, opLookupP:
		case opGetFH:
			d.Opaque(maxFHSize)
		case opGetAttr:
			var a Attr
			decodeFattr(d, &a)
		case opAccess:
			d.Skip(8)
		case opReadPlus:
			// RFC 8267 s4.1: READ_PLUS's data is not DDP-eligible; the
			// reply goes inline or in a Reply chunk.
			return 0, 0, false
		case opRead:
			d.Bool() // eof
			fallthrough
		case opReadLink:
			start := d.Offset()
			data := d.Opaque(len(res))
			if d.Err() != nil {
				return 0, 0, false
			}
			return base + start + 4, len(data), true
		default:
			return 0, 0, false
		}
	}
	return 0, 0, false
}
