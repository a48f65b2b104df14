package rpcrdma

import (
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// Faults of the in-process responder, made by the handler it serves
// (ResponderConfig.NewConn) through the responder's ordinary paths: the
// responder itself has no fault hook.

// fault is what a test's filter decides for one call.
type fault int

const (
	serveCall     fault = iota // handle the call normally
	overflowReply              // a reply no chunk of the call can carry: the responder answers ERR_CHUNK
	dropCall                   // never answer
	hangUp                     // break the connection
)

// oversizeReply is larger than any inline threshold a test sets up.
const oversizeReply = 1 << 20

// newFaultEnv is newEnv with filter deciding, for each call the handler
// receives (its chunks already pulled in), whether rcfg.Handler (echo if
// nil) serves it or which fault it meets.
func newFaultEnv(t *testing.T, v int, rcfg ResponderConfig, filter func(xid uint32) fault, ccfg Config) *testEnv {
	t.Helper()
	next := rcfg.Handler
	if next == nil {
		next = echoHandler{}
	}
	rcfg.NewConn = func(rc *ResponderConn) (oncrpc.CallHandler, error) {
		return faultHandler{next: next, conn: rc, filter: filter}, nil
	}
	return newEnv(t, v, rcfg, ccfg)
}

// faultHandler serves one connection's calls with next, except those
// filter picks for a fault.
type faultHandler struct {
	next   oncrpc.CallHandler
	conn   *ResponderConn
	filter func(xid uint32) fault
}

func (h faultHandler) HandleCall(msg []byte) []byte {
	ch, _, err := oncrpc.ParseCall(msg)
	if err != nil {
		return h.next.HandleCall(msg)
	}
	switch h.filter(ch.XID) {
	case overflowReply:
		// RFC 8166 s4.5.3: a reply too large for the Reply chunk (here:
		// no Reply chunk, and over the inline threshold) cannot be
		// returned; the responder answers RDMA_ERROR / ERR_CHUNK.
		var e xdr.Encoder
		oncrpc.AppendAcceptedReply(&e, ch.XID, oncrpc.Success, 0, 0)
		e.Opaque(make([]byte, oversizeReply))
		return e.Bytes()
	case dropCall:
		return nil // the responder sends nothing for a nil reply
	case hangUp:
		h.conn.Close()
		return nil
	}
	return h.next.HandleCall(msg)
}
