package main

import (
	"bytes"
	"context"
	"fmt"
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
	t.Run("users", func(t *testing.T) { testKerberosUsers(t, k, p) })
	t.Run("wire", func(t *testing.T) { testKerberosWire(t, k) })
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

// testKerberosUsers checks that each user of an allow_other Kerberos
// mount calls with their own credentials: uid 1000 without a ticket is
// refused (EACCES) where root is not, and once uid 1000 has one in
// /tmp/krb5cc_1000_*, as kinit leaves it, the same lookup reaches the
// server (ENOENT).
func testKerberosUsers(t *testing.T, k *testpeer.Kerberos, p peer) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A directory anyone may search, made on the server's side (the
	// principals map to nobody there): the kernel's own permission
	// check lets uid 1000's lookup through to rdmafs.
	open := fmt.Sprintf("open-%d", time.Now().UnixNano())
	if err := os.Chmod(k.Ganesha.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(k.Ganesha.Dir, open), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(k.Ganesha.Dir, open), 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	mnt := mount(t, p, "sec=krb5i", "allow_other")
	for d := filepath.Dir(mnt); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil { // uid 1000 reaches the mount
			t.Fatal(err)
		}
	}
	absent := filepath.Join(mnt, open, "absent")
	if _, err := os.Stat(absent); !os.IsNotExist(err) {
		t.Fatalf("root: stat: %v, want ENOENT", err)
	}
	if out, err := asUser(t, nil, "stat", absent); err == nil || !strings.Contains(out, "Permission denied") {
		t.Errorf("uid 1000 without a ticket: stat: %v: %s, want Permission denied", err, out)
	}
	user, pw := fmt.Sprintf("carol%d", time.Now().UnixNano()), "carol-pw"
	if err := k.KDC.AddPrincipal(ctx, user, pw); err != nil {
		t.Fatal(err)
	}
	ccache := fmt.Sprintf("/tmp/krb5cc_1000_rdmafs-test-%d", time.Now().UnixNano())
	t.Cleanup(func() { os.Remove(ccache) })
	if err := k.KDC.Kinit(ctx, user, pw, ccache, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(ccache, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if out, err := asUser(t, nil, "stat", absent); err == nil || !strings.Contains(out, "No such file") {
		t.Errorf("uid 1000 with a ticket: stat: %v: %s, want No such file or directory", err, out)
	}
	// rdmafs stats shows a context per user: root's machine principal,
	// uid 1000's own.
	out, code := runBin(t, time.Minute, "stats", mnt)
	for _, want := range []string{"sec=krb5i contexts: 2", "uid 1000 principal " + user + "@", "uid 0 principal host/"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("rdmafs stats (exit %d) lacks %q:\n%s", code, want, out)
		}
	}
}

// testKerberosWire reads a file with a marker in it through a krb5p and a
// krb5i mount, each through a proxy that records the connection: with
// privacy the marker never crosses the wire in the clear; with integrity
// only it does (so the capture would show a leak), and the data is exact
// both ways.
func testKerberosWire(t *testing.T, k *testpeer.Kerberos) {
	marker := []byte(fmt.Sprintf("rdmafs-krb5-marker-%d", time.Now().UnixNano()))
	data := bytes.Repeat(append(marker, '\n'), 4096) // 160 KiB or so
	name := fmt.Sprintf("marked-%d", time.Now().UnixNano())
	if err := os.WriteFile(filepath.Join(k.Ganesha.Dir, name), data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, sec := range []string{"krb5p", "krb5i"} {
		proxy := newTCPProxy(t, k.Ganesha.Addr)
		_, port := splitAddr(t, proxy.ln.Addr().String())
		proxy.capture()
		mnt := mount(t, peer{name: "ganesha-krb5-proxied", host: "localhost", port: port, export: k.Ganesha.Export}, "sec="+sec)
		got, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: read %d bytes (%v), want the %d written", sec, len(got), err, len(data))
		}
		wire := proxy.captured()
		seen := bytes.Count(wire, marker)
		switch {
		case len(wire) < len(data):
			t.Errorf("%s: the capture holds %d bytes, less than the file's %d", sec, len(wire), len(data))
		case sec == "krb5p" && seen != 0:
			t.Errorf("krb5p: the marker crossed the wire in the clear %d times", seen)
		case sec == "krb5i" && seen == 0:
			t.Errorf("krb5i: the marker is not in the capture: the capture misses the data")
		}
	}
}
