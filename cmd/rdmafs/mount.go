package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/nfs/dial"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/oncrpc/krb5"
)

// mountFlags are the flags of "rdmafs mount". Each NFS option is also an
// -o option of the same name; DefaultText gives the real default, which
// the flag's zero value is not (an unset flag leaves the -o value or the
// default in place).
func mountFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringSliceFlag{Name: "o", Usage: "mount options, nfs(5) style, comma separated, repeatable: `OPT[=VAL],...` (see MOUNT OPTIONS above)", DefaultText: "none"},
		&cli.BoolFlag{Name: "foreground", Aliases: []string{"f"}, Usage: "stay in the foreground and serve the mount from this process", DefaultText: "off: return once mounted, a background process serves"},
		&cli.StringFlag{Name: "v", Usage: "trace `CATEGORIES` (comma separated: rpc, nfs, fuse, rdma, mr, verbs, or all), one line per event, to stderr or --log", DefaultText: "none"},
		&cli.StringFlag{Name: "log", Usage: "write traces and errors to `FILE` (appended) instead of stderr", DefaultText: "stderr"},
		&cli.StringFlag{Name: "proto", Usage: "transport `PROTO`: tcp, or rdma (RPC-over-RDMA over the verbs provider -o rdmadev picks: rdma-core on an RDMA device, else pure-Go iwarp-go)", DefaultText: "tcp"},
		&cli.IntFlag{Name: "port", Usage: "server `PORT`; also server:PORT:/export", DefaultText: "2049 for tcp, 20049 for rdma"},
		&cli.StringFlag{Name: "vers", Usage: "NFS `VERSION`: 4 (4.2, or 4.1 if the server lacks it), 4.1 or 4.2; anything else is an error", DefaultText: "4"},
		&cli.IntFlag{Name: "rsize", Usage: "largest READ in `BYTES` (4096 to 16777216), lowered to the session's limit", DefaultText: "1048576"},
		&cli.IntFlag{Name: "wsize", Usage: "largest WRITE in `BYTES` (4096 to 16777216), lowered to the session's limit", DefaultText: "1048576"},
		&cli.IntFlag{Name: "timeo", Usage: "RPC timeout in tenths of a second (`N`); the first contact fails within timeo x (retrans+1), even when hard", DefaultText: "600"},
		&cli.IntFlag{Name: "retrans", Usage: "retransmissions (`N`) before a soft mount fails a call", DefaultText: "2"},
		&cli.BoolFlag{Name: "soft", Usage: "fail a call with ETIMEDOUT after timeo x retrans", DefaultText: "off (hard)"},
		&cli.BoolFlag{Name: "hard", Usage: "retry calls until the server answers", DefaultText: "on"},
		&cli.IntFlag{Name: "actimeo", Usage: "set all four attribute cache times to `SECONDS`; 0 turns caching off (as -o noac)", DefaultText: "unset"},
		&cli.IntFlag{Name: "acregmin", Usage: "minimum attribute cache time of files, `SECONDS`", DefaultText: "3"},
		&cli.IntFlag{Name: "acregmax", Usage: "maximum attribute cache time of files, `SECONDS`", DefaultText: "60"},
		&cli.IntFlag{Name: "acdirmin", Usage: "minimum attribute cache time of directories, `SECONDS`", DefaultText: "30"},
		&cli.IntFlag{Name: "acdirmax", Usage: "maximum attribute cache time of directories, `SECONDS`", DefaultText: "60"},
		&cli.BoolFlag{Name: "ro", Usage: "mount read-only", DefaultText: "off (rw)"},
		&cli.BoolFlag{Name: "rw", Usage: "mount read-write", DefaultText: "on"},
		&cli.BoolFlag{Name: "allow_other", Aliases: []string{"allow-other"}, Usage: "let other users use the mount (FUSE allow_other; a non-root user needs user_allow_other in /etc/fuse.conf)", DefaultText: "off"},
		&cli.StringFlag{Name: "rdmavers", Usage: "RPC-over-RDMA `VERSION` with proto=rdma: auto (try 2, fall back to 1), 1 or 2", DefaultText: "auto"},
		&cli.StringFlag{Name: "rdmamem", Usage: "registered memory for READ and WRITE data with proto=rdma, `BYTES` with an optional K, M or G suffix (4M to 64G)", DefaultText: "64M"},
		&cli.BoolFlag{Name: "debug-fuse", Hidden: true, Usage: "log every FUSE request"},
	}
}

