package nfsclient

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/oncrpc/krb5"
	"github.com/rdmafs/rdmafs/test/testpeer"
)

// ccacheSource is a GSSSource with one user: uid has the ticket in
// ccache; everyone else has none.
type ccacheSource struct {
	uid            uint32
	ccache, config string
	made           atomic.Int32 // mechanisms given
}

func (s *ccacheSource) Mechanism(ctx context.Context, uid uint32) (oncrpc.GSSMechanism, error) {
	if uid != s.uid {
		return nil, fmt.Errorf("no credential cache for uid %d", uid)
	}
	m, err := (&krb5.Users{Config: s.config, Service: "nfs/localhost", CCache: s.ccache}).Mechanism(ctx, uid)
	if err != nil {
		return nil, err
	}
	s.made.Add(1)
	return m, nil
}

// TestGSSClient mounts the Kerberos ganesha's export (krb5, krb5i and
// krb5p only) with each Kerberos flavor: root, whose ticket the source
// has, looks up the export and in it, one context serving all their
// calls; a user without one gets EACCES. With AUTH_SYS the export
// cannot be reached at all.
func TestGSSClient(t *testing.T) {
	k := testpeer.RequireKerberos(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if c, err := Dial(ctx, Config{Transport: oncrpc.NewTCPTransport(k.Ganesha.Addr, oncrpc.TCPOptions{}), Export: k.Ganesha.Export}); err == nil {
		c.Close(context.Background())
		t.Errorf("sec=sys reached the Kerberos export")
	} else if !errors.Is(err, ErrWrongSec) {
		t.Errorf("sec=sys: %v, want NFS4ERR_WRONGSEC", err)
	}
	// The realm outlives the test (-count): a principal of its own.
	bob, pw := fmt.Sprintf("bob%d", time.Now().UnixNano()), "bob-pw"
	ccache := filepath.Join(t.TempDir(), "krb5cc_bob")
	if err := k.KDC.AddPrincipal(ctx, bob, pw); err != nil {
		t.Fatal(err)
	}
	if err := k.KDC.Kinit(ctx, bob, pw, ccache, 0); err != nil {
		t.Fatal(err)
	}
	for _, sec := range []Security{SecKrb5, SecKrb5i, SecKrb5p} {
		t.Run(sec.String(), func(t *testing.T) {
			src := &ccacheSource{uid: 0, ccache: ccache, config: k.KDC.Config}
			c, err := Dial(ctx, Config{Transport: oncrpc.NewTCPTransport(k.Ganesha.Addr, oncrpc.TCPOptions{}),
				Export: k.Ganesha.Export, Security: sec, GSS: src, Tracer: testTracer()})
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer c.Close(context.Background())
			user := c.Cred(0, 0, nil)
			// The principal maps to no local user at the server
			// (nobody), so only what anyone may do is asked for.
			if _, err := c.GetAttr(ctx, user, c.RootFH()); err != nil {
				t.Errorf("getattr of the export: %v", err)
			}
			name := fmt.Sprintf("absent-%d", time.Now().UnixNano())
			if _, _, err := c.Lookup(ctx, user, c.RootFH(), name); Errno(err) != syscall.ENOENT {
				t.Errorf("lookup of an absent name: %v, want ENOENT", err)
			}
			if src.made.Load() != 1 {
				t.Errorf("%d contexts for one user, want 1", src.made.Load())
			}
			// The server forgets the context (as after its restart or
			// the context's expiry): the next call gets CREDPROBLEM and
			// is sent again under a new one.
			u, ok := c.gss.byUID.Get(0)
			if !ok {
				t.Fatal("no context kept for root")
			}
			if err := u.g.Destroy(ctx, c.rpc); err != nil {
				t.Fatalf("destroy: %v", err)
			}
			if _, err := c.GetAttr(ctx, user, c.RootFH()); err != nil {
				t.Errorf("getattr after the server forgot the context: %v", err)
			}
			if src.made.Load() != 2 {
				t.Errorf("%d contexts made, want 2 (one after the server forgot the first)", src.made.Load())
			}
			// Close destroys the contexts: on a connection of its own,
			// a call under root's is refused after the Close (and not
			// before: contexts are not bound to a connection).
			u, _ = c.gss.byUID.Get(0)
			ptr := oncrpc.NewTCPTransport(k.Ganesha.Addr, oncrpc.TCPOptions{})
			defer ptr.Close()
			probe := oncrpc.NewClient(ptr, nfsProgram, nfsVersion, oncrpc.ClientOptions{Timeout: 10 * time.Second})
			null := func() error {
				var e xdr.Encoder
				xid := probe.StartCall(&e, 0, u.g.Credential())
				rep, err := probe.Do(ctx, &oncrpc.Call{XID: xid, Head: e.Bytes(), GSS: u.g})
				if err == nil {
					rep.Release()
				}
				return err
			}
			if err := null(); err != nil {
				t.Errorf("NULL under the live context: %v", err)
			}
			if err := c.Close(ctx); err != nil {
				t.Errorf("close: %v", err)
			}
			if err := null(); !errors.Is(err, oncrpc.ErrGSSContext) {
				t.Errorf("NULL under a context after Close: %v, want CREDPROBLEM or CTXPROBLEM", err)
			}
			_, _, err = c.Lookup(ctx, c.Cred(2000, 2000, nil), c.RootFH(), "x")
			if !errors.Is(err, ErrNoCredentials) || Errno(err) != syscall.EACCES {
				t.Errorf("lookup as a user without a ticket: %v (errno %v), want EACCES", err, Errno(err))
			}
		})
	}
}

// TestGSSTicketExpiry: a context whose ticket ended is made again from
// the ticket the user has now (renewed with kinit, as a user or k5start
// does), and the calls go on without an error.
func TestGSSTicketExpiry(t *testing.T) {
	k := testpeer.RequireKerberos(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	user, pw := fmt.Sprintf("erin%d", time.Now().UnixNano()), "erin-pw"
	ccache := filepath.Join(t.TempDir(), "krb5cc_erin")
	if err := k.KDC.AddPrincipal(ctx, user, pw); err != nil {
		t.Fatal(err)
	}
	const life = 10 * time.Second
	if err := k.KDC.Kinit(ctx, user, pw, ccache, life); err != nil {
		t.Fatal(err)
	}
	first := time.Now()
	src := &ccacheSource{uid: 0, ccache: ccache, config: k.KDC.Config}
	c, err := Dial(ctx, Config{Transport: oncrpc.NewTCPTransport(k.Ganesha.Addr, oncrpc.TCPOptions{}),
		Export: k.Ganesha.Export, Security: SecKrb5i, GSS: src, Tracer: testTracer()})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close(context.Background())
	if us := c.GSSUsers(); len(us) != 1 || time.Until(us[0].Expires) > life {
		t.Fatalf("contexts %+v, want one ending within %v", us, life)
	}
	if err := k.KDC.Kinit(ctx, user, pw, ccache, 0); err != nil { // renewed
		t.Fatal(err)
	}
	for time.Since(first) < life+2*time.Second {
		if _, err := c.GetAttr(ctx, c.Cred(0, 0, nil), c.RootFH()); err != nil {
			t.Fatalf("getattr %v after the first ticket: %v", time.Since(first).Round(time.Second), err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if n := src.made.Load(); n != 2 {
		t.Errorf("%d contexts made, want 2 (one after the first ticket ended)", n)
	}
}
