// Package nfs is a file-system-shaped NFSv4.1 (and NFSv4.2) client over
// TCP or RPC-over-RDMA, for Go programs that want to use an NFS export
// without FUSE, without root and without mounting it.
//
// Dial connects to an export and returns a Client, whose methods look
// like package os: OpenFile returns a *File (io.Reader, io.Writer,
// io.ReaderAt, io.WriterAt, io.Seeker, byte-range locks), and Stat,
// ReadDir, Mkdir, Remove, Rename, Symlink, Chmod and the rest work on
// slash-separated paths relative to the export's root. Every Client
// method takes a context.Context; Client.FS returns an io/fs view of the
// export (fs.FS, fs.ReadDirFS, fs.StatFS, fs.ReadFileFS, fs.SubFS,
// fs.ReadLinkFS) whose calls, having no context, are bounded by
// Options.CallTimeout, as are the io methods of File.
//
//	c, err := nfs.Dial(ctx, "server:/export", nfs.Options{})
//	if err != nil { ... }
//	defer c.Close()
//	data, err := fs.ReadFile(c.FS(), "dir/file")
//
// Errors are *fs.PathError (or *os.LinkError for Rename and Symlink)
// whose cause matches fs.ErrNotExist, fs.ErrExist, fs.ErrPermission and
// fs.ErrInvalid with errors.Is, and also the syscall.Errno a local file
// system would give (syscall.ENOTDIR, syscall.EISDIR, syscall.ENOTEMPTY,
// ...) and the nfsclient.Status the server sent.
//
// The protocol itself (sessions, OPEN, READ, WRITE, COMMIT, LOCK, state
// recovery after a server restart) is package nfsclient's; this package
// gives it paths, file descriptors and the errors of package os. The
// transport is the one the rdmafs mount uses (TCP, or RPC-over-RDMA over
// rdma-core or the pure-Go iWARP provider, with nconnect).
package nfs

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/nfs/dial"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/oncrpc/krb5"
)

// Options say how to reach the server; they mirror the rdmafs mount
// options of the same meaning. The zero Options dial TCP port 2049 with
// the calling process's credentials.
type Options struct {
	// Transport is "tcp" (the default) or "rdma" (RPC-over-RDMA, RFC
	// 8166).
	Transport string
	// Port is the server's port; zero means 2049 for TCP and 20049 for
	// RDMA (RFC 8267 s6.2.1). A port in the address of Dial wins.
	Port int
	// RDMADevice picks the verbs provider with Transport "rdma": an RDMA
	// device (mlx5_0, rxe0, siw0: rdma-core), or "iwarp-go" (pure-Go
	// iWARP over TCP, no kernel support needed). Empty picks rdma-core
	// when the machine has an active RDMA device, else iwarp-go.
	RDMADevice string
	// RDMAVersion is the RPC-over-RDMA version: 0 offers version 2 and
	// falls back to 1, or 1 or 2.
	RDMAVersion int
	// RDMAMemory bounds the registered memory of an RDMA transport, in
	// bytes; zero means 64 MiB.
	RDMAMemory int64
	// MinorVersion is the NFSv4 minor version: 0 speaks 4.2 and falls
	// back to 4.1, or 1 or 2.
	MinorVersion int
	// RSize and WSize are the largest READ and WRITE in bytes; zero means
	// 1 MiB. The session's limits lower them.
	RSize, WSize int
	// NConnect is the number of connections to the server, all bound to
	// the one session (nfs(5) nconnect); zero means 1.
	NConnect int
	// NoResvPort makes TCP connections from any source port. By
	// default, in a process running as root, they come from a reserved
	// port (below 1024, nfs(5) resvport), as a server's "secure" export
	// (the default of exports(5)) requires.
	NoResvPort bool
	// Auth is the AUTH_SYS identity of the calls; nil means the calling
	// process's user, group and supplementary groups.
	Auth *Auth
	// Security is the flavor of the calls (nfs(5) sec=): "sys" (the
	// default, AUTH_SYS), "krb5", "krb5i" or "krb5p" (RPCSEC_GSS with
	// Kerberos V5: authentication, integrity, privacy). TCP only.
	Security string
	// CCache is the Kerberos ticket cache (a FILE cache, what kinit
	// writes) of a Kerberos Security. Empty means $KRB5CCNAME's FILE
	// cache, else the process's user's found as rpc.gssd finds it
	// (krb5cc_UID in /tmp or /run/user/UID; root: the machine keytab).
	// $KRB5_CONFIG names the krb5.conf; the server's principal is
	// nfs/HOST with HOST as in Dial's target.
	CCache string
	// Timeout is how long one RPC waits for its reply before it is sent
	// again (nfs(5) timeo); zero means 60 s. Connecting fails after
	// Timeout x (Retrans+1) without a reply.
	Timeout time.Duration
	// Retrans is how many times a call is sent again; zero means 2.
	Retrans int
	// Soft fails a call with a timeout error after Retrans
	// retransmissions; by default calls are retried until their context
	// ends (nfs(5) hard).
	Soft bool
	// CallTimeout bounds each call made without a context: through the
	// io/fs view (FS) and the io methods of File. Zero means 2 minutes.
	CallTimeout time.Duration
	// Trace, if not nil, receives one line per event of the categories in
	// TraceCategories.
	Trace io.Writer
	// TraceCategories lists what is traced, comma separated: rpc, nfs,
	// rdma, mr, verbs, or all. Empty with a Trace writer means rpc,nfs.
	TraceCategories string
}

