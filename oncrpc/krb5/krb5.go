// Package krb5 is the Kerberos V5 GSS-API mechanism (RFC 4121) on the
// initiator's side, as RPCSEC_GSS (package oncrpc) uses it: a context
// token carrying an AP-REQ for the server's service ticket, the server's
// AP-REP checked for mutual authentication, and the MIC and Wrap tokens
// of RFC 4121 s4.2 with the AES enctypes of RFC 3962 and RFC 8009.
//
// Tickets, keys and encryption come from github.com/jcmturner/gokrb5
// (pure Go); the GSS-API framing and per-message tokens are here.
package krb5

import (
	"bytes"
	"crypto/hmac"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jcmturner/gokrb5/v8/client"
	"github.com/jcmturner/gokrb5/v8/config"
	"github.com/jcmturner/gokrb5/v8/credentials"
	"github.com/jcmturner/gokrb5/v8/gssapi"
	"github.com/jcmturner/gokrb5/v8/iana/chksumtype"
	"github.com/jcmturner/gokrb5/v8/iana/flags"
	"github.com/jcmturner/gokrb5/v8/iana/keyusage"
	"github.com/jcmturner/gokrb5/v8/messages"
	"github.com/jcmturner/gokrb5/v8/types"
)

// krb5OID is the DER encoding of the Kerberos V5 mechanism's OID,
// 1.2.840.113554.1.2.2 (RFC 1964 s1.1).
var krb5OID = []byte{0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x12, 0x01, 0x02, 0x02}

// Context tokens' TOK_IDs (RFC 4121 s4.1).
var (
	tokAPReq    = []byte{0x01, 0x00}
	tokAPRep    = []byte{0x02, 0x00}
	tokKRBError = []byte{0x03, 0x00}
)

// Initiator is one security context with a service, from a Kerberos
// client's credentials (a ticket cache or a keytab login). It is an
// oncrpc.GSSMechanism.
type Initiator struct {
	cl  *client.Client
	spn string // "nfs/server.example.com"

	sessionKey types.EncryptionKey
	ctime      time.Time // the authenticator's, for the AP-REP check
	cusec      int

	mu      sync.Mutex
	key     types.EncryptionKey // the key of the per-message tokens
	subkey  bool                // key is the acceptor's subkey
	sendSeq uint64
	done    bool
	expires time.Time
	// notAfter bounds expires: the end of the ticket-granting ticket,
	// when the ticket cache said it (a client cannot read the service
	// ticket's own end).
	notAfter time.Time
}

// NewInitiator returns a context with the service spn ("nfs/host")
// using cl's credentials.
func NewInitiator(cl *client.Client, spn string) *Initiator {
	return &Initiator{cl: cl, spn: spn}
}

// Expires returns when the service ticket the context stands on ends:
// the server refuses the context after it (RFC 2203 s5.3.3.3).
func (m *Initiator) Expires() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.expires.IsZero() || !m.notAfter.IsZero() && m.notAfter.Before(m.expires) {
		return m.notAfter
	}
	return m.expires
}

// Principal names whose credentials the context uses, "user@REALM".
func (m *Initiator) Principal() string {
	return m.cl.Credentials.CName().PrincipalNameString() + "@" + m.cl.Credentials.Domain()
}

// InitToken gets a service ticket for the service and returns the
// context token: an AP-REQ asking for mutual authentication (RFC 4121
// s4.1), in the GSS-API framing of RFC 2743 s3.1.
func (m *Initiator) InitToken() ([]byte, error) {
	tkt, key, err := m.cl.GetServiceTicket(m.spn)
	if err != nil {
		return nil, fmt.Errorf("krb5: service ticket for %s: %w", m.spn, err)
	}
	auth, err := types.NewAuthenticator(m.cl.Credentials.Domain(), m.cl.Credentials.CName())
	if err != nil {
		return nil, fmt.Errorf("krb5: authenticator: %w", err)
	}
	// RFC 4121 s4.1.1: the authenticator's checksum of type 0x8003
	// carries the context flags. Not replay or sequence detection:
	// RPCSEC_GSS has its own sequence window, and its tokens reach the
	// server in any order (RFC 2203 s5.3.3.1), which the mechanism's
	// detection would report as gaps (as rpc.gssd, which asks only for
	// mutual authentication).
	auth.Cksum = types.Checksum{CksumType: chksumtype.GSSAPI, Checksum: gssChecksum(gssapi.ContextFlagMutual | gssapi.ContextFlagInteg | gssapi.ContextFlagConf)}
	req, err := messages.NewAPReq(tkt, key, auth)
	if err != nil {
		return nil, fmt.Errorf("krb5: AP-REQ: %w", err)
	}
	types.SetFlag(&req.APOptions, flags.APOptionMutualRequired)
	der, err := req.Marshal()
	if err != nil {
		return nil, fmt.Errorf("krb5: AP-REQ: %w", err)
	}
	m.mu.Lock()
	m.sessionKey, m.key, m.ctime, m.cusec = key, key, auth.CTime, auth.Cusec
	m.sendSeq = uint64(auth.SeqNumber)
	m.mu.Unlock()
	return frame(tokAPReq, der), nil
}

