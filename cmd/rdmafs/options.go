package main

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// mountOptions are the nfs(5)-style options of a mount.
type mountOptions struct {
	Server string // host name or address, without brackets
	Port   int
	Export string
	Dir    string

	Proto    string // tcp or rdma
	Vers     string
	RSize    int
	WSize    int
	Timeo    time.Duration
	Retrans  int
	Hard     bool
	AcRegMin time.Duration
	AcRegMax time.Duration
	AcDirMin time.Duration
	AcDirMax time.Duration
	NoAC     bool
	ReadOnly bool
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
	}
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
// have no effect on rdmafs.
var ignoredOptions = map[string]bool{
	"_netdev": true, "defaults": true, "auto": true, "noauto": true, "nofail": true,
	"user": true, "nouser": true, "users": true, "owner": true, "group": true,
	"suid": true, "nosuid": true, "dev": true, "nodev": true, "exec": true, "noexec": true,
	"atime": true, "noatime": true, "relatime": true, "norelatime": true, "strictatime": true,
	"async": true, "sync": true, "intr": true, "nointr": true, "cto": true,
	"sec": true, "lookupcache": true, "fsc": true, "nofsc": true, "local_lock": true,
	"minorversion": true, "clientaddr": true, "namlen": true, "nconnect": true,
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
	return nil
}

// set applies one option, "name" or "name=value".
func (o *mountOptions) set(opt string) error {
	name, val, hasVal := strings.Cut(opt, "=")
	num := func() (int, error) {
		if !hasVal {
			return 0, fmt.Errorf("option %s needs a value (%s=N)", name, name)
		}
		v, err := strconv.Atoi(val)
		if err != nil || v < 0 {
			return 0, fmt.Errorf("option %s=%s: not a non-negative number", name, val)
		}
		return v, nil
	}
	secs := func(d *time.Duration) error {
		v, err := num()
		if err != nil {
			return err
		}
		*d = time.Duration(v) * time.Second
		return nil
	}
	noVal := func() error {
		if hasVal {
			return fmt.Errorf("option %s takes no value", name)
		}
		return nil
	}
	switch name {
	case "proto":
		switch val {
		case "tcp", "rdma":
			o.Proto = val
		default:
			return fmt.Errorf("option proto=%s: want proto=tcp or proto=rdma", val)
		}
	case "port":
		v, err := num()
		if err != nil {
			return err
		}
		if v > 65535 {
			return fmt.Errorf("option port=%d: out of range", v)
		}
		o.Port = v
	case "vers", "nfsvers":
		switch val {
		case "4", "4.1", "4.2":
		default:
			return fmt.Errorf("option %s=%s: rdmafs speaks NFS version 4.1 and 4.2 only (vers=4, 4.1 or 4.2)", name, val)
		}
		o.Vers = val
	case "rsize", "wsize":
		v, err := num()
		if err != nil {
			return err
		}
		if v < 4096 || v > 16<<20 {
			return fmt.Errorf("option %s=%d: want 4096 to 16777216 bytes", name, v)
		}
		if name == "rsize" {
			o.RSize = v
		} else {
			o.WSize = v
		}
	case "timeo":
		v, err := num()
		if err != nil {
			return err
		}
		if v == 0 {
			return fmt.Errorf("option timeo=0: want at least 1 (tenths of a second)")
		}
		o.Timeo = time.Duration(v) * 100 * time.Millisecond // deciseconds, as nfs(5)
	case "retrans":
		v, err := num()
		if err != nil {
			return err
		}
		o.Retrans = v
	case "hard", "soft":
		if err := noVal(); err != nil {
			return err
		}
		o.Hard = name == "hard"
	case "actimeo":
		var d time.Duration
		if err := secs(&d); err != nil {
			return err
		}
		o.AcRegMin, o.AcRegMax, o.AcDirMin, o.AcDirMax = d, d, d, d
		o.NoAC = d == 0
	case "acregmin":
		return secs(&o.AcRegMin)
	case "acregmax":
		return secs(&o.AcRegMax)
	case "acdirmin":
		return secs(&o.AcDirMin)
	case "acdirmax":
		return secs(&o.AcDirMax)
	case "noac":
		if err := noVal(); err != nil {
			return err
		}
		o.NoAC = true
	case "ac":
		o.NoAC = false
	case "ro", "rw":
		if err := noVal(); err != nil {
			return err
		}
		o.ReadOnly = name == "ro"
	case "allow_other":
		if err := noVal(); err != nil {
			return err
		}
		o.AllowOther = true
	case "rdmamem":
		v, err := parseSize(val)
		if err != nil {
			return fmt.Errorf("option rdmamem=%s: %w", val, err)
		}
		if v < 4<<20 || v > 64<<30 {
			return fmt.Errorf("option rdmamem=%s: want 4M to 64G", val)
		}
		o.RDMAMem = v
	case "rdmadev":
		if val == "" {
			return fmt.Errorf("option rdmadev: want a device name (e.g. mlx5_0, rxe0) or iwarp-go")
		}
		o.RDMADev = val
	case "rdmavers":
		switch val {
		case "auto", "1", "2":
			o.RDMAVers = val
		default:
			return fmt.Errorf("option rdmavers=%s: want auto, 1 or 2", val)
		}
	default:
		if ignoredOptions[name] || strings.HasPrefix(name, "x-") {
			return nil
		}
		return fmt.Errorf("unknown mount option %q (see rdmafs mount --help)", opt)
	}
	return nil
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
	return fmt.Sprintf("%s,vers=%s,proto=%s,addr=%s,rsize=%d,wsize=%d,timeo=%d,retrans=%d,%s",
		rw, o.Vers, o.Proto, o.addr(), o.RSize, o.WSize, o.Timeo/(100*time.Millisecond), o.Retrans, hs)
}
