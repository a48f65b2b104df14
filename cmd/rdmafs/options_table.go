package main

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// mountOption is one nfs(5)-style option of the option table: the
// names it goes by, its value and help for documentation, and how it
// sets the options.
type mountOption struct {
	names []string
	// arg is the value's form for documentation ("N", "tcp|rdma");
	// empty for an option without a value.
	arg  string
	help string
	set  func(o *mountOptions, a optionArg) error
}

// flagOption is the set function of an option without a value.
func flagOption(set func(o *mountOptions, name string)) func(*mountOptions, optionArg) error {
	return func(o *mountOptions, a optionArg) error {
		if err := a.noVal(); err != nil {
			return err
		}
		set(o, a.name)
		return nil
	}
}

// secsOption is the set function of an attribute cache time.
func secsOption(field func(o *mountOptions) *time.Duration) func(*mountOptions, optionArg) error {
	return func(o *mountOptions, a optionArg) error { return a.secs(field(o)) }
}

// mountOptionTable is rdmafs's own options and those of nfs(5) it
// takes, in the order rdmafs mount --help lists them. mount(8)'s
// file-system-independent options are vfsOptions; those accepted and
// ignored are ignoredOptions.
var mountOptionTable = []mountOption{
	{names: []string{"proto"}, arg: "tcp|rdma", help: "transport (default tcp)",
		set: func(o *mountOptions, a optionArg) error {
			switch a.val {
			case "tcp", "rdma":
				o.Proto = a.val
				return nil
			}
			return fmt.Errorf("option proto=%s: want proto=tcp or proto=rdma", a.val)
		}},
	{names: []string{"sec"}, arg: "sys|krb5|krb5i|krb5p", help: "security flavor (default sys): AUTH_SYS, or Kerberos V5 (RPCSEC_GSS) for authentication (krb5), with a checksum of every message (krb5i) or encrypted (krb5p); credentials as rpc.gssd finds them: root's from /etc/krb5.keytab ($KRB5_KTNAME), a user's from /tmp/krb5cc_UID",
		set: func(o *mountOptions, a optionArg) error {
			// nfs(5) sec= takes a list to negotiate from; rdmafs mounts
			// with the one flavor named, never a weaker one instead.
			if strings.Contains(a.val, ":") {
				return fmt.Errorf("option sec=%s: one flavor only (sys, krb5, krb5i or krb5p)", a.val)
			}
			sec, err := nfsclient.ParseSecurity(a.val)
			if err != nil {
				return fmt.Errorf("option %w", err)
			}
			o.Sec = sec
			return nil
		}},
	{names: []string{"krb5ccdir"}, arg: "DIR[:DIR...]", help: "where users' ticket caches (krb5cc_UID, krb5cc_UID_*) are looked for, as rpc.gssd -d (default /tmp:/run/user/UID; UID in a directory is the user's)",
		set: func(o *mountOptions, a optionArg) error {
			o.CCacheDirs = nil
			for _, d := range strings.Split(a.val, ":") {
				if !filepath.IsAbs(d) {
					return fmt.Errorf("option krb5ccdir=%s: %q is not an absolute path", a.val, d)
				}
				o.CCacheDirs = append(o.CCacheDirs, filepath.Clean(d))
			}
			return nil
		}},
	{names: []string{"port"}, arg: "N", help: "server port (default 2049 for tcp, 20049 for rdma); also server:PORT:/export",
		set: func(o *mountOptions, a optionArg) error {
			v, err := a.num()
			if err != nil {
				return err
			}
			if v > 65535 {
				return fmt.Errorf("option port=%d: out of range", v)
			}
			o.Port = v
			return nil
		}},
	{names: []string{"vers", "nfsvers"}, arg: "4|4.1|4.2", help: "NFS minor version; 4 (default) speaks 4.2 and falls back to 4.1 if the server lacks it; anything else is an error",
		set: func(o *mountOptions, a optionArg) error {
			switch a.val {
			case "4", "4.1", "4.2":
				o.Vers = a.val
				return nil
			}
			return fmt.Errorf("option %s=%s: rdmafs speaks NFS version 4.1 and 4.2 only (vers=4, 4.1 or 4.2)", a.name, a.val)
		}},
	{names: []string{"rsize", "wsize"}, arg: "N", help: "largest READ/WRITE in bytes, 4096 to 16777216 (default 1048576, lowered to the session's limits)",
		set: func(o *mountOptions, a optionArg) error {
			v, err := a.num()
			if err != nil {
				return err
			}
			if v < 4096 || v > 16<<20 {
				return fmt.Errorf("option %s=%d: want 4096 to 16777216 bytes", a.name, v)
			}
			if a.name == "rsize" {
				o.RSize = v
			} else {
				o.WSize = v
			}
			return nil
		}},
	{names: []string{"timeo"}, arg: "N", help: "RPC timeout in tenths of a second (default 600)",
		set: func(o *mountOptions, a optionArg) error {
			v, err := a.num()
			if err != nil {
				return err
			}
			if v == 0 {
				return fmt.Errorf("option timeo=0: want at least 1 (tenths of a second)")
			}
			o.Timeo = time.Duration(v) * 100 * time.Millisecond // deciseconds, as nfs(5)
			return nil
		}},
	{names: []string{"retrans"}, arg: "N", help: "retransmissions before a soft mount fails a call (default 2)",
		set: func(o *mountOptions, a optionArg) error {
			v, err := a.num()
			if err != nil {
				return err
			}
			o.Retrans = v
			return nil
		}},
	{names: []string{"resvport", "noresvport"}, help: "connect over TCP from a reserved source port, below 1024, as a server's secure export needs (default for root; resvport needs root) | from any port",
		set: flagOption(func(o *mountOptions, name string) {
			o.ResvPort, o.NoResvPort = name == "resvport", name == "noresvport"
		})},
	{names: []string{"hard", "soft"}, help: "retry forever (default) | fail with ETIMEDOUT after timeo x retrans",
		set: flagOption(func(o *mountOptions, name string) { o.Hard = name == "hard" })},
	{names: []string{"actimeo"}, arg: "N", help: "all attribute cache times, seconds; 0 = noac",
		set: func(o *mountOptions, a optionArg) error {
			var d time.Duration
			if err := a.secs(&d); err != nil {
				return err
			}
			o.AcRegMin, o.AcRegMax, o.AcDirMin, o.AcDirMax = d, d, d, d
			o.NoAC = d == 0
			return nil
		}},
	{names: []string{"acregmin"}, arg: "N", help: "least time a file's attributes are cached, seconds (default 3)",
		set: secsOption(func(o *mountOptions) *time.Duration { return &o.AcRegMin })},
	{names: []string{"acregmax"}, arg: "N", help: "most time a file's attributes are cached, seconds (default 60)",
		set: secsOption(func(o *mountOptions) *time.Duration { return &o.AcRegMax })},
	{names: []string{"acdirmin"}, arg: "N", help: "least time a directory's attributes are cached, seconds (default 30)",
		set: secsOption(func(o *mountOptions) *time.Duration { return &o.AcDirMin })},
	{names: []string{"acdirmax"}, arg: "N", help: "most time a directory's attributes are cached, seconds (default 60)",
		set: secsOption(func(o *mountOptions) *time.Duration { return &o.AcDirMax })},
	{names: []string{"noac"}, help: "attribute caching off",
		set: flagOption(func(o *mountOptions, _ string) { o.NoAC = true })},
	// ac has always ignored a value (ac=1 is ac).
	{names: []string{"ac"}, help: "attribute caching on (default)",
		set: func(o *mountOptions, _ optionArg) error { o.NoAC = false; return nil }},
	{names: []string{"ro", "rw"}, help: "read-only | read-write (default rw)",
		set: flagOption(func(o *mountOptions, name string) {
			o.ReadOnly = name == "ro"
			o.VFSGiven |= unix.MS_RDONLY
			o.VFSFlags &^= unix.MS_RDONLY
			if o.ReadOnly {
				o.VFSFlags |= unix.MS_RDONLY
			}
		})},
	{names: []string{"remount"}, help: "change the mount(8) options below, and ro/rw, of a live mount: \"mount -o remount,ro /mnt\" (mount(8) runs mount.fuse.rdmafs), or \"rdmafs mount -o remount,ro server:/export /mnt\"; root only. NFS options keep the values of the mount; dirsync stays as mounted (the kernel keeps it)",
		set: flagOption(func(o *mountOptions, _ string) { o.Remount = true })},
	{names: []string{"allow_other"}, help: "let other users use the mount (default off)",
		set: flagOption(func(o *mountOptions, _ string) { o.AllowOther = true })},
	{names: []string{"nconnect"}, arg: "N", help: "N connections to the server, 1 to 16 (default 1), as nfs(5): all bound to the one session (BIND_CONN_TO_SESSION), calls spread over them round robin, a broken connection's calls sent again on another while it is redialled; with proto=tcp and proto=rdma. rdmafs stats shows a line per connection",
		set: func(o *mountOptions, a optionArg) error {
			v, err := strconv.Atoi(a.val)
			if !a.hasVal || err != nil || v < 1 || v > oncrpc.MaxConnections {
				return fmt.Errorf("option nconnect=%s: want 1 to %d connections", a.val, oncrpc.MaxConnections)
			}
			o.NConnect = v
			return nil
		}},
	{names: []string{"rdmavers"}, arg: "auto|1|2", help: "RPC-over-RDMA version with proto=rdma (default auto: offer version 2, fall back to 1)",
		set: func(o *mountOptions, a optionArg) error {
			switch a.val {
			case "auto", "1", "2":
				o.RDMAVers = a.val
				return nil
			}
			return fmt.Errorf("option rdmavers=%s: want auto, 1 or 2", a.val)
		}},
	{names: []string{"rdmadev"}, arg: "NAME", help: "verbs provider with proto=rdma: an RDMA device (mlx5_0, rxe0, siw0: rdma-core) or iwarp-go (pure Go over TCP); default: rdma-core on the first device with an active port if /sys/class/infiniband lists one, else iwarp-go",
		set: func(o *mountOptions, a optionArg) error {
			if a.val == "" {
				return fmt.Errorf("option rdmadev: want a device name (e.g. mlx5_0, rxe0) or iwarp-go")
			}
			o.RDMADev = a.val
			return nil
		}},
	{names: []string{"rdmamem"}, arg: "BYTES", help: "registered memory with proto=rdma, K/M/G suffix, 4M to 64G (default 64M): READ data lands in it and WRITE data leaves from it; calls beyond it copy",
		set: func(o *mountOptions, a optionArg) error {
			v, err := parseSize(a.val)
			if err != nil {
				return fmt.Errorf("option rdmamem=%s: %w", a.val, err)
			}
			if v < 4<<20 || v > 64<<30 {
				return fmt.Errorf("option rdmamem=%s: want 4M to 64G", a.val)
			}
			o.RDMAMem = v
			return nil
		}},
	{names: []string{"uring"}, arg: "[=on|auto|off]", help: "how the kernel's FUSE requests reach rdmafs: on (bare uring) serves them over io_uring, one queue per CPU, and fails the mount where the kernel lacks it; auto uses io_uring where offered; off reads and writes /dev/fuse. Default off, or $RDMAFS_URING. io_uring needs Linux 6.14 and, as root, echo Y > /sys/module/fuse/parameters/enable_uring",
		set: func(o *mountOptions, a optionArg) error {
			mode, err := parseURing(a.val, a.hasVal)
			if err != nil {
				return fmt.Errorf("option %s: %w", a.opt, err)
			}
			o.URing = mode
			return nil
		}},
	{names: []string{"nouring"}, help: "read and write /dev/fuse (uring=off)",
		set: flagOption(func(o *mountOptions, _ string) { o.URing = fuse.URingOff })},
}