// gssChecksum is the authenticator checksum of RFC 4121 s4.1.1: the
// length of the (empty) channel bindings, 16, then their 16 zero bytes,
// then the flags, little-endian.
func gssChecksum(contextFlags uint32) []byte {
	b := make([]byte, 24)
	binary.LittleEndian.PutUint32(b[0:4], 16)
	binary.LittleEndian.PutUint32(b[20:24], contextFlags)
	return b
}

// Continue checks the server's AP-REP (RFC 4120 s3.2.5: its encrypted
// part, under the session key, repeats the authenticator's time) and
// takes the acceptor's subkey when it sends one (RFC 4121 s2: both sides
// then protect messages with it). A KRB-ERROR is returned as an error.
func (m *Initiator) Continue(token []byte) ([]byte, bool, error) {
	id, body, err := unframe(token)
	if err != nil {
		return nil, false, err
	}
	switch {
	case bytes.Equal(id, tokKRBError):
		var ke messages.KRBError
		if err := ke.Unmarshal(body); err != nil {
			return nil, false, fmt.Errorf("krb5: the server's KRB-ERROR: %w", err)
		}
		return nil, false, fmt.Errorf("krb5: the server refused the ticket: %s", ke.Error())
	case !bytes.Equal(id, tokAPRep):
		return nil, false, fmt.Errorf("krb5: context token %x is not an AP-REP", id)
	}
	var rep messages.APRep
	if err := rep.Unmarshal(body); err != nil {
		return nil, false, fmt.Errorf("krb5: AP-REP: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if rep.EncPart.EType != m.sessionKey.KeyType {
		return nil, false, fmt.Errorf("krb5: AP-REP encrypted with enctype %d, the session key is %d", rep.EncPart.EType, m.sessionKey.KeyType)
	}
	plain, err := decrypt(rep.EncPart.Cipher, m.sessionKey, keyusage.AP_REP_ENCPART)
	if err != nil {
		return nil, false, fmt.Errorf("krb5: AP-REP does not decrypt under the session key: %w", err)
	}
	var part messages.EncAPRepPart
	if err := part.Unmarshal(plain); err != nil {
		return nil, false, fmt.Errorf("krb5: AP-REP: %w", err)
	}
	if !part.CTime.Equal(m.ctime.Truncate(time.Second)) || part.Cusec != m.cusec {
		return nil, false, errors.New("krb5: the AP-REP is not for this AP-REQ (its time differs)")
	}
	if part.Subkey.KeyType != 0 {
		m.key, m.subkey = part.Subkey, true
	}
	m.done = true
	if tkt, _, ok := m.cl.GetCachedTicket(m.spn); ok {
		m.expires = tkt.DecryptedEncPart.EndTime
	}
	return nil, true, nil
}

// frame wraps a context token in the GSS-API framing (RFC 2743 s3.1):
// [APPLICATION 0] with the mechanism's OID, then the TOK_ID.
func frame(id, body []byte) []byte {
	inner := append(append(append([]byte(nil), krb5OID...), id...), body...)
	out := []byte{0x60}
	out = appendDERLength(out, len(inner))
	return append(out, inner...)
}

func appendDERLength(b []byte, n int) []byte {
	switch {
	case n < 0x80:
		return append(b, byte(n))
	case n < 0x100:
		return append(b, 0x81, byte(n))
	case n < 0x10000:
		return append(b, 0x82, byte(n>>8), byte(n))
	default:
		return append(b, 0x83, byte(n>>16), byte(n>>8), byte(n))
	}
}

// unframe checks the GSS-API framing of a context token from the server
// and returns its TOK_ID and body.
func unframe(tok []byte) (id, body []byte, err error) {
	bad := func(why string) ([]byte, []byte, error) {
		return nil, nil, fmt.Errorf("krb5: malformed context token: %s", why)
	}
	if len(tok) < 2 || tok[0] != 0x60 {
		return bad("no [APPLICATION 0] tag")
	}
	n, rest := int(tok[1]), tok[2:]
	if n >= 0x80 {
		k := n & 0x7f
		if k == 0 || k > 3 || len(rest) < k {
			return bad("bad length")
		}
		n = 0
		for _, c := range rest[:k] {
			n = n<<8 | int(c)
		}
		rest = rest[k:]
	}
	if n != len(rest) {
		return bad(fmt.Sprintf("length %d for %d bytes", n, len(rest)))
	}
	if !bytes.HasPrefix(rest, krb5OID) {
		return bad("not the Kerberos V5 mechanism")
	}
	rest = rest[len(krb5OID):]
	if len(rest) < 2 {
		return bad("no TOK_ID")
	}
	return rest[:2], rest[2:], nil
}

// Per-message token flags (RFC 4121 s4.2.2).
const (
	flagSentByAcceptor = 0x01
	flagSealed         = 0x02
	flagAcceptorSubkey = 0x04
)

// MIC returns a MIC token of msg (RFC 4121 s4.2.6.1), with the next
// sequence number.
func (m *Initiator) MIC(msg []byte) ([]byte, error) {
	key, fl, seq, err := m.next()
	if err != nil {
		return nil, err
	}
	t := gssapi.MICToken{Flags: fl, SndSeqNum: seq, Payload: msg}
	if err := t.SetChecksum(key, keyusage.GSSAPI_INITIATOR_SIGN); err != nil {
		return nil, fmt.Errorf("krb5: MIC: %w", err)
	}
	return t.Marshal()
}

// VerifyMIC checks a MIC token from the acceptor over msg.
func (m *Initiator) VerifyMIC(msg, mic []byte) error {
	key, fl, err := m.peer()
	if err != nil {
		return err
	}
	var t gssapi.MICToken
	if err := t.Unmarshal(mic, true); err != nil {
		return fmt.Errorf("krb5: MIC: %w", err)
	}
	if t.Flags&flagAcceptorSubkey != fl&flagAcceptorSubkey {
		return errors.New("krb5: MIC under another key than the context's")
	}
	t.Payload = msg
	if ok, err := t.Verify(key, keyusage.GSSAPI_ACCEPTOR_SIGN); !ok {
		return fmt.Errorf("krb5: MIC does not check: %w", err)
	}
	return nil
}

// next returns the key and flags of the initiator's next token and its
// sequence number.
func (m *Initiator) next() (types.EncryptionKey, byte, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.done {
		return types.EncryptionKey{}, 0, 0, errors.New("krb5: context not established")
	}
	seq := m.sendSeq
	m.sendSeq++
	var fl byte
	if m.subkey {
		fl |= flagAcceptorSubkey
	}
	return m.key, fl, seq, nil
}

// peer returns the key the acceptor's tokens are under and the flags
// they must carry.
func (m *Initiator) peer() (types.EncryptionKey, byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.done {
		return types.EncryptionKey{}, 0, errors.New("krb5: context not established")
	}
	fl := byte(flagSentByAcceptor)
	if m.subkey {
		fl |= flagAcceptorSubkey
	}
	return m.key, fl, nil
}

// equalHeader compares token headers in constant time.
func equalHeader(a, b []byte) bool { return hmac.Equal(a, b) }

// ClientFromCCache returns a Kerberos client with the credentials in the
// FILE ticket cache at ccache (what kinit wrote), for the realm
// configuration in the krb5.conf at conf.
func ClientFromCCache(ccache, conf string) (*client.Client, error) {
	cfg, err := config.Load(conf)
	if err != nil {
		return nil, fmt.Errorf("krb5: %s: %w", conf, err)
	}
	cc, err := credentials.LoadCCache(ccache)
	if err != nil {
		return nil, fmt.Errorf("krb5: ticket cache %s: %w", ccache, err)
	}
	cl, err := client.NewFromCCache(cc, cfg, client.DisablePAFXFAST(true))
	if err != nil {
		return nil, fmt.Errorf("krb5: ticket cache %s: %w", ccache, err)
	}
	return cl, nil
}
