package main

import (
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/nfsclient"
)

// mountOptions are the nfs(5)-style options of a mount.
type mountOptions struct {
	Server string // host name or address, without brackets
	Port   int
	Export string
	Dir    string

	Proto string // tcp or rdma
	Vers  string
	Sec   nfsclient.Security // sec=: AUTH_SYS or a Kerberos flavor
	// CCacheDirs are krb5ccdir=: where users' ticket caches are; nil
	// is rpc.gssd's default.
	CCacheDirs []string
	RSize      int
	WSize      int
	Timeo      time.Duration
	Retrans    int
	Hard       bool
	AcRegMin   time.Duration
	AcRegMax   time.Duration
	AcDirMin   time.Duration
	AcDirMax   time.Duration
	NoAC       bool
	ReadOnly   bool
	// AllowOther lets other users use the mount (FUSE allow_other).
	AllowOther bool
	RDMAVers   string // auto, 1 or 2: the RPC-over-RDMA version
	// RDMAMem bounds the registered memory of a proto=rdma mount: the
	// buffers READ data lands in and WRITE data leaves from.
	RDMAMem int64
	// RDMADev forces the verbs provider of a proto=rdma mount: an RDMA
	// device name (rdma-core provider) or "iwarp-go" (pure Go); empty
	// picks rdma-core when the machine has an RDMA device.
	RDMADev string
	// URing serves the mount over FUSE-over-io_uring instead of
	// /dev/fuse reads and writes (uring, uring=on|auto|off, nouring).
	URing fuse.URingMode
	// NConnect is the number of connections to the server (nfs(5)
	// nconnect), 1 to 16.
	NConnect int
	// ResvPort and NoResvPort are the resvport and noresvport options
	// (nfs(5)): with neither, TCP connections come from a reserved
	// source port when rdmafs runs as root (resvPort).
	ResvPort, NoResvPort bool

	// VFSFlags are the generic options of mount(8) as MS_* bits
	// (nosuid, noatime, sync, ...), applied to the kernel's mount;
	// VFSGiven marks the bits an option named, for a remount, which
	// keeps the others as they are.
	VFSFlags, VFSGiven uintptr
	// Remount changes the flags of a live mount instead of mounting.
	Remount bool
}

// Default ports: NFS over TCP (RFC 7530 s3.1) and over RDMA (RFC 8267
// s6.2.1, the "nfsrdma" port).
const (
	defaultTCPPort  = 2049
	defaultRDMAPort = 20049
)

func defaultOptions() mountOptions {
	return mountOptions{
		Proto:    "tcp",
		Vers:     "4", // 4.2, or 4.1 if the server refuses 4.2
		RSize:    1 << 20,
		WSize:    1 << 20,
		Timeo:    60 * time.Second, // nfs(5): timeo=600 for TCP
		Retrans:  2,
		Hard:     true,
		RDMAVers: "auto",
		RDMAMem:  64 << 20,
		NConnect: 1,
	}
}

// uringEnv names the environment variable that sets the default of the
// uring option (auto, on or off; unset is off).
const uringEnv = "RDMAFS_URING"

// parseURing parses the value of uring= (or of $RDMAFS_URING); a bare
// "uring" is uring=on.
func parseURing(val string, hasVal bool) (fuse.URingMode, error) {
	switch {
	case !hasVal, val == "on":
		return fuse.URingOn, nil
	case val == "auto":
		return fuse.URingAuto, nil
	case val == "off":
		return fuse.URingOff, nil
	}
	return 0, fmt.Errorf("want on, auto or off, not %q", val)
}

// defaultURing is the uring option's default: $RDMAFS_URING, or off.
func defaultURing() (fuse.URingMode, error) {
	val, ok := os.LookupEnv(uringEnv)
	if !ok || val == "" {
		return fuse.URingOff, nil
	}
	mode, err := parseURing(val, true)
	if err != nil {
		return 0, fmt.Errorf("%s=%s: %w", uringEnv, val, err)
	}
	return mode, nil
}

// parseSize parses a byte count with an optional K, M or G suffix
// (powers of 1024), as rdmamem=256M.
func parseSize(val string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(val, "K"), strings.HasSuffix(val, "k"):
		mult = 1 << 10
	case strings.HasSuffix(val, "M"), strings.HasSuffix(val, "m"):
		mult = 1 << 20
	case strings.HasSuffix(val, "G"), strings.HasSuffix(val, "g"):
		mult = 1 << 30
	}
	if mult != 1 {
		val = val[:len(val)-1]
	}
	v, err := strconv.ParseInt(val, 10, 64)
	if err != nil || v < 0 || v > (1<<40)/mult {
		return 0, fmt.Errorf("want a byte count such as 67108864 or 64M")
	}
	return v * mult, nil
}

