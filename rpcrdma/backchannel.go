package rpcrdma

import (
	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// backwardCall serves a call from the responder (RFC 8167): the handler's
// reply goes back inline as RDMA_MSG.
func (c *conn) backwardCall(xid uint32, msg []byte) {
	c.t.stats.backward.Add(1)
	hp := c.t.handler.Load()
	go func() {
		var reply []byte
		if hp != nil && *hp != nil {
			reply = (*hp).HandleCall(msg)
		} else if h, _, err := oncrpc.ParseCall(msg); err == nil {
			var e xdr.Encoder
			oncrpc.AppendAcceptedReply(&e, h.XID, oncrpc.ProgUnavail, 0, 0)
			reply = e.Bytes()
		}
		if reply == nil {
			return
		}
		var e xdr.Encoder
		vers, sendSize := c.params()
		hdr := Header{XID: xid, Vers: vers, Credit: uint32(c.t.cfg.BackchannelSlots), Proc: ProcMsg}
		hdr.Append(&e)
		if e.Len()+len(reply) > sendSize {
			// RFC 8167 s4.2: backward messages are inline only; on v2
			// the limit is the peer's XCHAR_RBSIZ.
			c.t.tracef(trace.RDMA, "backward reply xid=%#x: %d bytes exceed the %d-byte inline threshold; dropped", xid, len(reply), sendSize)
			return
		}
		c.t.tracef(trace.RDMA, "backward call xid=%#x len=%d reply=%d", xid, len(msg), len(reply))
		c.postSend([][]byte{e.Bytes(), reply})
	}()
}