func mountCommand() *cli.Command {
	return &cli.Command{
		Name:      "mount",
		Usage:     "mount an NFSv4.1 or NFSv4.2 export through FUSE",
		ArgsUsage: "server[:port]:/export /mountpoint",
		UsageText: `rdmafs mount [options] server[:port]:/export /mountpoint
   mount.rdmafs server:/export /mountpoint -o options     (mount(8) helper)`,
		Description: `Mounts the NFSv4 export on the mountpoint. Without --foreground the
command returns once the mount is live (or prints, in one line, why it
failed) and a background process serves the mount until it is unmounted
(rdmafs umount, umount or fusermount3 -u). The first contact with the
server fails within timeo x (retrans+1), even for a hard mount.

MOUNT OPTIONS (-o, comma separated, repeatable; most are also flags,
which override -o):
` + mountOptionsHelp() + `
FILE-SYSTEM-INDEPENDENT OPTIONS (mount(8)), as on a kernel NFS mount:
   suid | nosuid         honour set-user-ID and set-group-ID bits or not
   dev | nodev           allow device nodes or not
   exec | noexec         allow running programs or not
                         (a mount by root: suid, dev, exec by default, as
                         mount(8) does; an ordinary user's mount is always
                         nosuid,nodev: fusermount3 allows nothing else)
   noatime, nodiratime, relatime (default), strictatime, lazytime, and
   atime, diratime, norelatime, nostrictatime, nolazytime
                         the kernel's atime flags of the mount, shown in
                         /proc/mounts. As with the kernel NFS client
                         (which never updates atime itself), rdmafs never
                         sends an access time the application did not set;
                         the server updates it when it serves a READ, even
                         on a noatime mount
   sync | async          sync: every write(2) reaches the server's stable
                         storage before it returns (the kernel sends an
                         fsync after each write, as nfs(5) sync); default
                         async
   dirsync               accepted and shown: directory changes are
                         synchronous on NFS anyway
   nosymfollow | symfollow
                         do not follow symbolic links on the mount
fstab-only options (_netdev, defaults, auto, noauto, nofail, user, x-*,
...), nfs(5) options without meaning here (lookupcache, ...), mand,
nomand, iversion, and FUSE's own (user_id, group_id, default_permissions,
max_read, which mount(8) repeats on a remount) are accepted and ignored;
any other option is an error.

PERMISSIONS: requests carry the calling process's uid, gid and
supplementary groups (AUTH_SYS, at most 16 groups) and the server
decides; the kernel also checks the cached mode bits first (FUSE
default_permissions), so search permission on directories holds for
cached paths too. Root is not squashed by rdmafs; the export's options
(root_squash) apply.

AS AN ORDINARY USER: the mount goes through fusermount3 (setuid, from
fuse3), which needs /dev/fuse readable and writable by the user, a
mountpoint the user may write to, and user_allow_other in
/etc/fuse.conf for allow_other. When it refuses, its reason is part of
the error.

EXAMPLES:
   rdmafs mount nfs1:/export /mnt
   rdmafs mount nfs1:2050:/export /mnt
   rdmafs mount -o proto=tcp,port=2049,soft,timeo=100 nfs1:/export /mnt
   rdmafs mount -o proto=rdma nfs1:/export /mnt       # port 20049
   rdmafs mount --proto rdma --rdmavers 2 nfs1:/export /mnt
   rdmafs mount -f -v nfs,fuse --log /tmp/rdmafs.log nfs1:/ /mnt

fstab (mount(8) runs mount.fuse3, which runs "rdmafs SOURCE DIR -o OPTS";
rdmafs also answers to mount.rdmafs and mount.fuse.rdmafs):
   nfs1:/export  /mnt  fuse.rdmafs  proto=rdma,_netdev  0 0

FILES:
   /run/rdmafs/HASH.sock (root), $XDG_RUNTIME_DIR/rdmafs/HASH.sock or
   /tmp/rdmafs-UID/HASH.sock (other users): the stats socket of the mount
   (see rdmafs stats --help), 0600; HASH.handles beside it, 0600, the NFS
   file handles a remount needs. RDMAFS_RUN_DIR replaces the directory,
   which must belong to the user and be writable by no one else (it is
   made 0700 when missing); the mount refuses it otherwise. The --log file
   and $RDMAFS_CPUPROFILE may not be symbolic links.

EXIT STATUS:
   0   mounted
   1   bad usage or option
   2   mountpoint missing, not a directory, or busy
   3   no /dev/fuse, or fusermount3 or the kernel refused the FUSE mount
   4   server unreachable, closed the connection, or did not answer
   5   export not found, or access denied
   32  any other failure`,
		Flags:  mountFlags(),
		Action: runMount,
	}
}