// Auth is an AUTH_SYS identity (RFC 5531 appendix A): the server checks
// permissions for it. At most 16 supplementary groups are sent.
type Auth struct {
	UID, GID uint32
	Groups   []uint32
}

// Client is a connection to one NFS export. It is safe for concurrent
// use. Paths name files relative to the export's root, separated by
// slashes; a leading slash is allowed, and "" or "." is the root.
type Client struct {
	nfs         *nfsclient.Client
	cred        oncrpc.Credential
	callTimeout time.Duration
	export      string
	lockIDs     atomic.Uint64 // lock-owner numbers of Files
}

// Dial connects to the export target, "server:/export",
// "server:port:/export" or "[ipv6]:/export", and establishes an NFSv4.1
// session. ctx bounds connecting only; an unreachable server fails it
// within Options.Timeout x (Retrans+1) however hard the client. An export
// the server does not have matches fs.ErrNotExist.
func Dial(ctx context.Context, target string, opts Options) (*Client, error) {
	host, port, export, err := splitTarget(target)
	if err != nil {
		return nil, err
	}
	cfg, ncfg, err := configs(host, port, export, opts)
	if err != nil {
		return nil, err
	}
	nc, _, err := dial.Connect(ctx, cfg, ncfg)
	if err != nil {
		return nil, fmt.Errorf("nfs: dial %s: %w", target, wrapErr(err))
	}
	return newClient(nc, export, opts), nil
}

