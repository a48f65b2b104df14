package main

import (
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/nfsclient"
)

func TestParseSource(t *testing.T) {
	for _, tc := range []struct {
		src, host string
		port      int
		export    string
		err       string
	}{
		{src: "nfs1:/export", host: "nfs1", export: "/export"},
		{src: "nfs1:/", host: "nfs1", export: "/"},
		{src: "10.0.0.1:2050:/a/b", host: "10.0.0.1", port: 2050, export: "/a/b"},
		{src: "[fd00::1]:/export", host: "fd00::1", export: "/export"},
		{src: "[fd00::1]:20049:/x", host: "fd00::1", port: 20049, export: "/x"},
		{src: "nfs1", err: "want server[:port]:/export"},
		{src: "nfs1:export", err: "want server[:port]:/export"},
		{src: "nfs1:99999:/x", err: "bad port"},
		{src: "[fd00::1:/x", err: "missing ]"},
	} {
		host, port, export, err := parseSource(tc.src)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.src, err, tc.err)
			}
			continue
		}
		if err != nil || host != tc.host || port != tc.port || export != tc.export {
			t.Errorf("%q: got %q %d %q %v", tc.src, host, port, export, err)
		}
	}
}

func TestOptionList(t *testing.T) {
	o := defaultOptions()
	o.Server = "s"
	err := o.parseOptionList("proto=tcp,port=2050,vers=4.1,rsize=65536,wsize=131072,timeo=15,retrans=5,soft,actimeo=7,acdirmax=9,ro,allow_other,rdmavers=2,sec=krb5i,krb5ccdir=/var/krb5/:/run/user/UID,_netdev,defaults,x-systemd.automount")
	if err != nil {
		t.Fatal(err)
	}
	want := defaultOptions()
	want.Server = "s"
	want.Port, want.RSize, want.WSize = 2050, 65536, 131072
	want.Timeo, want.Retrans, want.Hard = 1500*time.Millisecond, 5, false
	want.AcRegMin, want.AcRegMax, want.AcDirMin, want.AcDirMax = 7*time.Second, 7*time.Second, 7*time.Second, 9*time.Second
	want.ReadOnly, want.AllowOther, want.RDMAVers = true, true, "2"
	want.Vers = "4.1"
	want.Sec = nfsclient.SecKrb5i
	want.CCacheDirs = []string{"/var/krb5", "/run/user/UID"}
	want.VFSFlags, want.VFSGiven = unix.MS_RDONLY, unix.MS_RDONLY
	if !reflect.DeepEqual(o, want) {
		t.Errorf("got  %+v\nwant %+v", o, want)
	}
	if got := o.addr(); got != "s:2050" {
		t.Errorf("addr %q", got)
	}
	o = defaultOptions()
	o.Server = "fd00::1"
	o.set("proto=rdma")
	if got := o.addr(); got != "[fd00::1]:20049" {
		t.Errorf("rdma addr %q", got)
	}
	o.set("actimeo=0")
	if !o.NoAC {
		t.Error("actimeo=0 does not turn off attribute caching")
	}
}

func TestOptionErrors(t *testing.T) {
	for opt, want := range map[string]string{
		"bogus":       `unknown mount option "bogus"`,
		"vers=4.0":    "4.1 and 4.2 only",
		"nfsvers=3":   "4.1 and 4.2 only",
		"proto=udp":   "proto=tcp or proto=rdma",
		"port=70000":  "out of range",
		"rsize=100":   "want 4096",
		"timeo=0":     "at least 1",
		"timeo":       "needs a value",
		"hard=yes":    "takes no value",
		"rdmavers=v2": "auto, 1 or 2",
		"acregmin=-1": "not a non-negative number",
		// One flavor, never a weaker one in its place.
		"sec=sys:krb5i":       "one flavor only",
		"proto=rdma,sec=krb5": "proto=tcp only",
		"sec=none":            "sec=none: want sys, krb5",
		"sec":                 "sec=: want sys, krb5",
	} {
		o := defaultOptions()
		err := o.parseOptionList(opt)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", opt, err, want)
		}
	}
}

