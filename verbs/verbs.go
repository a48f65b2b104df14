// Package verbs is the RDMA verbs API that rdmafs's RPC-over-RDMA transport
// is written against: protection domains, memory regions with STags,
// fast registration and invalidation, connected reliable queue pairs with
// send and receive work requests over scatter/gather lists, completion
// queues and connection setup with private data.
//
// Memory is registered for the peer and invalidated with work requests
// (OpFastRegister, OpBindWindow, OpLocalInvalidate; see MemoryBinding),
// as FRWR hardware does.
//
// The package is provider neutral and shaped like the hardware verbs
// (libibverbs): every local buffer a work request names is registered
// memory, referenced as (region, offset, length) with the region's local
// key (SGE), and completion queues are an interface each provider
// implements. A provider (the pure-Go iWARP provider in verbs/iwarp, or a
// cgo rdma-core provider in verbs/ibverbs) implements Provider, QueuePair,
// Listener and CompletionQueue, and keeps its side of each registration
// behind a registration hook (the device's memory translation, or the
// pure-Go provider's STag table) that only providers reach, through
// package verbs/internal/spi; ProtectionDomain and MemoryRegion are the
// shared, provider-neutral API. Optional capabilities are small declared
// interfaces a provider's types may implement: DomainProvider (of a
// provider), CopyCounter, RecvHandlerSetter and WindowBinder (of a queue
// pair).
//
// A short example with the iWARP provider:
//
//	pd := iwarp.NewProtectionDomain()
//	mem, _ := pd.RegisterMemory(buf, verbs.AccessLocalWrite) // buf: memory the caller owns
//	qp, err := iwarp.Dial(ctx, "server:20049", &verbs.ConnParams{PD: pd, PrivateData: pdata})
//	if err != nil { ... }
//	defer qp.Close()
//	qp.PostRecv(verbs.RecvWR{WRID: 1, SGL: []verbs.SGE{{MR: mem, Offset: 0, Length: 4096}}})
//	qp.PostSend(verbs.SendWR{WRID: 2, Opcode: verbs.OpSend, SGL: []verbs.SGE{{MR: mem, Offset: 4096, Length: n}}})
//	var wc [8]verbs.Completion
//	n, err := qp.SendCQ().Poll(ctx, wc[:])
//
// Errors are values: once a queue pair breaks, every outstanding and every
// later work request completes with StatusFlushed (or a more specific error
// status) and Err reports why.
package verbs

import (
	"context"
	"errors"
	"fmt"
	"net"
)

// Access is a set of access rights of a memory region.
type Access uint32

// Access rights. Local read access is always granted.
const (
	// AccessLocalWrite lets the local provider place data into the region
	// (receive buffers, RDMA Read sinks).
	AccessLocalWrite Access = 1 << iota
	// AccessRemoteRead lets the peer read the region with RDMA Read.
	AccessRemoteRead
	// AccessRemoteWrite lets the peer write the region with RDMA Write.
	AccessRemoteWrite
)

// Remote reports whether a grants any remote access.
func (a Access) Remote() bool { return a&(AccessRemoteRead|AccessRemoteWrite) != 0 }

// String returns a short form like "LW|RR|RW".
func (a Access) String() string {
	s := ""
	add := func(t string) {
		if s != "" {
			s += "|"
		}
		s += t
	}
	if a&AccessLocalWrite != 0 {
		add("LW")
	}
	if a&AccessRemoteRead != 0 {
		add("RR")
	}
	if a&AccessRemoteWrite != 0 {
		add("RW")
	}
	if s == "" {
		return "none"
	}
	return s
}

// Opcode names the operation of a work request or completion.
type Opcode uint8

// Work request and completion opcodes.
const (
	OpSend               Opcode = iota + 1 // Send (send queue)
	OpSendWithInvalidate                   // Send With Invalidate (send queue)
	OpRDMAWrite                            // RDMA Write (send queue)
	OpRDMARead                             // RDMA Read (send queue)
	OpRecv                                 // receive completion of a Send
	OpRecvWithInvalidate                   // receive completion of a Send With Invalidate
	OpFastRegister                         // fast-register a region (send queue; SendWR.Binding)
	OpLocalInvalidate                      // invalidate a local region's STag (send queue; SendWR.Binding.MR)
	OpBindWindow                           // bind a memory window (send queue; SendWR.Binding)
)

