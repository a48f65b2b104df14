package oncrpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// stubMech is a GSS mechanism whose "checksum" of a message is
// "mic:" and its first four bytes as a number, and whose seal is
// "sealed:" and the message: enough to see what seal and open do with
// headers and bodies. The real mechanism (oncrpc/krb5) is tested
// against ganesha.
type stubMech struct{}

func (stubMech) InitToken() ([]byte, error)            { return nil, nil }
func (stubMech) Continue([]byte) ([]byte, bool, error) { return nil, true, nil }
func (stubMech) Wrap(msg []byte) ([]byte, error)       { return append([]byte("sealed:"), msg...), nil }
func (stubMech) MIC(msg []byte) ([]byte, error)        { return []byte(stubSum(msg)), nil }
func (m stubMech) VerifyMIC(msg, mic []byte) error {
	if string(mic) != stubSum(msg) {
		return errors.New("stub: bad mic")
	}
	return nil
}

func (stubMech) Unwrap(tok []byte) ([]byte, error) {
	if !bytes.HasPrefix(tok, []byte("sealed:")) {
		return nil, errors.New("stub: not sealed")
	}
	return tok[len("sealed:"):], nil
}

func stubSum(msg []byte) string {
	if len(msg) < 4 {
		return "mic:short"
	}
	return fmt.Sprintf("mic:%d", binary.BigEndian.Uint32(msg))
}

// TestGSSSeal checks each transmission of a call under a context: a
// new sequence number in the credential, the verifier the checksum of
// the header through it, and the arguments (bulk data included, which
// stops being DDP-eligible) inside the body with integrity or privacy.
func TestGSSSeal(t *testing.T) {
	for _, svc := range []GSSService{GSSNone, GSSIntegrity, GSSPrivacy} {
		t.Run(svc.String(), func(t *testing.T) {
			g := &GSSContext{mech: stubMech{}, service: svc, handle: []byte("ctx1"), seq: 41}
			c := NewClient(nil, 100003, 4, ClientOptions{})
			var e xdr.Encoder
			xid := c.StartCall(&e, 1, g.Credential())
			e.Uint32(0xa1a2a3a4) // arguments before the bulk data
			e.Uint32(5)          // its length word
			call := &Call{XID: xid, Head: e.Bytes(), Bulk: Plain([]byte("bulky")), Tail: []byte{0, 0, 0, 9}, ReplyBulk: Plain(make([]byte, 8)), GSS: g}
			if !gssPlaceholder(call.Head) {
				t.Fatal("StartCall's header under a context is not the placeholder")
			}
			sent := &gssSent{}
			for want := uint32(42); want <= 43; want++ {
				w, err := g.seal(call, sent)
				if err != nil {
					t.Fatal(err)
				}
				d := xdr.NewDecoder(w.Head)
				for range 6 {
					d.Uint32()
				}
				flavor, body := d.Uint32(), d.Opaque(maxAuthBody)
				cred, err := ParseGSSCred(body)
				if err != nil || flavor != FlavorGSS || cred.Seq != want || cred.Proc != gssData || cred.Service != svc || string(cred.Handle) != "ctx1" {
					t.Fatalf("credential %+v flavor %d, %v; want sequence %d", cred, flavor, err, want)
				}
				hdrEnd := len(w.Head) - d.Remaining()
				vflavor, verf := d.Uint32(), d.Opaque(maxAuthBody)
				if vflavor != FlavorGSS || string(verf) != stubSum(w.Head[:hdrEnd]) {
					t.Fatalf("verifier %d %q is not the header's checksum", vflavor, verf)
				}
				args := d.Rest()
				wantArgs := []byte{0xa1, 0xa2, 0xa3, 0xa4, 0, 0, 0, 5, 'b', 'u', 'l', 'k', 'y', 0, 0, 0, 0, 0, 0, 9}
				switch svc {
				case GSSNone:
					if !bytes.Equal(args, wantArgs[:8]) || string(w.Bulk.Bytes()) != "bulky" || w.ReplyBulk.IsZero() {
						t.Fatalf("krb5 changed the arguments or their bulk data: %x %q", args, w.Bulk.Bytes())
					}
				case GSSIntegrity, GSSPrivacy:
					ad := xdr.NewDecoder(args)
					inner := ad.Opaque(1 << 20)
					if svc == GSSIntegrity {
						if sum := ad.Opaque(maxAuthBody); string(sum) != stubSum(inner) {
							t.Fatalf("arguments checksum %q", sum)
						}
					} else {
						inner = bytes.TrimPrefix(inner, []byte("sealed:"))
					}
					if binary.BigEndian.Uint32(inner) != want || !bytes.Equal(inner[4:], wantArgs) {
						t.Fatalf("wrapped body %x", inner)
					}
					if !w.Bulk.IsZero() || w.Tail != nil || !w.ReplyBulk.IsZero() {
						t.Fatal("data stayed DDP-eligible under integrity or privacy")
					}
				}
			}
			if len(sent.seqs) != 2 {
				t.Fatalf("sequence numbers recorded: %v", sent.seqs)
			}
		})
	}
}

// TestGSSOpen checks a reply's verifier and results: a verifier for an
// earlier transmission is accepted, any other refused; results under
// integrity must carry the verifier's sequence number.
func TestGSSOpen(t *testing.T) {
	g := &GSSContext{mech: stubMech{}, service: GSSIntegrity}
	sent := &gssSent{seqs: []uint32{5, 6}}
	body := binary.BigEndian.AppendUint32(nil, 5)
	body = append(body, "results!"...)
	var e xdr.Encoder
	e.Opaque(body)
	e.Opaque([]byte(stubSum(body)))
	got, err := g.open(Credential{Flavor: FlavorGSS, Body: []byte("mic:5")}, e.Bytes(), sent, gssData)
	if err != nil || string(got) != "results!" {
		t.Fatalf("open = %q, %v", got, err)
	}
	for _, verf := range []string{"mic:7", "mic:6"} {
		// mic:7 was never sent; mic:6 is a transmission, but the results
		// carry 5.
		if _, err := g.open(Credential{Flavor: FlavorGSS, Body: []byte(verf)}, e.Bytes(), sent, gssData); !errors.Is(err, errGSSReply) {
			t.Errorf("verifier %s: %v, want the reply dropped", verf, err)
		}
	}
}

// TestGSSCallWithoutContext: a header written for a context but sent
// without it is refused, not sent with sequence number 0.
func TestGSSCallWithoutContext(t *testing.T) {
	g := &GSSContext{mech: stubMech{}, service: GSSNone, handle: []byte("h")}
	c := NewClient(nil, 100003, 4, ClientOptions{})
	var e xdr.Encoder
	xid := c.StartCall(&e, 1, g.Credential())
	_, err := c.Do(context.Background(), &Call{XID: xid, Head: e.Bytes()})
	if err == nil || !strings.Contains(err.Error(), "Call.GSS") {
		t.Fatalf("Do = %v", err)
	}
}

// TestGSSSequenceExhausted: a context whose numbers reach MAXSEQ is
// done (RFC 2203 s5.3.3.1).
func TestGSSSequenceExhausted(t *testing.T) {
	g := &GSSContext{mech: stubMech{}, service: GSSNone, seq: gssMaxSeq - 1}
	if _, err := g.nextSeq(); !errors.Is(err, ErrGSSContext) {
		t.Fatalf("nextSeq at MAXSEQ: %v", err)
	}
}