// collectOptions builds the mount options from the arguments and flags.
func collectOptions(cctx *cli.Context) (*mountOptions, error) {
	if cctx.NArg() != 2 {
		return nil, exitf(exitUsage, nil, "usage: rdmafs mount [options] server[:port]:/export /mountpoint")
	}
	o := defaultOptions()
	var err error
	if o.URing, err = defaultURing(); err != nil {
		return nil, exitf(exitUsage, err, "%v", err)
	}
	host, port, export, err := parseSource(cctx.Args().Get(0))
	if err != nil {
		return nil, exitf(exitUsage, err, "%v", err)
	}
	o.Server, o.Port, o.Export = host, port, export
	dir, err := filepath.Abs(cctx.Args().Get(1))
	if err != nil {
		return nil, exitf(exitUsage, err, "mountpoint: %v", err)
	}
	o.Dir = dir
	for _, list := range cctx.StringSlice("o") {
		if err := o.parseOptionList(list); err != nil {
			return nil, exitf(exitUsage, err, "%v", err)
		}
	}
	// Flags override -o, in the order they are listed.
	for _, f := range mountFlags() {
		name := f.Names()[0]
		switch name {
		case "o", "foreground", "v", "log", "debug-fuse":
			continue
		}
		if !cctx.IsSet(name) {
			continue
		}
		opt := name
		switch f.(type) {
		case *cli.BoolFlag:
			if !cctx.Bool(name) {
				continue
			}
		case *cli.IntFlag:
			opt = fmt.Sprintf("%s=%d", name, cctx.Int(name))
		default:
			opt = name + "=" + cctx.String(name)
		}
		if err := o.set(opt); err != nil {
			return nil, exitf(exitUsage, err, "%v", err)
		}
	}
	return &o, nil
}

// daemonEnv names the variable that marks the re-executed background
// process; its value is the descriptor of the pipe to the parent.
const daemonEnv = "RDMAFS_DAEMON_FD"

func runMount(cctx *cli.Context) error {
	o, err := collectOptions(cctx)
	if err != nil {
		return err
	}
	cats, err := traceCategories(cctx)
	if err != nil {
		return err
	}
	if o.Remount {
		return remount(o)
	}
	if os.Geteuid() != 0 {
		if err := o.checkUser(); err != nil {
			return exitf(exitUsage, err, "%v", err)
		}
	}
	logFile := cctx.String("log")
	if !cctx.Bool("foreground") && os.Getenv(daemonEnv) == "" {
		// Fail fast on what the background process would find too.
		if err := checkMountpoint(o.Dir); err != nil {
			return err
		}
		if err := dial.Check(o.Proto); err != nil {
			return exitf(exitUsage, err, "%v", err)
		}
		return spawnDaemon(cctx.App.Metadata["args"].([]string), cats != 0 && logFile == "")
	}
	logw, closeLog, err := openLog(logFile)
	if err != nil {
		return err
	}
	defer closeLog()
	background := os.Getenv(daemonEnv) != "" // daemonNotifier unsets it
	if background {
		// Relative paths (--log) are resolved; now leave the caller's
		// directory so that it does not stay busy.
		os.Chdir("/")
	}
	var tr *trace.Tracer
	if cats != 0 {
		tr = trace.New(logw, cats)
	}
	notify := daemonNotifier()
	err = serve(o, tr, logw, cctx.Bool("debug-fuse"), notify)
	if err != nil {
		notify(err)
		if background {
			// The parent has gone once the mount was live: the log is
			// the only place left for the error.
			fmt.Fprintf(logw, "rdmafs: %v\n", err)
		}
	}
	return err
}