var opNames = [...]string{"invalid", "Send", "SendWithInvalidate", "RDMAWrite", "RDMARead", "Recv", "RecvWithInvalidate",
	"FastRegister", "LocalInvalidate", "BindWindow"}

// String returns the opcode's name.
func (o Opcode) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("Opcode(%d)", uint8(o))
}

// Status is the outcome of a work request.
type Status uint8

// Completion statuses.
const (
	StatusSuccess            Status = iota // completed normally
	StatusFlushed                          // the queue pair broke before the request finished
	StatusLocalLengthErr                   // a received message did not fit the posted buffer
	StatusLocalProtectionErr               // a local memory region was invalid or lacked rights
	StatusRemoteAccessErr                  // the peer refused access to its memory (bad STag, bounds, rights)
	StatusRemoteOpErr                      // the peer reported an operation error (Terminate)
	StatusFatalErr                         // transport failure (CRC error, protocol violation, lost connection)
)

var statusNames = [...]string{"Success", "Flushed", "LocalLengthErr", "LocalProtectionErr", "RemoteAccessErr", "RemoteOpErr", "FatalErr"}

// String returns the status's name.
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Completion reports the end of one work request.
type Completion struct {
	WRID   uint64 // the caller's work request ID
	Status Status
	Opcode Opcode
	// ByteLen is the number of bytes received (receive completions) or
	// transferred (send queue completions).
	ByteLen uint32
	// InvalidatedSTag is the STag that a received Send With Invalidate
	// invalidated (Opcode OpRecvWithInvalidate).
	InvalidatedSTag uint32
}

// MaxSGE is the most scatter/gather elements a work request may name.
const MaxSGE = 8

// SGE is a scatter/gather element: Length bytes at Offset in the
// registered region MR, named in work requests by the region's local key
// (ibv_sge). The region must stay registered until the work request
// completes.
type SGE struct {
	MR     *MemoryRegion
	Offset uint64
	Length uint32
}

// SendWR is a send queue work request.
//
// The caller must not modify the memory that a work request names until
// its completion has been polled.
type SendWR struct {
	WRID uint64
	// Opcode is OpSend, OpSendWithInvalidate, OpRDMAWrite, OpRDMARead,
	// or a registration: OpFastRegister, OpLocalInvalidate or
	// OpBindWindow (see MemoryBinding).
	Opcode Opcode
	// SGL is the gather list of a Send or RDMA Write (the message is
	// the concatenation of its elements) or the scatter list of an RDMA
	// Read's local sink (which needs AccessLocalWrite). At most MaxSGE
	// elements.
	SGL []SGE
	// Solicited asks for a solicited event at the receiver (Send only).
	Solicited bool
	// InvalidateSTag is the peer's STag to invalidate (OpSendWithInvalidate).
	InvalidateSTag uint32
	// RemoteSTag and RemoteOffset name the peer's memory for RDMA Write
	// (sink) and RDMA Read (source); Length is an RDMA Read's size.
	RemoteSTag   uint32
	RemoteOffset uint64
	Length       uint32
	// Bind lists fast-registration regions (FastRegister) whose binding
	// the provider carries out on this queue pair ahead of the request,
	// in the same post: a provider that exposes memory with type-2
	// memory windows (verbs/ibverbs on rxe, mlx5) binds a window with a
	// work request chained before the Send that offers it, and the
	// window then works only through this queue pair. A provider that
	// binds in FastRegister (WindowBinder not implemented) ignores it.
	// It belongs to the old, synchronous registration model; an
	// OpFastRegister or OpBindWindow work request replaces it (rpcrdma
	// no longer sets it; the conformance suite still does).
	Bind []*MemoryRegion
	// Binding is the operand of a registration work request
	// (OpFastRegister, OpLocalInvalidate, OpBindWindow).
	Binding MemoryBinding
}

// RecvWR is a receive queue work request: the buffer an inbound Send is
// placed in. Its elements need AccessLocalWrite.
type RecvWR struct {
	WRID uint64
	SGL  []SGE
}

