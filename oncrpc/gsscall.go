package oncrpc

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// A call under an RPCSEC_GSS context, as Client.Do sends it: each
// transmission gets a sequence number of its own (RFC 2203 s5.3.3.1: "a
// retransmission ... must use a new sequence number"), so the header,
// its checksum and, with integrity or privacy, the wrapped arguments are
// written again each time; the reply's verifier is the checksum of the
// sequence number of one of the transmissions, and a reply whose
// verifier or results do not check is dropped (s5.3.3.2) and the call
// sent again, a bounded number of times.

// errGSSReply marks a reply that failed its RPCSEC_GSS checks: it is
// dropped, and the call sent again.
var errGSSReply = errors.New("rpc: RPCSEC_GSS reply does not check")

// gssReplyRetries bounds how often a call is sent again after replies
// that did not check: a path that corrupts every reply fails the call.
const gssReplyRetries = 3

// gssSent is what Do remembers of a call's transmissions: the sequence
// numbers the server may answer under.
type gssSent struct {
	seqs []uint32
}

// gssPlaceholder reports whether head starts with the header StartCall
// writes for a call under an RPCSEC_GSS context: an RPCSEC_GSS_DATA
// credential with sequence number 0, which is never sent.
func gssPlaceholder(head []byte) bool {
	if len(head) < 44 || binary.BigEndian.Uint32(head[24:]) != FlavorGSS {
		return false
	}
	return binary.BigEndian.Uint32(head[36:]) == gssData && binary.BigEndian.Uint32(head[40:]) == 0
}

// callHeaderLen returns the length of the RPC call header at the start of
// msg: six words, then the credential and the verifier (RFC 5531 s9).
func callHeaderLen(msg []byte) (int, error) {
	d := xdr.NewDecoder(msg)
	for range 6 {
		d.Uint32()
	}
	d.Uint32()
	d.Opaque(maxAuthBody)
	d.Uint32()
	d.Opaque(maxAuthBody)
	if d.Err() != nil {
		return 0, fmt.Errorf("rpc: call header: %w", d.Err())
	}
	return len(msg) - len(d.Rest()), nil
}

// seal returns the call as it is sent this time: with a new sequence
// number, recorded in sent, and the header written for it.
func (g *GSSContext) seal(call *Call, sent *gssSent) (*Call, error) {
	hlen, err := callHeaderLen(call.Head)
	if err != nil {
		return nil, err
	}
	seq, err := g.nextSeq()
	if err != nil {
		return nil, err
	}
	sent.seqs = append(sent.seqs, seq)
	head := call.Head
	var e xdr.Encoder
	// xid, msg_type, rpcvers, prog, vers, proc: as StartCall wrote them.
	e.FixedOpaque(head[:24])
	proc := uint32(gssData)
	if call.gssProc != 0 {
		proc = call.gssProc
	}
	GSSCred{Proc: proc, Seq: seq, Service: g.service, Handle: g.handle}.Credential().encode(&e)
	// RFC 2203 s5.3.1: the verifier is the checksum of the header from
	// the XID through the credential.
	mic, err := g.mech.MIC(e.Bytes())
	if err != nil {
		return nil, fmt.Errorf("rpc: RPCSEC_GSS header checksum: %w", err)
	}
	Credential{Flavor: FlavorGSS, Body: mic}.encode(&e)
	out := *call
	out.GSS, out.gssProc = nil, 0
	// Only data calls have their arguments protected; a DESTROY has none
	// (as Linux: net/sunrpc/auth_gss gss_wrap_req).
	if g.service == GSSNone || proc != gssData {
		e.FixedOpaque(head[hlen:])
		out.Head = e.Bytes()
		return &out, nil
	}
	// RFC 2203 s5.3.2.2 and s5.3.2.3: the sequence number and the
	// arguments, as one body. The arguments' bulk data is inside what
	// the checksum or the seal covers, so it is no longer DDP-eligible:
	// over RPC-over-RDMA the call goes inline or as a Position-Zero
	// Read chunk, and the reply comes in the message (RFC 8166 s3.4.2:
	// only an upper-layer binding's DDP-eligible items move by chunks;
	// RFC 8267 s4: a data item is DDP-eligible as the XDR of the NFS
	// arguments shows it, which the wrapped body hides).
	body := binary.BigEndian.AppendUint32(nil, seq)
	body = append(body, head[hlen:]...)
	if !call.Bulk.IsZero() {
		body = append(body, call.Bulk.Bytes()...)
		body = append(body, make([]byte, (4-call.Bulk.Len()&3)&3)...)
	}
	body = append(body, call.Tail...)
	switch g.service {
	case GSSIntegrity:
		sum, err := g.mech.MIC(body)
		if err != nil {
			return nil, fmt.Errorf("rpc: RPCSEC_GSS arguments checksum: %w", err)
		}
		e.Opaque(body)
		e.Opaque(sum)
	case GSSPrivacy:
		sealed, err := g.mech.Wrap(body)
		if err != nil {
			return nil, fmt.Errorf("rpc: RPCSEC_GSS arguments seal: %w", err)
		}
		e.Opaque(sealed)
	default:
		return nil, fmt.Errorf("rpc: RPCSEC_GSS service %v", g.service)
	}
	out.Head, out.Bulk, out.Tail, out.ReplyBulk = e.Bytes(), View{}, nil, View{}
	if out.MaxReplySize > 0 && !call.ReplyBulk.IsZero() {
		out.MaxReplySize += call.ReplyBulk.Len()
	}
	return &out, nil
}

