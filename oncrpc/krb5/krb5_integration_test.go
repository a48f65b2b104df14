package krb5_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/oncrpc/krb5"
	"github.com/rdmafs/rdmafs/test/testpeer"
)

func TestMain(m *testing.M) { testpeer.Main(m) }

// realm is the shared Kerberos realm and ganesha, with a user, alice,
// who got her ticket with kinit.
type realm struct {
	kdc     *testpeer.KDC
	ganesha *testpeer.Ganesha
	ccache  string // alice's ticket cache
}

var alice struct {
	once   sync.Once
	ccache string
	err    error
}

func requireRealm(t *testing.T) *realm {
	t.Helper()
	k := testpeer.RequireKerberos(t)
	alice.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if alice.err = k.KDC.AddPrincipal(ctx, "alice", "alice-pw"); alice.err != nil {
			return
		}
		alice.ccache = filepath.Join(k.KDC.RunDir, "krb5cc_alice")
		alice.err = k.KDC.Kinit(ctx, "alice", "alice-pw", alice.ccache, 0)
	})
	if alice.err != nil {
		t.Fatal(alice.err)
	}
	return &realm{kdc: k.KDC, ganesha: k.Ganesha, ccache: alice.ccache}
}

// dial connects to the realm's ganesha through a recorder and creates a
// context for alice with service svc; the connection closes with the
// test.
func (r *realm) dial(ctx context.Context, t *testing.T, svc oncrpc.GSSService) (*recorder, *oncrpc.Client, *oncrpc.GSSContext) {
	t.Helper()
	cl, err := krb5.ClientFromCCache(r.ccache, r.kdc.Config)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{Transport: oncrpc.NewTCPTransport(r.ganesha.Addr, oncrpc.TCPOptions{})}
	t.Cleanup(func() { rec.Close() })
	c := oncrpc.NewClient(rec, 100003, 4, oncrpc.ClientOptions{Timeout: 10 * time.Second})
	g, err := oncrpc.EstablishGSS(ctx, c, krb5.NewInitiator(cl, "nfs/localhost"), svc)
	if err != nil {
		t.Fatalf("context: %v", err)
	}
	return rec, c, g
}

// recorder is a transport that keeps a copy of what goes on the wire and
// can flip a byte of the next replies: the fault a man in the middle
// causes, which no real server produces on demand.
type recorder struct {
	oncrpc.Transport
	mu      sync.Mutex
	sent    [][]byte
	replies [][]byte
	corrupt atomic.Int32 // replies still to corrupt
}

func (r *recorder) RoundTrip(ctx context.Context, call *oncrpc.Call) (*oncrpc.Reply, error) {
	msg := append(append(append([]byte(nil), call.Head...), call.Bulk.Bytes()...), call.Tail...)
	rep, err := r.Transport.RoundTrip(ctx, call)
	if err != nil {
		return rep, err
	}
	if r.corrupt.Add(-1) >= 0 {
		rep.Msg[len(rep.Msg)-5] ^= 0x40 // inside the results' checksum or seal
	}
	r.mu.Lock()
	r.sent = append(r.sent, msg)
	r.replies = append(r.replies, append([]byte(nil), rep.Msg...))
	r.mu.Unlock()
	return rep, nil
}

// compound sends an NFSv4.1 COMPOUND whose tag is tag and whose one
// operation is PUTROOTFH, outside a session, and returns the status of
// the reply: NFS4ERR_OP_NOT_IN_SESSION (RFC 8881 s2.10.6.1) from a
// server that read the arguments, and the same tag back.
func compound(ctx context.Context, c *oncrpc.Client, cred oncrpc.Credential, tag string) (uint32, string, error) {
	var e xdr.Encoder
	xid := c.StartCall(&e, 1, cred)
	e.String(tag)
	e.Uint32(1)  // minorversion
	e.Uint32(1)  // one operation
	e.Uint32(24) // OP_PUTROOTFH
	rep, err := c.Do(ctx, &oncrpc.Call{XID: xid, Head: e.Bytes(), GSS: cred.GSS})
	if err != nil {
		return 0, "", err
	}
	defer rep.Release()
	d := xdr.NewDecoder(rep.Results)
	status := d.Uint32()
	gotTag := d.String(1024)
	return status, gotTag, d.Err()
}