func TestHelperArgs(t *testing.T) {
	got := helperArgs([]string{"/sbin/mount.rdmafs", "nfs1:/export", "/mnt", "-s", "-n", "-o", "rw,proto=rdma,_netdev", "-t", "fuse.rdmafs"})
	want := []string{"rdmafs", "mount", "-o", "rw,proto=rdma,_netdev", "nfs1:/export", "/mnt"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if !isMountHelper("/sbin/mount.fuse.rdmafs") || !isMountHelper("mount.rdmafs") || isMountHelper("rdmafs") {
		t.Error("isMountHelper")
	}
}

func TestReorderMountArgs(t *testing.T) {
	got := reorderMountArgs([]string{"rdmafs", "mount", "nfs1:/e", "/mnt", "-o", "ro", "-f", "--timeo", "5", "-v", "all"})
	want := []string{"rdmafs", "mount", "-o", "ro", "-f", "--timeo", "5", "-v", "all", "nfs1:/e", "/mnt"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestStatsSocketPath(t *testing.T) {
	a, b := statsSocket("/mnt/x"), statsSocket("/mnt/x/")
	if a != b || !strings.HasPrefix(a, runDir()+"/") || len(a) > 100 {
		t.Errorf("%q %q", a, b)
	}
	if statsSocket("/mnt/y") == a {
		t.Error("two mountpoints share a socket")
	}
}

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/mnt/a\040b`); got != "/mnt/a b" {
		t.Errorf("got %q", got)
	}
}

// TestHelp checks each command's help has a description and examples.
func TestHelp(t *testing.T) {
	for _, c := range newApp().Commands {
		if c.Description == "" || !strings.Contains(c.Description, "rdmafs "+c.Name) {
			t.Errorf("%s: help lacks a description with an example", c.Name)
		}
	}
}

// helpText runs rdmafs with args (ending in --help) and returns what it
// printed.
func helpText(t *testing.T, args ...string) string {
	t.Helper()
	var b strings.Builder
	app := newApp()
	app.Writer, app.ErrWriter = &b, &b
	if err := app.Run(append([]string{"rdmafs"}, args...)); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return b.String()
}

// TestMountHelpDocumentsEveryOption checks that rdmafs mount --help
// gives every flag its real default (not the flag type's zero value),
// lists every -o option with the option parser, the exit codes, and
// examples; and that the top-level help names the environment.
func TestMountHelpDocumentsEveryOption(t *testing.T) {
	help := helpText(t, "mount", "--help")
	for _, f := range mountFlags() {
		if vf, ok := f.(cli.VisibleFlag); ok && !vf.IsVisible() {
			continue
		}
		name := f.Names()[0]
		dash := "--"
		if len(name) == 1 {
			dash = "-"
		}
		var line string
		for _, l := range strings.Split(help, "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), dash+name+" ") || strings.HasPrefix(strings.TrimSpace(l), dash+name+",") {
				line = l
			}
		}
		if !strings.Contains(line, "(default: ") || strings.Contains(line, "(default: 0)") || strings.Contains(line, "(default: false)") {
			t.Errorf("flag %s%s: help line %q lacks its real default", dash, name, line)
		}
	}
	desc := help[strings.Index(help, "MOUNT OPTIONS"):strings.Index(help, "\nOPTIONS:")]
	o := defaultOptions()
	for _, opt := range []string{"proto=tcp", "port=1", "vers=4.1", "nfsvers=4.1", "rsize=4096", "wsize=4096", "timeo=1", "retrans=1",
		"hard", "soft", "actimeo=1", "acregmin=1", "acregmax=1", "acdirmin=1", "acdirmax=1", "noac", "ac", "ro", "rw", "allow_other", "rdmavers=auto"} {
		if err := o.set(opt); err != nil {
			t.Errorf("option %s: %v", opt, err)
		}
		name, _, _ := strings.Cut(opt, "=")
		if !regexp.MustCompile(`\b` + name + `\b`).MatchString(desc) {
			t.Errorf("option %s is not described under MOUNT OPTIONS", name)
		}
	}
	exits := help[strings.Index(help, "EXIT STATUS:"):]
	for _, code := range []int{0, exitUsage, exitMountpoint, exitFUSE, exitServer, exitExport, exitFailure} {
		if !regexp.MustCompile(`(?m)^\s+` + strconv.Itoa(code) + `\s+\S`).MatchString(exits) {
			t.Errorf("exit code %d not in EXIT STATUS:\n%s", code, exits)
		}
	}
	if strings.Count(help, "rdmafs mount ") < 5 || !strings.Contains(help, "fuse.rdmafs") {
		t.Errorf("mount help lacks examples or the fstab line")
	}
	top := helpText(t, "--help")
	for _, want := range []string{"ENVIRONMENT", "RDMAFS_RUN_DIR", "XDG_RUNTIME_DIR", "EXIT STATUS", "EXAMPLES"} {
		if !strings.Contains(top, want) {
			t.Errorf("rdmafs --help lacks %s", want)
		}
	}
	for _, cmd := range []string{"umount", "stats"} {
		if h := helpText(t, cmd, "--help"); !strings.Contains(h, "EXIT STATUS") {
			t.Errorf("rdmafs %s --help lacks EXIT STATUS", cmd)
		}
	}
}

func TestRDMADevOption(t *testing.T) {
	o := defaultOptions()
	if err := o.parseOptionList("proto=rdma,rdmadev=rxe0"); err != nil || o.RDMADev != "rxe0" {
		t.Fatalf("rdmadev=rxe0: %v %q", err, o.RDMADev)
	}
	if err := o.parseOptionList("rdmadev="); err == nil {
		t.Fatal("empty rdmadev accepted")
	}
	o.RDMADev = "iwarp-go"
	p, desc, inv, closer, err := rdmaProvider(&o)
	if err != nil || p == nil || closer != nil || !inv || desc == "" {
		t.Fatalf("rdmadev=iwarp-go: %v %q %v", err, desc, inv)
	}
	o.RDMADev = "no_such_dev0"
	if _, _, _, _, err := rdmaProvider(&o); err == nil || !strings.Contains(err.Error(), "rdmadev=no_such_dev0") {
		t.Fatalf("missing device: %v", err)
	}
}

func TestVFSOptionFlags(t *testing.T) {
	o := defaultOptions()
	if err := o.parseOptionList("nosuid,nodev,noexec,relatime,noatime,nodiratime,sync,dirsync,lazytime,remount"); err != nil {
		t.Fatal(err)
	}
	want := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NOATIME | unix.MS_NODIRATIME |
		unix.MS_SYNCHRONOUS | unix.MS_DIRSYNC | unix.MS_LAZYTIME)
	if o.VFSFlags != want || !o.Remount {
		t.Errorf("flags %#x remount %v, want %#x true", o.VFSFlags, o.Remount, want)
	}
	o.parseOptionList("suid,strictatime,async,ro")
	want = unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NODIRATIME | unix.MS_DIRSYNC | unix.MS_LAZYTIME | unix.MS_STRICTATIME | unix.MS_RDONLY
	if o.VFSFlags != want {
		t.Errorf("flags %#x, want %#x", o.VFSFlags, want)
	}
	if o.VFSGiven&(unix.MS_NOSUID|unix.MS_NOATIME|unix.MS_RELATIME|unix.MS_RDONLY) == 0 || o.VFSGiven&unix.MS_MANDLOCK != 0 {
		t.Errorf("given %#x", o.VFSGiven)
	}
	if err := o.set("noatime=1"); err == nil {
		t.Error("noatime=1 accepted")
	}
	for opts, wantErr := range map[string]string{
		"suid":               "option suid: only root",
		"dev,nosuid":         "option dev: only root",
		"nodiratime":         "option nodiratime: fusermount3 cannot",
		"noatime,nodev,sync": "",
	} {
		o := defaultOptions()
		if err := o.parseOptionList(opts); err != nil {
			t.Fatal(err)
		}
		err := o.checkUser()
		if wantErr == "" && err != nil || wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)) {
			t.Errorf("%s as a user: %v, want %q", opts, err, wantErr)
		}
	}
}
