package oncrpc

import (
	"context"
	"errors"
)

// Call is one RPC call message handed to a Transport, split the way the
// data path wants it (like Linux's xdr_buf): Head, then the DDP-eligible
// Bulk data, then Tail. Over TCP the three go out in one vectored write
// (with Bulk's XDR padding); over RPC-over-RDMA, Bulk can move as a Read
// chunk while only Head and Tail are sent (RFC 8166 s3.4.5).
//
// The fields from ReplyBulk on are the upper-layer binding hints of RFC
// 8166 s6: they describe the reply so an RDMA transport can choose Write
// and Reply chunks; the TCP transport ignores them.
type Call struct {
	XID  uint32
	Head []byte // RPC header and arguments up to and including Bulk's length word
	Bulk View   // DDP-eligible opaque data (NFS WRITE), without XDR padding; may be zero
	Tail []byte // arguments after Bulk

	// ReplyBulk is the destination for the DDP-eligible result (NFS
	// READ data, READLINK text); zero if none. An RDMA transport exposes
	// views of registered memory of its own (Bulk's too) to the peer
	// where they are, and copies others through buffers of its own;
	// other transports use the bytes.
	ReplyBulk    View
	MaxReplySize int // upper bound of the reply message size, excluding ReplyBulk data; 0 if unknown

	// GSS is the RPCSEC_GSS context of a call whose Head starts with a
	// header written by StartCall with the context's credential:
	// Client.Do writes the header, and with integrity or privacy the
	// arguments, again for each transmission (gsscall.go).
	GSS     *GSSContext
	gssProc uint32 // rpc_gss_proc_t: RPCSEC_GSS_DATA, or DESTROY
}

// Len returns the size of the call message as it is encoded over TCP.
func (c *Call) Len() int {
	n := len(c.Head) + c.Bulk.Len() + len(c.Tail)
	if !c.Bulk.IsZero() {
		n += (4 - c.Bulk.Len()&3) & 3
	}
	return n
}

// Reply is a reply message returned by a Transport.
type Reply struct {
	// Msg is the RPC reply message, starting at the XID. When BulkPlaced
	// is set, the DDP-eligible result's bytes (not its length word) are
	// absent from Msg: the transport put them in Call.ReplyBulk, BulkLen
	// bytes of them (the upper layer checks its own count against it:
	// bytes the peer did not place are not data).
	Msg        []byte
	BulkPlaced bool
	BulkLen    int
	// Results is set by Client.Do: the procedure results after the header.
	Results []byte

	release func()
}

// NewReply returns a reply whose Msg lives in a transport's buffer;
// release, if not nil, gives the buffer back and runs once, at Release.
func NewReply(msg []byte, release func()) *Reply {
	return &Reply{Msg: msg, release: release}
}

// Release gives the reply's buffer back to the transport. Msg and Results
// must not be used afterwards. Release may be called on a nil Reply.
func (r *Reply) Release() {
	if r != nil && r.release != nil {
		r.release()
		r.release = nil
	}
}

// Transport moves RPC messages between a Client and one server. It is to
// a Client what http.RoundTripper is to http.Client. Implementations are
// safe for concurrent use and keep many calls in flight.
type Transport interface {
	// RoundTrip sends call and waits for the reply with the same XID, or
	// for ctx to end. An error wrapping ErrConnection means the call may
	// not have reached the server and may be sent again.
	RoundTrip(ctx context.Context, call *Call) (*Reply, error)
	// SetCallHandler registers the handler for RPC calls that arrive from
	// the server on the transport's connection (backward direction, as
	// NFSv4.1 callbacks do: RFC 8881 s2.10.3.1, RFC 8167).
	SetCallHandler(h CallHandler)
	// Close ends the connection; calls in flight fail.
	Close() error
}

// CallHandler serves backward-direction RPC calls. HandleCall gets a whole
// call message and returns a whole reply message, or nil to send none.
// It is called on its own goroutine; msg is valid only during the call.
type CallHandler interface {
	HandleCall(msg []byte) []byte
}

// ReplyReleaser is implemented by a CallHandler that recycles its reply
// buffers. A server calls ReleaseReply with each reply HandleCall
// returned once nothing of it is referenced any more: sent, copied, or
// dropped.
type ReplyReleaser interface {
	ReleaseReply(reply []byte)
}

// ErrConnection marks transport errors after which a call can be retried
// on a new connection: the connection broke, or could not be made.
var ErrConnection = errors.New("rpc: connection failed")

// ErrClosed is returned for calls on a closed transport.
var ErrClosed = errors.New("rpc: transport closed")
