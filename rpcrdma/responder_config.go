package rpcrdma

import (
	"net"
	"time"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
)

// ResponderConfig configures a Responder.
type ResponderConfig struct {
	// Provider makes the listener (iwarp.Provider for iWARP).
	Provider verbs.Provider
	// Handler serves each RPC call (the whole call message, chunks
	// already pulled in) and returns the whole reply message, or nil to
	// send none.
	Handler oncrpc.CallHandler
	// NewConn, if set, makes the handler of each accepted connection in
	// place of Handler: a relay gives each requester a server connection
	// of its own, over which the server's backward calls reach that
	// requester alone (ResponderConn.Call). If the handler is an
	// io.Closer, it is closed once the connection has ended. An error
	// refuses the connection.
	NewConn func(rc *ResponderConn) (oncrpc.CallHandler, error)
	// Credits is the grant sent in every reply. Zero means 32.
	Credits int
	// InlineSend and InlineRecv are our inline thresholds. Zero means
	// 4096.
	InlineSend, InlineRecv int
	// ReplyBulk is the upper-layer binding for replies (RFC 8166 s6):
	// given a call and its reply, it returns the offset and length of the
	// DDP-eligible data in the reply (the bytes after the opaque's length
	// word), if there is one. Only with it can a Write chunk be filled.
	ReplyBulk func(call, reply []byte) (off, n int, ok bool)
	// RemoteInvalidate lets the responder use Send With Invalidate when
	// the requester accepts it and the call exposed exactly one STag.
	RemoteInvalidate bool
	// MaxVersion is the highest RPC-over-RDMA version served: 1 (the
	// default) answers version-2 calls with ERR_VERS 1..1 as knfsd does;
	// 2 serves version 2 (draft-cel-nfsv4-rpcrdma-version-two).
	MaxVersion int
	// XChars makes a version-2 connection announce our transport
	// characteristics (ROPT_INITXCH) and serve REQXCH.
	XChars bool
	// MaxRecv bounds how far a requester's REQXCH may grow our receive
	// buffers. Zero means 64 KiB.
	MaxRecv int
	// Tracer receives -v rdma events.
	Tracer *trace.Tracer
	// Memory is the registered memory (the slab) of every connection's
	// buffers. Zero means 256 MiB. ConnMemory is the share one
	// connection may hold at once; zero means an eighth of Memory.
	Memory, ConnMemory int64
	// ReadTimeout bounds how long an RDMA Read of a call's Read chunk
	// may go unanswered before the connection is closed. Zero means
	// 30 s.
	ReadTimeout time.Duration
	// Allow, if set, decides from a connection's peer address whether
	// it is served; it is asked before anything is posted for the
	// connection (responder_gate.go). A refused one is counted in
	// ResponderStats.NotAllowed.
	Allow func(peer net.Addr) bool
	// MaxConns bounds the connections served at once, MaxConnsPerSource
	// those from one source (an IPv4 address or an IPv6 /64), so that
	// one source cannot keep the others out. Zero means no bound.
	MaxConns, MaxConnsPerSource int
	// IdleTimeout closes a connection that has received nothing and
	// had no call in progress for this long. Zero means never.
	IdleTimeout time.Duration
	// OnRefuse, if set, is told of each connection Allow or a bound
	// refused, and why (an error wrapping ErrNotAllowed or
	// ErrTooManyConns).
	OnRefuse func(peer net.Addr, reason error)
}
