package oncrpc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// RPCSEC_GSS version 1 (RFC 2203): a GSS-API security context set up with
// the server over the NULL procedure, then a credential with a sequence
// number and a verifier, a checksum of the call's header, on every call;
// with integrity the arguments and results travel with their checksum.
// The mechanism (Kerberos V5, package oncrpc/krb5) is a GSSMechanism.

// FlavorGSS is RPCSEC_GSS (RFC 2203 s5, RFC 5531 s8.2).
const FlavorGSS = 6

// RFC 2203 s5: rpc_gss_proc_t.
const (
	gssData         = 0
	gssInit         = 1
	gssContinueInit = 2
	gssDestroy      = 3
)

// gssVersion is RPCSEC_GSS_VERS_1 (RFC 2203 s5).
const gssVersion = 1

// gssMaxSeq is MAXSEQ (RFC 2203 s5): a context whose sequence numbers
// reach it must be replaced.
const gssMaxSeq = 0x80000000

// GSSService is rpc_gss_service_t (RFC 2203 s5): what protects a call's
// arguments and results beyond the header's checksum.
type GSSService uint32

const (
	// GSSNone authenticates the header only (sec=krb5).
	GSSNone GSSService = 1
	// GSSIntegrity adds a checksum of the arguments and of the results
	// (sec=krb5i).
	GSSIntegrity GSSService = 2
	// GSSPrivacy seals them as well (sec=krb5p).
	GSSPrivacy GSSService = 3
)

func (s GSSService) String() string {
	switch s {
	case GSSNone:
		return "none"
	case GSSIntegrity:
		return "integrity"
	case GSSPrivacy:
		return "privacy"
	}
	return fmt.Sprintf("GSSService(%d)", uint32(s))
}

// RPCSEC_GSS's auth_stat values (RFC 2203 s5.3.3.3): the server no
// longer knows the context, or cannot check the credential.
const (
	AuthGSSCredProblem = 13
	AuthGSSCtxProblem  = 14
)

// GSSCred is rpc_gss_cred_vers_1_t (RFC 2203 s5).
type GSSCred struct {
	Proc    uint32
	Seq     uint32
	Service GSSService
	Handle  []byte
}

// maxGSSHandle bounds a context handle: the credential it goes in is at
// most maxAuthBody bytes (RFC 5531 s8.2), less the other fields.
const maxGSSHandle = maxAuthBody - 20

// Credential encodes c as an RPCSEC_GSS credential (rpc_gss_cred_t).
func (c GSSCred) Credential() Credential {
	var e xdr.Encoder
	e.Uint32(gssVersion)
	e.Uint32(c.Proc)
	e.Uint32(c.Seq)
	e.Uint32(uint32(c.Service))
	e.Opaque(c.Handle)
	return Credential{Flavor: FlavorGSS, Body: e.Bytes()}
}

// ParseGSSCred decodes an RPCSEC_GSS credential body.
func ParseGSSCred(body []byte) (GSSCred, error) {
	var c GSSCred
	d := xdr.NewDecoder(body)
	v := d.Uint32()
	c.Proc, c.Seq, c.Service = d.Uint32(), d.Uint32(), GSSService(d.Uint32())
	c.Handle = d.Opaque(maxGSSHandle)
	switch {
	case d.Err() != nil:
		return c, fmt.Errorf("rpc: RPCSEC_GSS credential: %w", d.Err())
	case v != gssVersion:
		return c, fmt.Errorf("rpc: RPCSEC_GSS credential version %d", v)
	case len(d.Rest()) != 0:
		return c, fmt.Errorf("rpc: RPCSEC_GSS credential: %d bytes after it", len(d.Rest()))
	}
	return c, nil
}

// gssInitRes is rpc_gss_init_res (RFC 2203 s5.2.2).
type gssInitRes struct {
	handle       []byte
	major, minor uint32
	seqWindow    uint32
	token        []byte
}