// SGLLen returns the number of bytes sgl names.
func SGLLen(sgl []SGE) uint64 {
	var n uint64
	for _, s := range sgl {
		n += uint64(s.Length)
	}
	return n
}

// ConnRequest describes an incoming connection request to the passive side.
type ConnRequest struct {
	RemoteAddr  net.Addr
	PrivateData []byte // the initiator's upper-layer private data
	IRD, ORD    int    // the initiator's inbound/outbound read depths
	CRC         bool   // the initiator asked for CRC
}

// ConnParams are the parameters of Dial and Listen.
type ConnParams struct {
	// PD is the protection domain of the queue pair(s). If nil, each
	// queue pair gets a new one (QueuePair.PD).
	PD *ProtectionDomain
	// SendCQ and RecvCQ receive the completions; they may be the same
	// queue and may be shared by several queue pairs. A nil one is
	// replaced by a new queue of the queue pair's own. A provider
	// accepts only completion queues of its own kind (*SoftCQ for the
	// iWARP provider).
	SendCQ, RecvCQ CompletionQueue
	// PrivateData is given to the peer's upper layer (RFC 8797 puts
	// the RPC-over-RDMA parameters here). On the passive side it is the
	// reply private data unless OnConnect returns some.
	PrivateData []byte
	// IRD is the number of inbound RDMA Reads served at once, ORD the
	// number of outbound RDMA Reads outstanding at once. Zero means 16.
	IRD, ORD int
	// CRC asks for CRC protection of every frame (iWARP: MPA CRC32c).
	CRC bool
	// MaxSegment is a provider hint: the largest frame payload sent
	// (iWARP: ULPDU bytes). Zero selects the provider default.
	MaxSegment int
	// OnConnect, on the passive side, sees each connection request and
	// returns the reply private data; an error rejects the request.
	OnConnect func(req *ConnRequest) (reply []byte, err error)
	// Setup, if set, runs on each new queue pair before anything can
	// arrive on it: on the passive side before the connection is
	// accepted (before the reply goes to the initiator), on the active
	// side before Dial returns. Post the initial receive buffers here,
	// as verbs users post receives before rdma_accept: a Send that
	// finds no buffer breaks the connection. An error rejects (passive)
	// or abandons (active) the connection; work requests posted by
	// Setup then complete as flushed.
	Setup func(qp QueuePair) error
}

// QueuePair is a connected, reliable queue pair.
type QueuePair interface {
	// PostSend queues a send work request. It returns an error for a
	// malformed request, and one wrapping ErrQueueFull when as many send
	// requests are outstanding (posted, not completed) as the provider
	// allows; on a broken queue pair the request completes with
	// StatusFlushed.
	PostSend(wr SendWR) error
	// PostRecv posts a receive buffer. On a broken queue pair the
	// buffer completes with StatusFlushed.
	PostRecv(wr RecvWR) error
	// SendCQ is the completion queue of the send queue.
	SendCQ() CompletionQueue
	// RecvCQ is the completion queue of the receive queue.
	RecvCQ() CompletionQueue
	// PD is the queue pair's protection domain.
	PD() *ProtectionDomain
	// PeerPrivateData is the upper-layer private data the peer sent
	// during connection setup.
	PeerPrivateData() []byte
	// IRD and ORD are the negotiated read depths.
	IRD() int
	ORD() int
	// CRC reports whether frames carry a CRC.
	CRC() bool
	// LocalAddr and RemoteAddr are the endpoints of the connection.
	LocalAddr() net.Addr
	RemoteAddr() net.Addr
	// Err is nil while the queue pair works, then the reason it broke.
	Err() error
	// Done is closed when the queue pair breaks.
	Done() <-chan struct{}
	// Close disconnects, flushes all outstanding work requests and
	// waits for the provider's goroutines.
	Close() error
}

// Listener accepts connections on the passive side.
type Listener interface {
	// Accept returns the next established queue pair.
	Accept(ctx context.Context) (QueuePair, error)
	// Addr is the listening address.
	Addr() net.Addr
	// Close stops listening; queue pairs already accepted stay up.
	Close() error
}