// configs turns the options into package dial's and nfsclient's.
func configs(host string, port int, export string, opts Options) (dial.Config, nfsclient.Config, error) {
	proto := opts.Transport
	if proto == "" {
		proto = "tcp"
	}
	if err := dial.Check(proto); err != nil {
		return dial.Config{}, nfsclient.Config{}, fmt.Errorf("nfs: %w", err)
	}
	if port == 0 {
		port = opts.Port
	}
	if port == 0 {
		port = dial.TCPPort
		if proto == "rdma" {
			port = dial.RDMAPort
		}
	}
	rdmaVers := ""
	switch opts.RDMAVersion {
	case 0:
	case 1, 2:
		rdmaVers = strconv.Itoa(opts.RDMAVersion)
	default:
		return dial.Config{}, nfsclient.Config{}, fmt.Errorf("nfs: RDMA version %d: want 0 (auto), 1 or 2", opts.RDMAVersion)
	}
	switch opts.MinorVersion {
	case 0, 1, 2:
	default:
		return dial.Config{}, nfsclient.Config{}, fmt.Errorf("nfs: NFSv4 minor version %d: want 0 (4.2, else 4.1), 1 or 2", opts.MinorVersion)
	}
	var tr *trace.Tracer
	if opts.Trace != nil {
		list := opts.TraceCategories
		if list == "" {
			list = "rpc,nfs"
		}
		cats, err := trace.Parse(list)
		if err != nil {
			return dial.Config{}, nfsclient.Config{}, fmt.Errorf("nfs: trace categories: %w", err)
		}
		tr = trace.New(opts.Trace, cats)
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	retrans := opts.Retrans
	if retrans <= 0 {
		retrans = 2
	}
	cfg := dial.Config{
		Addr:        net.JoinHostPort(host, strconv.Itoa(port)),
		Proto:       proto,
		NConnect:    opts.NConnect,
		ResvPort:    !opts.NoResvPort && os.Geteuid() == 0,
		DialTimeout: timeout,
		RDMAVers:    rdmaVers,
		RDMAMem:     opts.RDMAMemory,
		RDMADev:     opts.RDMADevice,
		Tracer:      tr,
	}
	ncfg := nfsclient.Config{
		RPC:          oncrpc.ClientOptions{Timeout: timeout, Retrans: retrans, Hard: !opts.Soft},
		Export:       export,
		RSize:        opts.RSize,
		WSize:        opts.WSize,
		MinorVersion: opts.MinorVersion,
		Tracer:       tr,
	}
	if opts.Security != "" {
		sec, err := nfsclient.ParseSecurity(opts.Security)
		if err != nil {
			return dial.Config{}, nfsclient.Config{}, fmt.Errorf("nfs: %w", err)
		}
		if sec != nfsclient.SecSys && proto != "tcp" {
			return dial.Config{}, nfsclient.Config{}, fmt.Errorf("nfs: Security %q: Kerberos over TCP only, not yet over RDMA", opts.Security)
		}
		ncfg.Security = sec
		if sec != nfsclient.SecSys {
			ncfg.GSS = &krb5.Users{Service: "nfs/" + host, CCache: opts.CCache, Self: true}
		}
	}
	return cfg, ncfg, nil
}

func newClient(nc *nfsclient.Client, export string, opts Options) *Client {
	auth := opts.Auth
	if auth == nil {
		auth = processAuth()
	}
	groups := auth.Groups
	if len(groups) > 16 {
		groups = groups[:16] // RFC 5531 appendix A: gids<16>
	}
	ct := opts.CallTimeout
	if ct <= 0 {
		ct = 2 * time.Minute
	}
	return &Client{nfs: nc, cred: nc.Cred(auth.UID, auth.GID, groups), callTimeout: ct, export: export}
}

// processAuth is the calling process's identity.
func processAuth() *Auth {
	a := &Auth{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
	if gs, err := os.Getgroups(); err == nil {
		for _, g := range gs {
			if uint32(g) != a.GID {
				a.Groups = append(a.Groups, uint32(g))
			}
		}
	}
	return a
}

// splitTarget parses "server:/export", "server:port:/export" and
// "[v6addr]:/export" (as the rdmafs mount's source).
func splitTarget(target string) (host string, port int, export string, err error) {
	bad := func(why string) (string, int, string, error) {
		return "", 0, "", fmt.Errorf("nfs: target %q: %s; want server[:port]:/export", target, why)
	}
	rest := target
	if strings.HasPrefix(rest, "[") {
		end := strings.Index(rest, "]")
		if end < 0 {
			return bad("unclosed [")
		}
		host, rest = rest[1:end], rest[end+1:]
		if !strings.HasPrefix(rest, ":") {
			return bad("no export")
		}
		rest = rest[1:]
	} else {
		i := strings.Index(rest, ":")
		if i < 0 {
			return bad("no export")
		}
		host, rest = rest[:i], rest[i+1:]
	}
	if !strings.HasPrefix(rest, "/") {
		i := strings.Index(rest, ":")
		if i < 0 {
			return bad("export must start with /")
		}
		p, perr := strconv.Atoi(rest[:i])
		if perr != nil || p <= 0 || p > 65535 {
			return bad("bad port " + strconv.Quote(rest[:i]))
		}
		port, rest = p, rest[i+1:]
		if !strings.HasPrefix(rest, "/") {
			return bad("export must start with /")
		}
	}
	if host == "" {
		return bad("no server")
	}
	return host, port, rest, nil
}

// Close releases what the client holds on the server (delegations, the
// session and the client ID) and closes the connection. Files should be
// closed first: their unwritten data is lost.
func (c *Client) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), c.callTimeout)
	defer cancel()
	if err := c.nfs.Close(ctx); err != nil {
		return fmt.Errorf("nfs: close: %w", err)
	}
	return nil
}

// NFS returns the nfsclient.Client underneath, for operations this
// package has no method for (extended attributes, COPY, SEEK, ...).
func (c *Client) NFS() *nfsclient.Client { return c.nfs }

// defaultCtx is the context of a call made without one.
func (c *Client) defaultCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), c.callTimeout)
}