// maxGSSToken bounds a context-creation token from the server; a
// Kerberos AP-REP is a few hundred bytes.
const maxGSSToken = 64 << 10

// GSS-API major status values the client looks at (RFC 2744 s3.9.1).
const (
	gssComplete     = 0
	gssContinueNeed = 1
)

func parseGSSInitRes(b []byte) (gssInitRes, error) {
	var r gssInitRes
	d := xdr.NewDecoder(b)
	r.handle = d.Opaque(maxGSSHandle)
	r.major, r.minor, r.seqWindow = d.Uint32(), d.Uint32(), d.Uint32()
	r.token = d.Opaque(maxGSSToken)
	if d.Err() != nil {
		return r, fmt.Errorf("rpc: RPCSEC_GSS init result: %w", d.Err())
	}
	return r, nil
}

// GSSMechanism is the initiator's side of a GSS-API security context as
// RPCSEC_GSS uses it (RFC 2203 s5.2: GSS_Init_sec_context, GSS_GetMIC,
// GSS_VerifyMIC, GSS_Wrap, GSS_Unwrap). Calls may come concurrently once
// the context is established.
type GSSMechanism interface {
	// InitToken returns the first context token for the server.
	InitToken() ([]byte, error)
	// Continue takes the server's token and returns the next one to send,
	// if any; done reports the context established (mutual
	// authentication checked).
	Continue(token []byte) (next []byte, done bool, err error)
	// MIC returns the checksum token of msg; VerifyMIC checks one from
	// the server.
	MIC(msg []byte) ([]byte, error)
	VerifyMIC(msg, mic []byte) error
	// Wrap seals msg (with confidentiality); Unwrap opens a token from
	// the server and checks that it was sealed.
	Wrap(msg []byte) ([]byte, error)
	Unwrap(token []byte) ([]byte, error)
}

// GSSContext is an RPCSEC_GSS context established with one server: the
// handle the server gave it, its sequence window and the mechanism that
// signs and checks. Calls made with its credential (Credential) carry a
// new sequence number each time they are sent (RFC 2203 s5.3.3.1).
type GSSContext struct {
	mech    GSSMechanism
	service GSSService
	handle  []byte
	window  uint32

	mu  sync.Mutex
	seq uint32 // the last sequence number used
}

// ErrGSSContext wraps the errors of a context the server no longer
// accepts, or whose sequence numbers ran out: calls need a new one.
var ErrGSSContext = errors.New("rpc: RPCSEC_GSS context expired")

// Service returns the protection the context's calls get.
func (g *GSSContext) Service() GSSService { return g.service }

// Window returns the sequence window the server granted.
func (g *GSSContext) Window() uint32 { return g.window }

// Credential returns the credential that makes a call under g: its
// header, sequence number and verifier are written each time the call is
// sent (Client.Do).
func (g *GSSContext) Credential() Credential {
	return Credential{Flavor: FlavorGSS, GSS: g}
}

// nextSeq returns a sequence number not used before.
func (g *GSSContext) nextSeq() (uint32, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.seq+1 >= gssMaxSeq {
		return 0, fmt.Errorf("%w: sequence numbers exhausted (RFC 2203 s5.3.3.1: MAXSEQ)", ErrGSSContext)
	}
	g.seq++
	return g.seq, nil
}

