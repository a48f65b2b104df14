package rpcrdma

import "testing"

// Fault injection the responder's tests need and a real requester cannot
// cause: the production responder has only the unexported intercept
// point (Responder.intercept) that this file fills.

// Action is what a test's filter decides for one call.
type Action int

// Filter actions.
const (
	Serve      Action = iota // handle the call normally
	RejectCall               // answer RDMA_ERROR / ERR_CHUNK
	DropCall                 // never answer
	Disconnect               // break the connection
)

// newFaultEnv is newEnv with filter deciding, for each call once its
// chunks are pulled in, whether it is served or which fault it meets.
func newFaultEnv(t *testing.T, v int, rcfg ResponderConfig, filter func(xid uint32, call []byte) Action, ccfg Config) *testEnv {
	t.Helper()
	return newEnvWith(t, v, rcfg, ccfg, func(r *Responder) { setFilter(r, filter) })
}

// setFilter makes filter decide the fate of each call r receives.
func setFilter(r *Responder, filter func(xid uint32, call []byte) Action) {
	f := func(c *serverConn, h *Header, call []byte, leave func()) bool {
		switch filter(h.XID, call) {
		case RejectCall:
			leave()
			c.sendError(h, ErrChunk)
			return true
		case DropCall:
			return true
		case Disconnect:
			c.qp.Close()
			return true
		}
		return false
	}
	r.intercept.Store(&f)
}