const nfs4errOpNotInSession = 10071

// TestGSSGanesha creates an RPCSEC_GSS context with ganesha from a user's
// kinit ticket for each service, sends a COMPOUND under it, destroys it,
// and checks what went on the wire: the credential's flavor everywhere,
// the tag in the clear without privacy and nowhere with it.
func TestGSSGanesha(t *testing.T) {
	r := requireRealm(t)
	for _, svc := range []oncrpc.GSSService{oncrpc.GSSNone, oncrpc.GSSIntegrity, oncrpc.GSSPrivacy} {
		t.Run(svc.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			rec, c, g := r.dial(ctx, t, svc)
			marker := "rdmafs-marker-" + svc.String()
			for range 3 {
				status, tag, err := compound(ctx, c, g.Credential(), marker)
				if err != nil || status != nfs4errOpNotInSession || tag != marker {
					t.Fatalf("COMPOUND under %v: status %d tag %q, %v; want %d and the tag", svc, status, tag, err, nfs4errOpNotInSession)
				}
			}
			if err := g.Destroy(ctx, c); err != nil {
				t.Fatalf("destroy: %v", err)
			}
			// The server forgot the context: a call under it is refused.
			if _, _, err := compound(ctx, c, g.Credential(), marker); !isGSSProblem(err) {
				t.Errorf("a call under the destroyed context: %v, want CREDPROBLEM or CTXPROBLEM", err)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			clear := 0
			for _, m := range append(append([][]byte(nil), rec.sent...), rec.replies...) {
				if bytes.Contains(m, []byte(marker)) {
					clear++
				}
			}
			if svc == oncrpc.GSSPrivacy && clear != 0 {
				t.Errorf("krb5p: the tag went over the wire in the clear in %d messages", clear)
			}
			if svc != oncrpc.GSSPrivacy && clear < 6 {
				t.Errorf("%v: the tag in the clear in %d messages, want at least 6 (3 calls, 3 replies)", svc, clear)
			}
			// Each call carried an RPCSEC_GSS credential with its own
			// sequence number.
			seen := map[uint32]bool{}
			for _, m := range rec.sent[1:] {
				if flavor := binary.BigEndian.Uint32(m[24:]); flavor != oncrpc.FlavorGSS {
					t.Fatalf("a call of flavor %d", flavor)
				}
				cred, err := oncrpc.ParseGSSCred(m[32 : 32+binary.BigEndian.Uint32(m[28:])])
				if err != nil {
					t.Fatal(err)
				}
				if seen[cred.Seq] {
					t.Errorf("sequence number %d used twice", cred.Seq)
				}
				seen[cred.Seq] = true
			}
		})
	}
}

func isGSSProblem(err error) bool {
	var de *oncrpc.DeniedError
	return errors.As(err, &de) && (de.AuthStat == oncrpc.AuthGSSCredProblem || de.AuthStat == oncrpc.AuthGSSCtxProblem)
}

// TestGSSReplyTampered flips a byte of krb5i and krb5p replies on their
// way: the client drops each and sends the call again under a new
// sequence number, never delivering the tampered results; when every
// reply is tampered with, the call fails.
func TestGSSReplyTampered(t *testing.T) {
	r := requireRealm(t)
	for _, svc := range []oncrpc.GSSService{oncrpc.GSSIntegrity, oncrpc.GSSPrivacy} {
		t.Run(svc.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			rec, c, g := r.dial(ctx, t, svc)
			before := len(rec.sent)
			rec.corrupt.Store(2)
			status, tag, err := compound(ctx, c, g.Credential(), "tampered")
			if err != nil || status != nfs4errOpNotInSession || tag != "tampered" {
				t.Fatalf("COMPOUND after two tampered replies: status %d tag %q, %v", status, tag, err)
			}
			if n := len(rec.sent) - before; n != 3 {
				t.Errorf("the call was sent %d times, want 3 (two replies dropped)", n)
			}
			rec.corrupt.Store(100)
			if _, _, err := compound(ctx, c, g.Credential(), "tampered"); err == nil {
				t.Error("a call whose every reply was tampered with succeeded")
			}
		})
	}
}