// checkMountpoint fails early for a mountpoint that cannot work.
func checkMountpoint(dir string) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return exitf(exitMountpoint, err, "mountpoint %s does not exist", dir)
	case err != nil:
		return exitf(exitMountpoint, err, "mountpoint %s: %v", dir, err)
	case !st.IsDir():
		return exitf(exitMountpoint, nil, "mountpoint %s is not a directory", dir)
	}
	if mounted, fstype := isMountpoint(dir); mounted && strings.HasPrefix(fstype, "fuse") {
		return exitf(exitMountpoint, nil, "mountpoint %s is busy: %s is already mounted there (rdmafs umount %s)", dir, fstype, dir)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return exitf(exitFUSE, err, "no /dev/fuse: load the fuse module (modprobe fuse) or give the container the device")
	}
	return nil
}

// isMountpoint reports whether dir is the mountpoint of a mount in
// /proc/self/mounts, and its type.
func isMountpoint(dir string) (bool, string) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return false, ""
	}
	found, fstype := false, ""
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && unescapeMount(f[1]) == dir {
			found, fstype = true, f[2]
		}
	}
	return found, fstype
}

// unescapeMount undoes the octal escapes of /proc/mounts (\040 for space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%3o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// dialConfig is how the options reach the server, for package dial,
// which builds the transport (TCP or RPC-over-RDMA, nconnect) the nfs
// library builds too.
func dialConfig(o *mountOptions, tr *trace.Tracer) dial.Config {
	return dial.Config{
		Addr:        o.addr(),
		Proto:       o.Proto,
		NConnect:    o.NConnect,
		ResvPort:    o.resvPort(),
		DialTimeout: o.Timeo,
		RDMAVers:    o.RDMAVers,
		RDMAMem:     o.RDMAMem,
		RDMADev:     o.RDMADev,
		Tracer:      tr,
	}
}

// serve mounts and serves until the file system is unmounted. notify is
// called once the mount is live.
// shutdownTimeout bounds the write-back and CLOSEs after the unmount.
const shutdownTimeout = 60 * time.Second

func serve(o *mountOptions, tr *trace.Tracer, logw io.Writer, debugFUSE bool, notify func(error)) error {
	if err := checkMountpoint(o.Dir); err != nil {
		return err
	}
	if _, err := makeRunDir(); err != nil {
		return exitf(exitUsage, err, "%v", err)
	}
	stopProfile, err := startCPUProfile()
	if err != nil {
		return exitf(exitUsage, err, "%v", err)
	}
	defer stopProfile()
	if err := dial.Check(o.Proto); err != nil {
		return exitf(exitUsage, err, "%v", err)
	}
	wait := o.Timeo * time.Duration(o.Retrans+1)
	ctx, cancel := context.WithTimeout(context.Background(), wait+5*time.Second)
	defer cancel()
	var retrans atomic.Uint64
	c, t, err := connect(ctx, o, tr, &retrans)
	if err != nil {
		return err
	}
	m, err := mountFUSE(ctx, o, c, t, tr, debugFUSE)
	if err != nil {
		return err
	}
	ss, err := startStats(o, m, t, &retrans)
	if err != nil {
		// The mount works without stats; say so and go on.
		fmt.Fprintf(os.Stderr, "rdmafs: stats socket: %v\n", err)
	}
	notify(nil)
	err = serveUntilUnmount(o, m, tr, logw)
	if ss != nil {
		ss.Close()
	}
	return err
}

// gssSource finds the users' Kerberos credentials for a sec=krb5* mount
// (nil for sec=sys). The server's principal is nfs/SERVER, with SERVER
// as the mount names it (rpc.gssd canonicalises it through DNS; name
// the server by the host name in its keytab).
func gssSource(o *mountOptions) nfsclient.GSSSource {
	if o.Sec == nfsclient.SecSys {
		return nil
	}
	// An ordinary user's mount can read only that user's credentials.
	return &krb5.Users{Service: "nfs/" + o.Server, CCacheDirs: o.CCacheDirs, Self: os.Geteuid() != 0}
}

