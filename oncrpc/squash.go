package oncrpc

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// Reply codes of a denied reply (RFC 5531 s9: reject_stat, auth_stat).
const (
	rejectRPCMismatch = 0
	rejectAuthError   = 1
	// AuthBadCred is auth_stat AUTH_BADCRED: "bad credential (seal
	// broken)", what a server answers for a flavor it does not serve.
	AuthBadCred = 1
)

// Squash maps the AUTH_SYS credentials of calls as an NFS server's
// export options do (exports(5): root_squash, all_squash, anonuid,
// anongid), for a relay whose server sees every call come from the relay.
type Squash struct {
	// All maps every uid to AnonUID and every gid to AnonGID and drops
	// the supplementary groups (all_squash).
	All bool
	// Root maps uid 0 to AnonUID and gid 0, primary or supplementary,
	// to AnonGID (root_squash), as knfsd's nfsd_setuser does.
	Root bool
	// AnonUID and AnonGID are what squashed ids become (65534 in
	// exports(5)).
	AnonUID, AnonGID uint32
}

// ErrMalformedCall is returned by Squash.MapCall for a message it cannot
// parse as an RPC call header: the relay drops it.
var ErrMalformedCall = errors.New("rpc: malformed call")

// callCredOff is the offset of the credential in a call (RFC 5531 s9:
// xid, msg_type, rpcvers, prog, vers, proc, then cred).
const callCredOff = 24

// MapCall applies the mapping to the call msg. It returns the call to
// forward (msg itself when nothing changes, else a new message), or a
// reply to send back instead of forwarding, or an error wrapping
// ErrMalformedCall for a message that is not a call header at all.
//
// AUTH_NONE calls pass unchanged: they claim no identity. RPCSEC_GSS
// calls pass untouched: their identity is authenticated end to end
// between client and server (RFC 2203), and the relay could not
// rewrite them without breaking their checksums. Any other flavor, and
// an AUTH_SYS body that does not parse, is refused with AUTH_BADCRED
// (RFC 5531 s9), as a server refuses a flavor it does not serve.
func (m Squash) MapCall(msg []byte) (call, reply []byte, err error) {
	if len(msg) < callCredOff+8 {
		return nil, nil, fmt.Errorf("%w: %d bytes", ErrMalformedCall, len(msg))
	}
	xid := binary.BigEndian.Uint32(msg)
	if mt := binary.BigEndian.Uint32(msg[4:]); mt != MsgCall {
		return nil, nil, fmt.Errorf("%w: message type %d is not CALL", ErrMalformedCall, mt)
	}
	if rv := binary.BigEndian.Uint32(msg[8:]); rv != RPCVersion {
		// RFC 5531 s9: RPC_MISMATCH with the versions served; the
		// credential of another RPC version has no known layout.
		return nil, deniedReply(xid, rejectRPCMismatch, RPCVersion, RPCVersion), nil
	}
	flavor := binary.BigEndian.Uint32(msg[callCredOff:])
	n := binary.BigEndian.Uint32(msg[callCredOff+4:])
	body := callCredOff + 8
	if n > maxAuthBody || len(msg)-body < xdr.RoundUp(int(n)) {
		// RFC 5531 s8.2: an opaque_auth body is at most 400 bytes.
		return nil, deniedReply(xid, rejectAuthError, AuthBadCred), nil
	}
	end := body + xdr.RoundUp(int(n))
	switch flavor {
	case FlavorNone, FlavorGSS:
		return msg, nil, nil
	case FlavorSys:
	default:
		return nil, deniedReply(xid, rejectAuthError, AuthBadCred), nil
	}
	a, err := parseAuthSysExact(msg[body : body+int(n)])
	if err != nil {
		return nil, deniedReply(xid, rejectAuthError, AuthBadCred), nil
	}
	m.apply(&a)
	cred := a.Credential()
	var e xdr.Encoder
	e.Reset(make([]byte, 0, len(msg)-(end-callCredOff)+8+len(cred.Body)))
	e.FixedOpaque(msg[:callCredOff]) // a multiple of 4: no padding
	cred.encode(&e)
	return append(e.Bytes(), msg[end:]...), nil, nil
}

// apply maps a's ids.
func (m Squash) apply(a *AuthSys) {
	switch {
	case m.All:
		a.UID, a.GID, a.GIDs = m.AnonUID, m.AnonGID, nil
	case m.Root:
		if a.UID == 0 {
			a.UID = m.AnonUID
		}
		if a.GID == 0 {
			a.GID = m.AnonGID
		}
		for i, g := range a.GIDs {
			if g == 0 {
				a.GIDs[i] = m.AnonGID
			}
		}
	}
}

// parseAuthSysExact is ParseAuthSys that also refuses bytes after the
// body's last field.
func parseAuthSysExact(body []byte) (AuthSys, error) {
	a, rest, err := decodeAuthSys(body)
	if err == nil && rest != 0 {
		err = fmt.Errorf("rpc: bad AUTH_SYS body: %d bytes after its groups", rest)
	}
	return a, err
}

// deniedReply encodes a MSG_DENIED reply (RFC 5531 s9 rejected_reply):
// RPC_MISMATCH with a version range, or AUTH_ERROR with an auth_stat.
func deniedReply(xid, reject uint32, args ...uint32) []byte {
	var e xdr.Encoder
	e.Uint32(xid)
	e.Uint32(MsgReply)
	e.Uint32(replyDenied)
	e.Uint32(reject)
	for _, a := range args {
		e.Uint32(a)
	}
	return e.Bytes()
}