// ignoredOptions are accepted for fstab and mount(8) compatibility and
// have no effect on rdmafs. mand and nomand are mount(8)'s, without
// effect since Linux 5.15 (mandatory locking is gone); iversion is the
// file system's business (the NFS change attribute); silent and loud
// only quieten a kernel file system's messages.
var ignoredOptions = map[string]bool{
	"_netdev": true, "defaults": true, "auto": true, "noauto": true, "nofail": true,
	"user": true, "nouser": true, "users": true, "owner": true, "group": true,
	"mand": true, "nomand": true, "iversion": true, "noiversion": true, "silent": true, "loud": true,
	"intr": true, "nointr": true, "cto": true,
	"lookupcache": true, "fsc": true, "nofsc": true, "local_lock": true,
	"minorversion": true, "clientaddr": true, "namlen": true,
	// The kernel FUSE options rdmafs sets itself, which mount(8) repeats
	// from /proc/self/mountinfo when it runs the helper for a remount.
	"user_id": true, "group_id": true, "default_permissions": true, "max_read": true,
	"rootmode": true, "blksize": true, "fd": true,
}

// vfsOption is one of mount(8)'s file-system-independent options: it
// sets the MS_* bits set and clears those in clear (the kernel's
// mount(2) flags, mount(8) "FILESYSTEM-INDEPENDENT MOUNT OPTIONS").
type vfsOption struct{ set, clear uintptr }

var vfsOptions = map[string]vfsOption{
	"nosuid":        {set: unix.MS_NOSUID},
	"suid":          {clear: unix.MS_NOSUID},
	"nodev":         {set: unix.MS_NODEV},
	"dev":           {clear: unix.MS_NODEV},
	"noexec":        {set: unix.MS_NOEXEC},
	"exec":          {clear: unix.MS_NOEXEC},
	"sync":          {set: unix.MS_SYNCHRONOUS},
	"async":         {clear: unix.MS_SYNCHRONOUS},
	"dirsync":       {set: unix.MS_DIRSYNC},
	"noatime":       {set: unix.MS_NOATIME, clear: unix.MS_STRICTATIME | unix.MS_RELATIME},
	"atime":         {clear: unix.MS_NOATIME},
	"nodiratime":    {set: unix.MS_NODIRATIME},
	"diratime":      {clear: unix.MS_NODIRATIME},
	"relatime":      {set: unix.MS_RELATIME, clear: unix.MS_STRICTATIME | unix.MS_NOATIME},
	"norelatime":    {clear: unix.MS_RELATIME},
	"strictatime":   {set: unix.MS_STRICTATIME, clear: unix.MS_NOATIME | unix.MS_RELATIME},
	"nostrictatime": {clear: unix.MS_STRICTATIME},
	"lazytime":      {set: unix.MS_LAZYTIME},
	"nolazytime":    {clear: unix.MS_LAZYTIME},
	"nosymfollow":   {set: unix.MS_NOSYMFOLLOW},
	"symfollow":     {clear: unix.MS_NOSYMFOLLOW},
}

// parseOptionList applies a comma-separated option list ("-o a=b,c").
func (o *mountOptions) parseOptionList(list string) error {
	for _, opt := range strings.Split(list, ",") {
		opt = strings.TrimSpace(opt)
		if opt == "" {
			continue
		}
		if err := o.set(opt); err != nil {
			return err
		}
	}
	if o.Sec != nfsclient.SecSys && o.Proto == "rdma" {
		// RFC 8166 s8.2.2: with integrity or privacy the data cannot be
		// placed directly; not yet built or tested over RDMA.
		return fmt.Errorf("option sec=%v: Kerberos is supported over proto=tcp only, not yet over RDMA", o.Sec)
	}
	return nil
}

// optionArg is one option as given: its name, and its value if it has
// one ("rsize=65536"; "hard" has none).
type optionArg struct {
	opt    string // as given
	name   string
	val    string
	hasVal bool
}

// num returns the value as a non-negative number.
func (a optionArg) num() (int, error) {
	if !a.hasVal {
		return 0, fmt.Errorf("option %s needs a value (%s=N)", a.name, a.name)
	}
	v, err := strconv.Atoi(a.val)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("option %s=%s: not a non-negative number", a.name, a.val)
	}
	return v, nil
}

// secs sets d to the value, a number of seconds.
func (a optionArg) secs(d *time.Duration) error {
	v, err := a.num()
	if err != nil {
		return err
	}
	*d = time.Duration(v) * time.Second
	return nil
}

// noVal refuses a value.
func (a optionArg) noVal() error {
	if a.hasVal {
		return fmt.Errorf("option %s takes no value", a.name)
	}
	return nil
}

// set applies one option, "name" or "name=value".
func (o *mountOptions) set(opt string) error {
	name, val, hasVal := strings.Cut(opt, "=")
	a := optionArg{opt: opt, name: name, val: val, hasVal: hasVal}
	if mo, ok := mountOptionByName[name]; ok {
		return mo.set(o, a)
	}
	if v, ok := vfsOptions[name]; ok {
		if err := a.noVal(); err != nil {
			return err
		}
		o.VFSFlags = o.VFSFlags&^v.clear | v.set
		o.VFSGiven |= v.set | v.clear
		return nil
	}
	if ignoredOptions[name] || strings.HasPrefix(name, "x-") {
		return nil
	}
	return fmt.Errorf("unknown mount option %q (see rdmafs mount --help)", opt)
}

