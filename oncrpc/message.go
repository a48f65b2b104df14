// Package oncrpc implements ONC RPC version 2 (RFC 5531) for rdmafs: call
// and reply headers, AUTH_NONE and AUTH_SYS credentials, XID allocation and
// reply matching in a Client, the Transport interface that carries messages
// in zero-copy parts, and the TCP transport with record marking.
//
// A Transport is to a Client what http.RoundTripper is to http.Client:
// the Client builds and checks RPC headers, retries and times out; the
// Transport moves bytes. The RPC-over-RDMA transport in package rpcrdma
// satisfies the same interface.
//
//	tr := oncrpc.NewTCPTransport("server:2049", oncrpc.TCPOptions{})
//	clnt := oncrpc.NewClient(tr, 100003, 4, oncrpc.ClientOptions{})
//	var e xdr.Encoder
//	xid := clnt.StartCall(&e, 0, oncrpc.AuthNone)
//	rep, err := clnt.Do(ctx, &oncrpc.Call{XID: xid, Head: e.Bytes()})
package oncrpc

import (
	"errors"
	"fmt"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// Message types and protocol constants (RFC 5531 s9).
const (
	MsgCall  = 0
	MsgReply = 1

	RPCVersion = 2

	replyAccepted = 0
	replyDenied   = 1
)

// AcceptStat is the status of an accepted reply (RFC 5531 s9).
type AcceptStat uint32

// Accepted reply statuses.
const (
	Success      AcceptStat = 0
	ProgUnavail  AcceptStat = 1
	ProgMismatch AcceptStat = 2
	ProcUnavail  AcceptStat = 3
	GarbageArgs  AcceptStat = 4
	SystemErr    AcceptStat = 5
)

func (s AcceptStat) String() string {
	switch s {
	case Success:
		return "SUCCESS"
	case ProgUnavail:
		return "PROG_UNAVAIL"
	case ProgMismatch:
		return "PROG_MISMATCH"
	case ProcUnavail:
		return "PROC_UNAVAIL"
	case GarbageArgs:
		return "GARBAGE_ARGS"
	case SystemErr:
		return "SYSTEM_ERR"
	}
	return fmt.Sprintf("accept_stat(%d)", uint32(s))
}

// Errors a Client returns for replies that are not SUCCESS. Test with
// errors.Is; *AcceptError and *DeniedError carry the details.
var (
	ErrProgUnavail  = errors.New("rpc: program unavailable")
	ErrProgMismatch = errors.New("rpc: program version mismatch")
	ErrProcUnavail  = errors.New("rpc: procedure unavailable")
	ErrGarbageArgs  = errors.New("rpc: server could not decode arguments")
	ErrSystemErr    = errors.New("rpc: server system error")
	ErrDenied       = errors.New("rpc: call denied")
	ErrBadReply     = errors.New("rpc: malformed reply")
)

// AcceptError is an accepted reply whose status is not SUCCESS.
type AcceptError struct {
	Stat       AcceptStat
	Low, High  uint32 // supported versions, for PROG_MISMATCH
	Prog, Vers uint32
}

func (e *AcceptError) Error() string {
	if e.Stat == ProgMismatch {
		return fmt.Sprintf("rpc: program %d version %d not supported (server has %d..%d)", e.Prog, e.Vers, e.Low, e.High)
	}
	return fmt.Sprintf("rpc: program %d version %d: %v", e.Prog, e.Vers, e.Stat)
}

// Unwrap maps the status to its sentinel error.
func (e *AcceptError) Unwrap() error {
	switch e.Stat {
	case ProgUnavail:
		return ErrProgUnavail
	case ProgMismatch:
		return ErrProgMismatch
	case ProcUnavail:
		return ErrProcUnavail
	case GarbageArgs:
		return ErrGarbageArgs
	}
	return ErrSystemErr
}

// DeniedError is a rejected reply: RPC_MISMATCH or AUTH_ERROR.
type DeniedError struct {
	RPCMismatch bool
	Low, High   uint32 // for RPC_MISMATCH
	AuthStat    uint32 // for AUTH_ERROR (RFC 5531 s9 auth_stat)
}

func (e *DeniedError) Error() string {
	if e.RPCMismatch {
		return fmt.Sprintf("rpc: RPC version mismatch (server has %d..%d)", e.Low, e.High)
	}
	return fmt.Sprintf("rpc: authentication error %d (%s)", e.AuthStat, authStatName(e.AuthStat))
}

// Unwrap returns ErrDenied.
func (e *DeniedError) Unwrap() error { return ErrDenied }

// Is reports a refusal of an RPCSEC_GSS context (RFC 2203 s5.3.3.3:
// RPCSEC_GSS_CREDPROBLEM, RPCSEC_GSS_CTXPROBLEM) as ErrGSSContext: the
// call needs a new context.
func (e *DeniedError) Is(target error) bool {
	return target == ErrGSSContext && !e.RPCMismatch && (e.AuthStat == AuthGSSCredProblem || e.AuthStat == AuthGSSCtxProblem)
}

func authStatName(s uint32) string {
	names := []string{"AUTH_OK", "AUTH_BADCRED", "AUTH_REJECTEDCRED", "AUTH_BADVERF",
		"AUTH_REJECTEDVERF", "AUTH_TOOWEAK", "AUTH_INVALIDRESP", "AUTH_FAILED"}
	switch {
	case int(s) < len(names):
		return names[s]
	case s == AuthGSSCredProblem:
		return "RPCSEC_GSS_CREDPROBLEM"
	case s == AuthGSSCtxProblem:
		return "RPCSEC_GSS_CTXPROBLEM"
	}
	return "unknown"
}

// AppendCallHeader appends an RPC call header (RFC 5531 s9 call_body) to e.
func AppendCallHeader(e *xdr.Encoder, xid, prog, vers, proc uint32, cred Credential) {
	e.Uint32(xid)
	e.Uint32(MsgCall)
	e.Uint32(RPCVersion)
	e.Uint32(prog)
	e.Uint32(vers)
	e.Uint32(proc)
	if cred.GSS != nil {
		// A placeholder: Client.Do writes the header with the context's
		// credential and verifier for each transmission (gsscall.go).
		cred = GSSCred{Proc: gssData, Service: cred.GSS.service, Handle: cred.GSS.handle}.Credential()
	}
	cred.encode(e)
	AuthNone.encode(e) // verifier: AUTH_NONE for AUTH_NONE and AUTH_SYS
}

// maxAuthBody is the largest opaque_auth body (RFC 5531 s8.2).
const maxAuthBody = 400

// ParseReply checks an RPC reply message and returns the procedure results
// that follow the header. It returns an *AcceptError or *DeniedError for
// replies that are not SUCCESS, and an error wrapping ErrBadReply for a
// message that is not a well-formed reply.
func ParseReply(msg []byte) (xid uint32, results []byte, err error) {
	xid, _, results, err = parseReply(msg)
	return xid, results, err
}

// parseReply is ParseReply that also returns the reply's verifier (its
// body aliases msg).
func parseReply(msg []byte) (xid uint32, verf Credential, results []byte, err error) {
	d := xdr.NewDecoder(msg)
	xid = d.Uint32()
	if mt := d.Uint32(); d.Err() == nil && mt != MsgReply {
		return xid, verf, nil, fmt.Errorf("%w: message type %d is not REPLY", ErrBadReply, mt)
	}
	switch stat := d.Uint32(); {
	case d.Err() != nil:
	case stat == replyAccepted:
		verf.Flavor = d.Uint32()
		verf.Body = d.Opaque(maxAuthBody)
		as := AcceptStat(d.Uint32())
		if d.Err() != nil {
			break
		}
		if as == Success {
			return xid, verf, d.Rest(), nil
		}
		ae := &AcceptError{Stat: as}
		if as == ProgMismatch {
			ae.Low, ae.High = d.Uint32(), d.Uint32()
		}
		if d.Err() == nil {
			return xid, verf, nil, ae
		}
	case stat == replyDenied:
		de := &DeniedError{}
		switch rs := d.Uint32(); rs {
		case 0: // RPC_MISMATCH
			de.RPCMismatch = true
			de.Low, de.High = d.Uint32(), d.Uint32()
		case 1: // AUTH_ERROR
			de.AuthStat = d.Uint32()
		default:
			d.SetErr(fmt.Errorf("reject_stat %d", rs))
		}
		if d.Err() == nil {
			return xid, verf, nil, de
		}
	default:
		d.SetErr(fmt.Errorf("reply_stat %d", stat))
	}
	return xid, verf, nil, fmt.Errorf("%w: %v", ErrBadReply, d.Err())
}

// CallHeader is the decoded header of an incoming RPC call.
type CallHeader struct {
	XID              uint32
	Prog, Vers, Proc uint32
	Cred             Credential
}

// ParseCall decodes an RPC call message (for a backward-direction service
// such as the NFSv4.1 callback program) and returns its header and the
// procedure arguments. The credential body aliases msg.
func ParseCall(msg []byte) (CallHeader, []byte, error) {
	var h CallHeader
	d := xdr.NewDecoder(msg)
	h.XID = d.Uint32()
	mt := d.Uint32()
	rv := d.Uint32()
	h.Prog, h.Vers, h.Proc = d.Uint32(), d.Uint32(), d.Uint32()
	h.Cred.Flavor = d.Uint32()
	h.Cred.Body = d.Opaque(maxAuthBody)
	d.Uint32()
	d.Opaque(maxAuthBody)
	if err := d.Err(); err != nil {
		return h, nil, fmt.Errorf("rpc: malformed call: %w", err)
	}
	if mt != MsgCall {
		return h, nil, fmt.Errorf("rpc: message type %d is not CALL", mt)
	}
	if rv != RPCVersion {
		return h, nil, fmt.Errorf("rpc: call with RPC version %d", rv)
	}
	return h, d.Rest(), nil
}

// AppendAcceptedReply appends the header of an accepted reply with status
// stat (and, for PROG_MISMATCH, the version range) to e. For SUCCESS the
// caller appends the results after it.
func AppendAcceptedReply(e *xdr.Encoder, xid uint32, stat AcceptStat, low, high uint32) {
	e.Uint32(xid)
	e.Uint32(MsgReply)
	e.Uint32(replyAccepted)
	AuthNone.encode(e)
	e.Uint32(uint32(stat))
	if stat == ProgMismatch {
		e.Uint32(low)
		e.Uint32(high)
	}
}

// MessageType returns the msg_type of an RPC message (MsgCall or MsgReply)
// and whether msg is long enough to have one. Transports use it to tell
// backward-direction calls from replies on a shared connection.
func MessageType(msg []byte) (uint32, bool) {
	if len(msg) < 8 {
		return 0, false
	}
	return uint32(msg[4])<<24 | uint32(msg[5])<<16 | uint32(msg[6])<<8 | uint32(msg[7]), true
}
