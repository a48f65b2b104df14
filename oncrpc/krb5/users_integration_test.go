package krb5_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/oncrpc/krb5"
)

// TestUsers finds credentials as rpc.gssd does and creates a context
// with ganesha from them: root's from the machine keytab (host/HOST),
// a user's from the krb5cc_UID they own. A cache another user owns,
// and one reached through a symbolic link, are not taken.
func TestUsers(t *testing.T) {
	r := requireRealm(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	keytab := filepath.Join(dir, "krb5.keytab")
	if err := r.kdc.AddService(ctx, "host/rdmafs-client.test", keytab); err != nil {
		t.Fatal(err)
	}
	ccaches := filepath.Join(dir, "ccaches")
	if err := os.Mkdir(ccaches, 0o1777); err != nil {
		t.Fatal(err)
	}
	alice, err := os.ReadFile(r.ccache)
	if err != nil {
		t.Fatal(err)
	}
	put := func(name string, uid int) string {
		p := filepath.Join(ccaches, name)
		if err := os.WriteFile(p, alice, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	put("krb5cc_1000_XyZ", 1000)
	put("krb5cc_1001", 1002) // planted by uid 1002 for 1001
	if err := os.Symlink(put("other", 1003), filepath.Join(ccaches, "krb5cc_1003")); err != nil {
		t.Fatal(err)
	}
	u := &krb5.Users{Config: r.kdc.Config, Keytab: keytab, Hostname: "rdmafs-client.test", Service: "nfs/localhost", CCacheDirs: []string{ccaches}}
	c := oncrpc.NewClient(oncrpc.NewTCPTransport(r.ganesha.Addr, oncrpc.TCPOptions{}), 100003, 4, oncrpc.ClientOptions{Timeout: 10 * time.Second})
	for _, uid := range []uint32{0, 1000} {
		mech, err := u.Mechanism(ctx, uid)
		if err != nil {
			t.Errorf("uid %d: %v", uid, err)
			continue
		}
		g, err := oncrpc.EstablishGSS(ctx, c, mech, oncrpc.GSSIntegrity)
		if err != nil {
			t.Errorf("uid %d: context: %v", uid, err)
			continue
		}
		if status, _, err := compound(ctx, c, g.Credential(), "users"); err != nil || status != nfs4errOpNotInSession {
			t.Errorf("uid %d: COMPOUND: status %d, %v", uid, status, err)
		}
	}
	for _, uid := range []uint32{1001, 1003, 1004} {
		if _, err := u.Mechanism(ctx, uid); !errors.Is(err, krb5.ErrNoCCache) {
			t.Errorf("uid %d: %v, want no ticket cache", uid, err)
		}
	}
	// Self: whoever a call is for, the process's own ticket, here
	// $KRB5CCNAME's.
	t.Setenv("KRB5CCNAME", "FILE:"+r.ccache)
	self := &krb5.Users{Config: r.kdc.Config, Service: "nfs/localhost", Self: true, CCacheDirs: []string{ccaches}}
	if mech, err := self.Mechanism(ctx, 1001); err != nil {
		t.Errorf("self for uid 1001: %v", err)
	} else if _, err := oncrpc.EstablishGSS(ctx, c, mech, oncrpc.GSSNone); err != nil {
		t.Errorf("self: context: %v", err)
	} else if p := mech.(interface{ Principal() string }).Principal(); !strings.HasPrefix(p, "alice@") {
		t.Errorf("self: principal %q, want alice's", p)
	}
	u.Hostname = "elsewhere.test"
	if _, err := u.Mechanism(ctx, 0); err == nil {
		t.Errorf("root on a host the keytab has no key for got credentials")
	}
}
