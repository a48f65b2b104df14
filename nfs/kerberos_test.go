package nfs_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/nfs"
	"github.com/rdmafs/rdmafs/test/testpeer"
)

// TestKerberos reads a file of the Kerberos ganesha's export with each
// Kerberos flavor, with the ticket kinit left in a cache named by
// Options.CCache; the data is exact. Without a ticket Dial fails.
func TestKerberos(t *testing.T) {
	k := testpeer.RequireKerberos(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	user, pw := fmt.Sprintf("dave%d", time.Now().UnixNano()), "dave-pw"
	ccache := filepath.Join(t.TempDir(), "krb5cc")
	if err := k.KDC.AddPrincipal(ctx, user, pw); err != nil {
		t.Fatal(err)
	}
	if err := k.KDC.Kinit(ctx, user, pw, ccache, 0); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KRB5_CONFIG", k.KDC.Config)
	// The principal maps to nobody at the server: a file anyone may
	// read, written on the server's side.
	want := make([]byte, 3<<20+123)
	rand.Read(want)
	name := fmt.Sprintf("krb5-%d", time.Now().UnixNano())
	if err := os.Chmod(k.Ganesha.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(k.Ganesha.Dir, name), want, 0o644); err != nil {
		t.Fatal(err)
	}
	_, port, err := net.SplitHostPort(k.Ganesha.Addr)
	if err != nil {
		t.Fatal(err)
	}
	target := "localhost:" + port + ":" + k.Ganesha.Export // the server's principal is nfs/localhost
	for _, sec := range []string{"krb5", "krb5i", "krb5p"} {
		t.Run(sec, func(t *testing.T) {
			c, err := nfs.Dial(ctx, target, nfs.Options{Security: sec, CCache: ccache, RSize: 1 << 20})
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer c.Close()
			f, err := c.Open(ctx, name)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			defer f.Close()
			got, err := io.ReadAll(f)
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("read %d bytes (%v), want the %d written", len(got), err, len(want))
			}
		})
	}
	if c, err := nfs.Dial(ctx, target, nfs.Options{Security: "krb5", CCache: filepath.Join(t.TempDir(), "none")}); err == nil {
		c.Close()
		t.Errorf("dial without a ticket succeeded")
	}
}