// connect dials the server and sets up the NFS session, counting
// retransmissions in retrans for the stats. dial.Connect probes with an
// RPC NULL of soft semantics first, so that an unreachable server fails
// the mount within timeo x retrans even for a hard mount.
func connect(ctx context.Context, o *mountOptions, tr *trace.Tracer, retrans *atomic.Uint64) (*nfsclient.Client, oncrpc.Transport, error) {
	c, t, err := dial.Connect(ctx, dialConfig(o, tr), nfsclient.Config{
		RPC: oncrpc.ClientOptions{
			Timeout: o.Timeo, Retrans: o.Retrans, Hard: o.Hard,
			OnRetransmit: func(xid uint32, attempt int, cause error) {
				retrans.Add(1)
				if tr.On(trace.RPC) {
					tr.Printf(trace.RPC, "xid=%#08x retransmit attempt=%d cause=%v", xid, attempt, cause)
				}
			},
		},
		Export:       o.Export,
		RSize:        o.RSize,
		WSize:        o.WSize,
		MinorVersion: minorVersion(o.Vers),
		// Delegations let the FUSE layer cache attributes and data
		// without revalidating (fuse/deleg.go).
		Delegations: true,
		Tracer:      tr,
		Security:    o.Sec,
		GSS:         gssSource(o),
	})
	if errors.Is(err, dial.ErrTransport) {
		return nil, nil, exitf(exitUsage, err, "%v", err)
	}
	if err != nil {
		return nil, nil, classifyDial(err, o, o.Timeo*time.Duration(o.Retrans+1))
	}
	return c, t, nil
}

// mountFUSE mounts the file system of c on o.Dir; on failure it closes
// the session and says why, with fusermount3's own reason if it gave one.
func mountFUSE(ctx context.Context, o *mountOptions, c *nfsclient.Client, t oncrpc.Transport, tr *trace.Tracer, debugFUSE bool) (*fuse.Mount, error) {
	fsName := o.Server + ":" + o.Export
	if strings.Contains(o.Server, ":") {
		fsName = "[" + o.Server + "]:" + o.Export
	}
	var m *fuse.Mount
	fmMsg, err := withFusermountStderr(func() error {
		var err error
		m, err = fuse.Serve(ctx, fuse.NFSClient(c), o.Dir, fuse.Options{
			FSName:     fsName,
			AcRegMin:   o.AcRegMin,
			AcRegMax:   o.AcRegMax,
			AcDirMin:   o.AcDirMin,
			AcDirMax:   o.AcDirMax,
			NoAC:       o.NoAC,
			ReadOnly:   o.ReadOnly,
			MountFlags: o.VFSFlags,
			AllowOther: o.AllowOther,
			Buffers:    buffersOf(t),
			Tracer:     tr,
			Debug:      debugFUSE,
			// name_to_handle_at handles survive a remount.
			HandleCache: handleCache(o.Server, o.Export, o.Dir),
			URing:       o.URing,
		})
		return err
	})
	if err == nil {
		return m, nil
	}
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	c.Close(sctx)
	scancel()
	if errors.Is(err, syscall.EBUSY) {
		return nil, exitf(exitMountpoint, err, "mountpoint %s is busy", o.Dir)
	}
	if fmMsg != "" {
		// fusermount3's own reason, then go-fuse's "exited with code".
		return nil, exitf(exitFUSE, err, "FUSE mount on %s failed: %s (%s)", o.Dir, fmMsg, strings.TrimSpace(err.Error()))
	}
	return nil, exitf(exitFUSE, err, "FUSE mount on %s failed: %s", o.Dir, strings.TrimSpace(err.Error()))
}

// minorVersion is the NFSv4 minor version of vers= for nfsclient.Config:
// 0 (vers=4) negotiates, 4.2 falling back to 4.1.
func minorVersion(vers string) int {
	switch vers {
	case "4.1":
		return 1
	case "4.2":
		return 2
	}
	return 0
}