// EstablishGSS creates an RPCSEC_GSS context with the server behind tr
// for program prog, version vers (RFC 2203 s5.2: RPCSEC_GSS_INIT and
// CONTINUE_INIT calls of the NULL procedure, each carrying the
// mechanism's next token, until the mechanism and the server are done).
// The server's last reply carries a checksum of the sequence window,
// which is checked (s5.2.3.1).
func EstablishGSS(ctx context.Context, c *Client, mech GSSMechanism, service GSSService) (*GSSContext, error) {
	token, err := mech.InitToken()
	if err != nil {
		return nil, fmt.Errorf("rpc: RPCSEC_GSS init: %w", err)
	}
	var handle []byte
	proc := uint32(gssInit)
	for round := 0; ; round++ {
		if round == 8 {
			return nil, errors.New("rpc: RPCSEC_GSS init: no context after 8 rounds")
		}
		res, verf, err := c.gssInitCall(ctx, GSSCred{Proc: proc, Service: service, Handle: handle}, token)
		if err != nil {
			return nil, err
		}
		if res.major != gssComplete && res.major != gssContinueNeed {
			return nil, fmt.Errorf("rpc: RPCSEC_GSS init: the server's GSS-API status %#x, minor %#x", res.major, res.minor)
		}
		var done bool
		if len(res.token) > 0 {
			token, done, err = mech.Continue(res.token)
			if err != nil {
				return nil, fmt.Errorf("rpc: RPCSEC_GSS init: the server's token: %w", err)
			}
		}
		if res.major == gssComplete {
			if !done {
				return nil, errors.New("rpc: RPCSEC_GSS init: the server completed a context the mechanism did not")
			}
			if len(res.handle) == 0 || res.seqWindow == 0 {
				return nil, fmt.Errorf("rpc: RPCSEC_GSS init: handle of %d bytes, sequence window %d", len(res.handle), res.seqWindow)
			}
			// RFC 2203 s5.2.3.1: the verifier of the reply that completes
			// the context is the checksum of the sequence window.
			if verf.Flavor != FlavorGSS {
				return nil, fmt.Errorf("rpc: RPCSEC_GSS init: reply verifier of flavor %d", verf.Flavor)
			}
			if err := mech.VerifyMIC(binary.BigEndian.AppendUint32(nil, res.seqWindow), verf.Body); err != nil {
				return nil, fmt.Errorf("rpc: RPCSEC_GSS init: the sequence window's checksum: %w", err)
			}
			return &GSSContext{mech: mech, service: service, handle: res.handle, window: res.seqWindow}, nil
		}
		handle, proc = res.handle, gssContinueInit
	}
}

// gssInitCall sends one RPCSEC_GSS_INIT or CONTINUE_INIT (RFC 2203
// s5.2.2: the NULL procedure, an AUTH_NONE verifier, the token as
// rpc_gss_init_arg) and decodes its result.
func (c *Client) gssInitCall(ctx context.Context, cred GSSCred, token []byte) (gssInitRes, Credential, error) {
	var e xdr.Encoder
	xid := c.StartCall(&e, 0, cred.Credential())
	e.Opaque(token)
	rep, err := c.Do(ctx, &Call{XID: xid, Head: e.Bytes(), MaxReplySize: maxGSSToken + 1024})
	if err != nil {
		return gssInitRes{}, Credential{}, fmt.Errorf("rpc: RPCSEC_GSS init: %w", err)
	}
	defer rep.Release()
	_, verf, _, err := parseReply(rep.Msg)
	if err != nil {
		return gssInitRes{}, Credential{}, fmt.Errorf("rpc: RPCSEC_GSS init: %w", err)
	}
	res, err := parseGSSInitRes(rep.Results)
	verf.Body = append([]byte(nil), verf.Body...)
	res.handle = append([]byte(nil), res.handle...)
	res.token = append([]byte(nil), res.token...)
	return res, verf, err
}

// Destroy tells the server to forget the context (RFC 2203 s5.4:
// RPCSEC_GSS_DESTROY, a NULL call under the context). The context must
// not be used afterwards.
func (g *GSSContext) Destroy(ctx context.Context, c *Client) error {
	var e xdr.Encoder
	xid := c.StartCall(&e, 0, g.Credential())
	rep, err := c.Do(ctx, &Call{XID: xid, Head: e.Bytes(), GSS: g, gssProc: gssDestroy})
	if err != nil {
		return fmt.Errorf("rpc: RPCSEC_GSS destroy: %w", err)
	}
	rep.Release()
	return nil
}