// mountOptionByName indexes mountOptionTable by each of its names.
var mountOptionByName = func() map[string]*mountOption {
	m := make(map[string]*mountOption)
	for i := range mountOptionTable {
		for _, name := range mountOptionTable[i].names {
			m[name] = &mountOptionTable[i]
		}
	}
	return m
}()

// mountOptionsHelp is the MOUNT OPTIONS part of rdmafs mount --help (and
// so of the man page), made from mountOptionTable: the option's forms
// in a column of their own, its help wrapped beside them.
func mountOptionsHelp() string {
	const (
		indent = "   "
		col    = 21 // width of the forms' column
		width  = 76
	)
	var b strings.Builder
	for _, mo := range mountOptionTable {
		forms := mo.forms()
		line := indent + forms
		if len(forms) >= col {
			b.WriteString(line + "\n")
			line = ""
		}
		for _, w := range wrap(mo.help, width-len(indent)-col-1) {
			if line == "" {
				line = strings.Repeat(" ", len(indent)+col)
			}
			b.WriteString(fmt.Sprintf("%-*s %s\n", len(indent)+col, line, w))
			line = ""
		}
	}
	return b.String()
}

// forms is how the option is written: "hard | soft" for options without
// a value, "rsize=N, wsize=N" for those with one, "uring[=on|...]"
// for one whose value is optional.
func (mo mountOption) forms() string {
	if mo.arg == "" {
		return strings.Join(mo.names, " | ")
	}
	var forms []string
	for _, name := range mo.names {
		if strings.HasPrefix(mo.arg, "[") {
			forms = append(forms, name+mo.arg)
		} else {
			forms = append(forms, name+"="+mo.arg)
		}
	}
	return strings.Join(forms, ", ")
}

// wrap breaks text into lines of at most width bytes at spaces (a word
// longer than width gets a line of its own).
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(text) {
		switch {
		case line == "":
			line = w
		case len(line)+1+len(w) <= width:
			line += " " + w
		default:
			lines = append(lines, line)
			line = w
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