// CompletionQueue delivers completions of one or more queue pairs. A
// provider implements it (a software queue, or an ibv_cq polled and armed
// by the provider).
type CompletionQueue interface {
	// Poll waits until at least one completion is available (or ctx
	// ends), then moves up to len(out) completions into out.
	Poll(ctx context.Context, out []Completion) (int, error)
	// TryPoll moves up to len(out) completions into out without
	// blocking and returns how many it moved.
	TryPoll(out []Completion) int
}

// Provider creates protection domains and queue pairs; a transport holds
// one to stay provider neutral.
type Provider interface {
	// Dial connects to addr (active side).
	Dial(ctx context.Context, addr string, p *ConnParams) (QueuePair, error)
	// Listen listens on addr (passive side).
	Listen(addr string, p *ConnParams) (Listener, error)
	DomainProvider
}

// DomainProvider makes protection domains (ibv_alloc_pd): the provider
// keeps its side of every registration, on the device
// (verbs/ibverbs) or in a software STag table (verbs/iwarp), and its queue
// pairs accept only its own domains. A transport makes its domain with it
// before it registers any memory; given a Dial-and-Listen value without
// it, a transport makes a domain of its own that the provider must accept.
type DomainProvider interface {
	NewProtectionDomain() *ProtectionDomain
}

// Optional capabilities. A consumer discovers each by a type assertion on
// the value it holds (a Provider or a QueuePair); every provider that has
// one asserts it at compile time (var _ verbs.X = (*T)(nil)), so that a
// renamed method breaks the build instead of silently turning the
// capability off.

// CopyCounter is implemented by a QueuePair whose provider copies received
// payload on its way to registered memory (the pure-Go provider's buffered
// reader): CopiedBytes returns how many bytes it copied so far. Without it
// a consumer reports no provider copies.
type CopyCounter interface {
	CopiedBytes() uint64
}

// RecvHandlerSetter is implemented by a QueuePair that can hand each
// receive completion to a handler in the goroutine that received the
// message (verbs/iwarp), instead of queueing it in the receive CQ: a reply
// then wakes its caller straight from the provider's receiving goroutine,
// one goroutine hand-off less per message. The handler runs one call at a
// time, in completion order, after the message is placed and with no
// provider lock held; it may post and invalidate, must not close the
// queue pair and must not block for long. SetRecvHandler fails when the
// queue pair cannot (a receive CQ shared with others). Without it, or
// when it fails, a consumer polls the receive CQ in a goroutine of its
// own.
type RecvHandlerSetter interface {
	SetRecvHandler(h func(Completion)) error
}

// WindowBinder is implemented by a QueuePair whose provider binds
// fast-registration regions with posted work requests (memory windows):
// FastRegister only prepares the binding, and the region is reachable by
// the peer once its bind was posted on the queue pair that carries the
// peer's accesses, chained before a Send (SendWR.Bind) or alone
// (BindWindows, which waits until the binds completed). Without it a
// consumer treats FastRegister as the binding itself. It belongs to the
// old, synchronous registration model: an OpBindWindow work request
// replaces it.
type WindowBinder interface {
	BindWindows(ctx context.Context, mrs ...*MemoryRegion) error
}

// Sentinel errors; test them with errors.Is.
var (
	// ErrRejected: the peer rejected the connection request.
	ErrRejected = errors.New("verbs: connection rejected by peer")
	// ErrClosed: the queue pair or listener was closed locally.
	ErrClosed = errors.New("verbs: closed")
	// ErrConnectionLost: the underlying connection broke.
	ErrConnectionLost = errors.New("verbs: connection lost")
	// ErrTerminated: a protocol error ended the connection (see the
	// provider's error type for details).
	ErrTerminated = errors.New("verbs: connection terminated")
	// ErrInvalidSTag: no valid region has this STag.
	ErrInvalidSTag = errors.New("verbs: invalid STag")
	// ErrBounds: offset and length leave the region.
	ErrBounds = errors.New("verbs: access outside memory region")
	// ErrAccess: the region lacks the needed access rights.
	ErrAccess = errors.New("verbs: access rights violation")
	// ErrInvalidWR: a malformed work request.
	ErrInvalidWR = errors.New("verbs: invalid work request")
	// ErrQueueFull: the send queue holds as many outstanding work
	// requests as it may; wait for completions and post again.
	ErrQueueFull = errors.New("verbs: send queue full")
)
