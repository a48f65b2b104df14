package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// TestKerberosMount mounts the Kerberos ganesha's export (krb5, krb5i
// and krb5p only) with each Kerberos flavor, root's credentials coming
// from the machine keytab as rpc.gssd finds them ($KRB5_KTNAME,
// host/HOSTNAME), and lists it; a sec=sys mount of it fails.
func TestKerberosMount(t *testing.T) {
	k := testpeer.RequireKerberos(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	keytab := filepath.Join(t.TempDir(), "krb5.keytab")
	if err := k.KDC.AddService(ctx, "host/"+host, keytab); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KRB5_CONFIG", k.KDC.Config)
	t.Setenv("KRB5_KTNAME", "FILE:"+keytab)
	_, port := splitAddr(t, k.Ganesha.Addr)
	// The server's principal is nfs/localhost: the mount names it so.
	p := peer{name: "ganesha-krb5", host: "localhost", port: port, export: k.Ganesha.Export}
	if out, code := runBin(t, time.Minute, "mount", "-o", "port="+port+",sec=sys", p.source(), mountDir(t)); code == 0 {
		t.Errorf("a sec=sys mount of the Kerberos export succeeded")
	} else if !strings.Contains(out, "wants another security flavor") {
		t.Errorf("sec=sys mount: exit %d: %s, want the server's wish for another flavor", code, out)
	}
	// Root without a key in the keytab has no credentials: a one-line
	// error, no mount.
	t.Setenv("KRB5_KTNAME", "FILE:"+filepath.Join(t.TempDir(), "none.keytab"))
	if out, code := runBin(t, time.Minute, "mount", "-o", "port="+port+",sec=krb5", p.source(), mountDir(t)); code == 0 || !strings.Contains(out, "no Kerberos credentials") {
		t.Errorf("sec=krb5 mount without a keytab: exit %d: %s, want no Kerberos credentials", code, out)
	}
	t.Setenv("KRB5_KTNAME", "FILE:"+keytab)
	for _, sec := range []string{"krb5", "krb5i", "krb5p"} {
		t.Run(sec, func(t *testing.T) {
			mnt := mount(t, p, "sec="+sec)
			if _, err := os.ReadDir(mnt); err != nil {
				t.Errorf("readdir: %v", err)
			}
			if _, err := os.Stat(filepath.Join(mnt, "absent")); !os.IsNotExist(err) {
				t.Errorf("stat of an absent name: %v, want ENOENT", err)
			}
		})
	}
}