// maxGSSResults bounds a wrapped result body.
const maxGSSResults = 1 << 30

// open checks a reply to a call sent under g: its verifier must be the
// checksum of one of the call's sequence numbers, and with integrity or
// privacy the results must check and carry that number. It returns the
// procedure results. A reply that does not check wraps errGSSReply.
func (g *GSSContext) open(verf Credential, results []byte, sent *gssSent, proc uint32) ([]byte, error) {
	if verf.Flavor != FlavorGSS {
		return nil, fmt.Errorf("%w: verifier of flavor %d", errGSSReply, verf.Flavor)
	}
	seq, ok := uint32(0), false
	for i := len(sent.seqs) - 1; i >= 0 && !ok; i-- {
		// RFC 2203 s5.3.3.2: the verifier is the checksum of the
		// sequence number, in XDR.
		if g.mech.VerifyMIC(binary.BigEndian.AppendUint32(nil, sent.seqs[i]), verf.Body) == nil {
			seq, ok = sent.seqs[i], true
		}
	}
	if !ok {
		return nil, fmt.Errorf("%w: the verifier is not the checksum of any sequence number sent", errGSSReply)
	}
	if g.service == GSSNone || proc != gssData {
		return results, nil
	}
	d := xdr.NewDecoder(results)
	var body []byte
	switch g.service {
	case GSSIntegrity:
		body = d.Opaque(maxGSSResults)
		sum := d.Opaque(maxAuthBody)
		if d.Err() != nil {
			return nil, fmt.Errorf("%w: integrity results: %v", errGSSReply, d.Err())
		}
		if err := g.mech.VerifyMIC(body, sum); err != nil {
			return nil, fmt.Errorf("%w: results checksum: %v", errGSSReply, err)
		}
	case GSSPrivacy:
		sealed := d.Opaque(maxGSSResults)
		if d.Err() != nil {
			return nil, fmt.Errorf("%w: privacy results: %v", errGSSReply, d.Err())
		}
		var err error
		if body, err = g.mech.Unwrap(sealed); err != nil {
			return nil, fmt.Errorf("%w: results seal: %v", errGSSReply, err)
		}
	}
	bd := xdr.NewDecoder(body)
	if got := bd.Uint32(); bd.Err() != nil || got != seq {
		return nil, fmt.Errorf("%w: results carry sequence number %d, the verifier %d", errGSSReply, got, seq)
	}
	return bd.Rest(), nil
}