// userFlags are the MS_* bits a mount by an ordinary user can have: those
// fusermount3 (fuse 3.14, its mount_flags table) sets, and relatime, the
// kernel's default. fusermount3 mounts nosuid,nodev whatever it is
// asked.
const userFlags = unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC |
	unix.MS_SYNCHRONOUS | unix.MS_NOATIME | unix.MS_DIRSYNC | unix.MS_RELATIME

// checkUser refuses, for a mount by an ordinary user (through
// fusermount3), the options fusermount3 cannot honour: suid and dev
// (only root may mount with set-user-ID files and devices), and the
// flags it does not pass on.
func (o *mountOptions) checkUser() error {
	if bad := o.VFSGiven &^ o.VFSFlags & (unix.MS_NOSUID | unix.MS_NODEV); bad != 0 {
		return fmt.Errorf("option %s: only root mounts with %s; an ordinary user's mount is nosuid,nodev (fusermount3)",
			vfsNames(bad, true), vfsNames(bad, true))
	}
	if bad := o.VFSFlags &^ userFlags; bad != 0 {
		return fmt.Errorf("option %s: fusermount3 cannot set it for an ordinary user; mount as root", vfsNames(bad, false))
	}
	return nil
}

// vfsNames names the options that set bits (or, with cleared, clear
// them): "nosuid,nodev" or "suid,dev".
func vfsNames(bits uintptr, cleared bool) string {
	var names []string
	for _, name := range slices.Sorted(maps.Keys(vfsOptions)) {
		v := vfsOptions[name]
		b := v.set
		if cleared {
			b = v.clear
			if v.set != 0 {
				continue
			}
		}
		if b != 0 && b&bits == b {
			names = append(names, name)
		}
	}
	return strings.Join(names, ",")
}

// parseSource splits "server[:port]:/export". The server may be a
// bracketed IPv6 address ("[fd00::1]:/export").
func parseSource(src string) (host string, port int, export string, err error) {
	rest := src
	if strings.HasPrefix(rest, "[") {
		end := strings.Index(rest, "]")
		if end < 0 {
			return "", 0, "", fmt.Errorf("source %q: missing ]", src)
		}
		host, rest = rest[1:end], rest[end+1:]
		if !strings.HasPrefix(rest, ":") {
			return "", 0, "", fmt.Errorf("source %q: want server:/export", src)
		}
		rest = rest[1:]
	} else {
		i := strings.Index(rest, ":")
		if i <= 0 {
			return "", 0, "", fmt.Errorf("source %q: want server[:port]:/export", src)
		}
		host, rest = rest[:i], rest[i+1:]
	}
	if !strings.HasPrefix(rest, "/") {
		p, exp, ok := strings.Cut(rest, ":")
		if !ok || !strings.HasPrefix(exp, "/") {
			return "", 0, "", fmt.Errorf("source %q: want server[:port]:/export", src)
		}
		port, err = strconv.Atoi(p)
		if err != nil || port <= 0 || port > 65535 {
			return "", 0, "", fmt.Errorf("source %q: bad port %q", src, p)
		}
		rest = exp
	}
	return host, port, rest, nil
}

// addr returns "host:port" with the port the options select.
func (o *mountOptions) addr() string {
	port := o.Port
	if port == 0 {
		port = defaultTCPPort
		if o.Proto == "rdma" {
			port = defaultRDMAPort
		}
	}
	return net.JoinHostPort(o.Server, strconv.Itoa(port))
}

// String renders the options as in /proc/mounts, for stats.
func (o *mountOptions) String() string {
	hs := "hard"
	if !o.Hard {
		hs = "soft"
	}
	rw := "rw"
	if o.ReadOnly {
		rw = "ro"
	}
	s := fmt.Sprintf("%s,vers=%s,proto=%s,addr=%s,rsize=%d,wsize=%d,timeo=%d,retrans=%d,%s",
		rw, o.Vers, o.Proto, o.addr(), o.RSize, o.WSize, o.Timeo/(100*time.Millisecond), o.Retrans, hs)
	if o.NConnect > 1 {
		s += fmt.Sprintf(",nconnect=%d", o.NConnect) // as /proc/mounts shows it: only above 1
	}
	if !o.resvPort() && o.Proto == "tcp" {
		s += ",noresvport" // as /proc/mounts shows it: only when off
	}
	return s
}

// resvPort reports whether TCP connections bind a reserved source port:
// resvport, or root without noresvport (nfs(5): "If this option is not
// specified, or the resvport option is specified, the NFS client uses a
// privileged source port"; only root can bind one).
func (o *mountOptions) resvPort() bool {
	return o.ResvPort || (!o.NoResvPort && os.Geteuid() == 0)
}
