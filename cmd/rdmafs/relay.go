package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/nfs/dial"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/rpcrdma"
	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// "rdmafs relay" serves RPC-over-RDMA and relays each call over TCP to an
// NFS server: any TCP-only server becomes reachable over RDMA. Each RDMA
// connection gets a TCP connection of its own, so that the server's
// NFSv4.1 callbacks, which it sends on the connection a session bound for
// its back channel (RFC 8881 s2.10.3.1), go back to that client alone, as
// backward calls on its RDMA connection (RFC 8167).

func relayCommand() *cli.Command {
	return &cli.Command{
		Name:      "relay",
		Usage:     "serve RPC-over-RDMA and relay each call over TCP to an NFS server",
		ArgsUsage: " ",
		Description: `Listens for RPC-over-RDMA connections (RFC 8166, and the draft version 2
with transport characteristics) and forwards every RPC call over TCP to
the NFS server given with --to; the server's replies go back
over RDMA, with the DDP-eligible data of READ and READLINK results placed
by RDMA Write (RFC 8267). A server that speaks only TCP is reached over
RDMA this way, by rdmafs or by the Linux kernel client (mount -t nfs -o
proto=rdma,port=PORT).

Each RDMA connection has a TCP connection of its own to the server. The
server's NFSv4.1 callbacks (CB_RECALL, CB_NOTIFY_LOCK...) arrive on the TCP
connection the client's session bound for its back channel and are
carried to that client as backward calls on its RDMA connection (RFC
8167), their replies back to the server. If a TCP connection to the
server breaks, its RDMA connection is closed too: the client reconnects
and binds its session again.

Bounds per connection, so that one client, broken or hostile, cannot
starve the others: the calls it may have in progress (--credits, the
grant of RFC 8166 s3.3.1; a client exceeding it is disconnected), its
share of the registered memory (--memory / 8), and how long it may leave
an RDMA Read of its data unanswered (--read-timeout; the connection is
then closed). A call the server does not answer within --call-timeout
is dropped; the client retransmits it.

WHAT THE RELAY TRUSTS AND WHOM IT LETS IN: the server sees every call
come from the relay's host, so the relay applies what the server would
apply to the clients themselves, with the defaults of exports(5). It
listens on the loopback (127.0.0.1:20049) unless --listen says otherwise,
and serves only the addresses --allow names (default: the loopback,
127.0.0.0/8 and ::1, wherever it listens), checked when a connection
arrives; refused ones are counted and logged. AUTH_SYS identities are
the client's word: --root-squash (the default) maps uid 0 and gid 0 to
--anonuid and --anongid (65534), --all-squash maps every uid and gid to
them and drops the supplementary groups, --no-root-squash passes them
as sent. AUTH_NONE passes; RPCSEC_GSS passes untouched (authenticated
end to end); other flavors get AUTH_BADCRED. As root the relay connects
to the server from a reserved port (665-1023), so that secure exports
accept it: the server's trust in a reserved port becomes the relay's to
give, to every client it lets in (--noresvport: any port). All clients
may hold --max-connections connections at once, one address (an IPv6
/64) --max-connections-per-source; a connection that sends nothing for
--idle-timeout is closed.

"rdmafs stats --relay PORT" prints the relay's counters: connections,
calls, bytes, errors, callbacks, and a line per connection. The stats
socket is relay-PORT.sock in the run directory (see "rdmafs stats
--help").

SIGTERM or SIGINT stops the relay: it stops listening, lets calls in
progress finish for up to --grace, then closes every connection.

EXIT STATUS:
   0 stopped by a signal; 1 bad usage; 4 cannot listen or reach the server.

EXAMPLES:
   rdmafs relay --to nfs1:2049                    # on 127.0.0.1:20049
   rdmafs relay --listen 192.168.1.5:20049 --allow 192.168.1.0/24 --to nfs1:2049 --rdmadev mlx5_0
   rdmafs relay --to localhost:2049 -v rpc,rdma
   rdmafs stats --relay 20049`,
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "listen", Value: defaultRelayListen, Usage: "serve RPC-over-RDMA on `ADDR` (host:port; 20049 is NFS over RDMA's port; :20049 for every interface)"},
			&cli.StringFlag{Name: "to", Usage: "relay to the NFS server at `HOST:PORT` over TCP (required; port 2049 when omitted)"},
			&cli.StringFlag{Name: "rdmadev", Usage: "RDMA device `NAME` (rdma-core), or iwarp-go for the pure-Go iWARP provider", DefaultText: "the first device, else iwarp-go"},
			&cli.StringFlag{Name: "rdmavers", Value: "auto", Usage: "RPC-over-RDMA `VERSION`s served: auto or 2 serve versions 1 and 2, 1 serves version 1 only"},
			&cli.IntFlag{Name: "credits", Value: 64, Usage: "calls in progress granted to each connection (`N`)"},
			&cli.Int64Flag{Name: "memory", Value: 256, Usage: "registered memory in `MiB`; a connection may hold an eighth of it"},
			&cli.DurationFlag{Name: "read-timeout", Value: 30 * time.Second, Usage: "close a connection that leaves an RDMA Read unanswered for `DURATION`"},
			&cli.DurationFlag{Name: "call-timeout", Value: time.Minute, Usage: "drop a call the server has not answered within `DURATION`"},
			&cli.DurationFlag{Name: "grace", Value: 5 * time.Second, Usage: "on SIGTERM, let calls in progress finish for up to `DURATION`"},
			&cli.StringFlag{Name: "v", Usage: "trace `CATEGORIES` (comma separated: rpc for connections, server connections and callbacks, rdma for every message the responder handles, or all), one line per event, to stderr or --log", DefaultText: "none"},
			&cli.StringFlag{Name: "log", Usage: "write traces and errors to `FILE` instead of stderr"},
		}, relayGateFlags()...),
		Action: runRelay,
	}
}

// relayConfig is what the relay's flags ask for.
type relayConfig struct {
	listen, to, rdmadev string
	maxVersion          int
	credits             int
	memory              int64
	readTimeout         time.Duration
	callTimeout         time.Duration
	grace               time.Duration
	gate                gateConfig
	// logw receives the refused connections' lines.
	logw io.Writer
}

func relayFlags(cctx *cli.Context) (*relayConfig, error) {
	if cctx.NArg() != 0 {
		return nil, exitf(exitUsage, nil, "usage: rdmafs relay [--listen ADDR] --to HOST:PORT (no arguments)")
	}
	c := &relayConfig{listen: cctx.String("listen"), to: cctx.String("to"), rdmadev: cctx.String("rdmadev"),
		credits: cctx.Int("credits"), memory: cctx.Int64("memory") << 20, readTimeout: cctx.Duration("read-timeout"),
		callTimeout: cctx.Duration("call-timeout"), grace: cctx.Duration("grace")}
	if c.to == "" {
		return nil, exitf(exitUsage, nil, "--to: which NFS server to relay to (host:port)")
	}
	if _, _, err := net.SplitHostPort(c.to); err != nil {
		c.to = net.JoinHostPort(c.to, "2049")
	}
	if _, _, err := net.SplitHostPort(c.listen); err != nil {
		return nil, exitf(exitUsage, err, "--listen %s: want host:port", c.listen)
	}
	gate, err := gateFlags(cctx)
	if err != nil {
		return nil, err
	}
	c.gate = gate
	switch v := cctx.String("rdmavers"); v {
	case "auto", "2":
		c.maxVersion = rpcrdma.Version2
	case "1":
		c.maxVersion = rpcrdma.Version1
	default:
		return nil, exitf(exitUsage, nil, "--rdmavers %s: want auto, 1 or 2", v)
	}
	switch {
	case c.credits < 1 || c.credits > 1024:
		return nil, exitf(exitUsage, nil, "--credits %d: want 1 to 1024", c.credits)
	case c.memory < 16<<20:
		return nil, exitf(exitUsage, nil, "--memory %d: want at least 16 (MiB)", c.memory>>20)
	case c.readTimeout <= 0 || c.callTimeout <= 0 || c.grace < 0:
		return nil, exitf(exitUsage, nil, "--read-timeout, --call-timeout: want a positive duration")
	}
	return c, nil
}

func runRelay(cctx *cli.Context) error {
	cfg, err := relayFlags(cctx)
	if err != nil {
		return err
	}
	cats, err := traceCategories(cctx)
	if err != nil {
		return err
	}
	logw, closeLog, err := openLog(cctx.String("log"))
	if err != nil {
		return err
	}
	defer closeLog()
	cfg.logw = logw
	cfg.gate.counts.log.w = logw
	if cfg.gate.defaultAllowing && !loopbackListen(cfg.listen) {
		fmt.Fprintf(logw, "rdmafs relay: listening on %s without --allow: only loopback clients are served\n", cfg.listen)
	}
	var tr *trace.Tracer
	if cats != 0 {
		tr = trace.New(logw, cats)
	}
	// Fail fast on a server that is not there; each client connection
	// dials its own connection later.
	nc, err := net.DialTimeout("tcp", cfg.to, serverDialWait)
	if err != nil {
		return exitf(exitServer, err, "cannot reach NFS server %s: %v", cfg.to, err)
	}
	nc.Close()
	prov, desc, remInv, closeProv, err := relayProvider(cfg.rdmadev, &cfg.gate)
	if err != nil {
		return exitf(exitServer, err, "%v", err)
	}
	if closeProv != nil {
		defer closeProv()
	}
	// SIGTERM and SIGINT are caught before the relay serves, so that a
	// signal right after it starts stops it cleanly too.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	r, err := startRelay(cfg, prov, remInv, tr)
	if err != nil {
		return exitf(exitServer, err, "%v", err)
	}
	port := portOf(r.resp.Addr())
	st, err := startRelayStats(r, port)
	if err != nil {
		r.resp.Close()
		return exitf(exitServer, err, "relay stats socket: %v", err)
	}
	defer st.Close()
	// The address goes to stdout, one line, for scripts and tests that
	// listen on port 0.
	fmt.Printf("rdmafs relay: serving RPC-over-RDMA on %s (%s), relaying to %s over TCP\n", r.resp.Addr(), desc, cfg.to)
	<-ctx.Done()
	if tr.On(trace.RPC) {
		tr.Printf(trace.RPC, "relay: stopping: %d connections, %v for calls in progress", r.resp.Stats().Connections, cfg.grace)
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.grace)
	defer cancel()
	if err := r.resp.Shutdown(sctx); err != nil {
		fmt.Fprintf(logw, "rdmafs relay: %v\n", err)
	}
	return nil
}

// relayProvider picks the verbs provider as the mount's rdmadev option
// does (dial.Provider); the pure-Go one is gated (gatedIWARP). It returns
// the provider, its description, whether the relay may use Send With
// Invalidate, and how to release it.
func relayProvider(dev string, gate *gateConfig) (verbs.Provider, string, bool, func() error, error) {
	p, desc, remInv, closer, err := dial.Provider(dev, "--rdmadev ")
	if _, ok := p.(*iwarp.Provider); ok {
		return &gatedIWARP{gate: gate}, desc, remInv, closer, nil
	}
	return p, desc, remInv, closer, err
}

// relay is a running relay: the responder and the connections it serves.
type relay struct {
	cfg   *relayConfig
	resp  *rpcrdma.Responder
	tr    *trace.Tracer
	start time.Time

	mu    sync.Mutex
	conns map[*relayConn]struct{}

	forwarded, lost         atomic.Uint64 // calls relayed; calls the server did not answer
	callbacks, cbLost       atomic.Uint64 // backward calls relayed; not answered by the client
	credRefused, malformed  atomic.Uint64 // calls refused for their credential; calls that did not parse
	serverDials, serverLost atomic.Uint64 // TCP connections made; connections that broke
}

func startRelay(cfg *relayConfig, prov verbs.Provider, remInv bool, tr *trace.Tracer) (*relay, error) {
	r := &relay{cfg: cfg, tr: tr, start: time.Now(), conns: make(map[*relayConn]struct{})}
	rl := cfg.gate.counts.log
	resp, err := rpcrdma.Listen(cfg.listen, rpcrdma.ResponderConfig{
		Allow:             cfg.gate.allows,
		MaxConns:          cfg.gate.maxConns,
		MaxConnsPerSource: cfg.gate.maxPerSource,
		IdleTimeout:       cfg.gate.idleTimeout,
		OnRefuse:          rl.refused,
		Provider:          prov,
		NewConn:           r.newConn,
		ReplyBulk:         nfsclient.ReplyBulk,
		RemoteInvalidate:  remInv,
		Credits:           cfg.credits,
		MaxVersion:        cfg.maxVersion,
		XChars:            cfg.maxVersion >= rpcrdma.Version2,
		Memory:            cfg.memory,
		ReadTimeout:       cfg.readTimeout,
		Tracer:            tr,
	})
	if err != nil {
		return nil, err
	}
	r.resp = resp
	return r, nil
}

// relayConn is one RDMA connection and its TCP connection to the server.
type relayConn struct {
	r     *relay
	rc    *rpcrdma.ResponderConn
	tcp   *oncrpc.TCPTransport
	fwd   oncrpc.ViewHandler
	since time.Time
	calls atomic.Uint64
	// closing is set once the RDMA connection ended: the TCP connection
	// closes because the relay closes it.
	closing atomic.Bool
}

// serverDialWait bounds the connection to the server that a new client
// connection waits for.
const serverDialWait = 10 * time.Second

// newConn connects a new RDMA connection to the server. The TCP
// connection is made once: when it breaks, the RDMA connection is closed
// at once rather than a new TCP connection made, since the server's
// session state bound to the old one (the back channel: RFC 8881
// s2.10.3.1) would not follow; the client reconnects and binds again.
func (r *relay) newConn(rc *rpcrdma.ResponderConn) (oncrpc.CallHandler, error) {
	c := &relayConn{r: r, rc: rc, since: time.Now()}
	var dials atomic.Int32
	var d net.Dialer
	dial := d.DialContext
	if r.cfg.gate.resvport {
		dial = oncrpc.DialResvPort
	}
	c.tcp = oncrpc.NewTCPTransport(r.cfg.to, oncrpc.TCPOptions{
		DialTimeout: serverDialWait,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials.Add(1) > 1 {
				return nil, errors.New("relay: the connection to the server broke")
			}
			nc, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &serverConn{Conn: nc, broke: c.serverBroke}, nil
		},
	})
	c.tcp.SetCallHandler(backwardRelay{c})
	ctx, cancel := context.WithTimeout(context.Background(), serverDialWait)
	defer cancel()
	if err := c.tcp.Connect(ctx); err != nil {
		c.tcp.Close()
		return nil, fmt.Errorf("relay to %s: %w", r.cfg.to, err)
	}
	r.serverDials.Add(1)
	c.fwd = oncrpc.Relay(c.tcp, r.cfg.callTimeout)
	r.mu.Lock()
	r.conns[c] = struct{}{}
	r.mu.Unlock()
	r.tracef("relay: connection from %v, relayed to %s", rc.RemoteAddr(), r.cfg.to)
	return c, nil
}

func (r *relay) tracef(format string, args ...any) {
	if r.tr.On(trace.RPC) {
		r.tr.Printf(trace.RPC, format, args...)
	}
}

// HandleCall relays one call to the server, its AUTH_SYS credential
// mapped as the gate says (relay_gate.go), and returns a copy of the
// reply: the responder calls HandleCallView instead.
func (c *relayConn) HandleCall(msg []byte) []byte {
	reply := c.HandleCallView(msg)
	defer c.ReleaseView(reply)
	if reply.IsZero() {
		return nil
	}
	return append([]byte(nil), reply.Bytes()...)
}

// HandleCallView relays one call as HandleCall does and returns the
// server's reply where the TCP connection received it, lent until
// ReleaseView: the responder sends it from there, without a copy of its
// own in between (oncrpc.ViewHandler).
func (c *relayConn) HandleCallView(msg []byte) oncrpc.View {
	c.calls.Add(1)
	msg, refusal, err := c.r.cfg.gate.squash.MapCall(msg)
	switch {
	case err != nil:
		c.r.malformed.Add(1)
		c.r.tracef("relay: %v: dropped: %v", c.rc.RemoteAddr(), err)
		return oncrpc.View{}
	case refusal != nil:
		c.r.credRefused.Add(1)
		return oncrpc.Plain(refusal)
	}
	c.r.forwarded.Add(1)
	reply := c.fwd.HandleCallView(msg)
	if reply.IsZero() {
		c.r.lost.Add(1)
		if len(msg) >= 4 {
			c.r.tracef("relay: %v: no reply from the server to xid %#x", c.rc.RemoteAddr(), uint32(msg[0])<<24|uint32(msg[1])<<16|uint32(msg[2])<<8|uint32(msg[3]))
		}
	}
	return reply
}

// ReleaseView gives a reply HandleCallView returned back to the
// connection to the server (a refusal, in ordinary memory, needs
// nothing).
func (c *relayConn) ReleaseView(reply oncrpc.View) { c.fwd.ReleaseView(reply) }

// The responder sends relayed replies from where they were received.
var _ oncrpc.ViewHandler = (*relayConn)(nil)

// serverBroke closes the RDMA connection once its connection to the
// server broke, unless the relay closed that one itself.
func (c *relayConn) serverBroke(err error) {
	if c.closing.Load() {
		return
	}
	c.r.serverLost.Add(1)
	c.r.tracef("relay: %v: connection to the server broke (%v): closing", c.rc.RemoteAddr(), err)
	c.rc.Close()
}

// serverConn is a relay's TCP connection to the server, which reports
// the first error reading from it: the server closed it or it broke.
type serverConn struct {
	net.Conn
	once  sync.Once
	broke func(error)
}

func (c *serverConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.once.Do(func() { c.broke(err) })
	}
	return n, err
}

// Close ends the connection to the server once the RDMA connection ended.
func (c *relayConn) Close() error {
	c.closing.Store(true)
	c.r.mu.Lock()
	delete(c.r.conns, c)
	c.r.mu.Unlock()
	c.r.tracef("relay: connection from %v ended after %d calls", c.rc.RemoteAddr(), c.calls.Load())
	return c.tcp.Close()
}

// backwardRelay carries the server's backward calls (NFSv4.1 callbacks)
// on a TCP connection to its RDMA connection, and the client's replies
// back. A call the client does not answer gets no reply: the server
// times it out, as it would over a broken back channel.
type backwardRelay struct{ c *relayConn }

func (b backwardRelay) HandleCall(msg []byte) []byte {
	r := b.c.r
	r.callbacks.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.callTimeout)
	defer cancel()
	reply, err := b.c.rc.Call(ctx, msg)
	if err != nil {
		r.cbLost.Add(1)
		r.tracef("relay: callback to %v: %v", b.c.rc.RemoteAddr(), err)
		return nil
	}
	return reply
}

// writeStats writes the relay's report.
func (r *relay) writeStats(w io.Writer) {
	s := r.resp.Stats()
	// The refusals of the responder's gate and of the relay's TCP one
	// (relay_tcpgate.go).
	notAllowed := s.NotAllowed + r.cfg.gate.counts.notAllowed.Load()
	overLimit := s.OverLimit + r.cfg.gate.counts.overLimit.Load()
	fmt.Fprintf(w, "pid: %d\n", os.Getpid())
	fmt.Fprintf(w, "relay %s to %s over tcp\n", r.resp.Addr(), r.cfg.to)
	fmt.Fprintf(w, "age: %v\n", time.Since(r.start).Round(time.Second))
	fmt.Fprintf(w, "connections: open=%d accepted=%d refused=%d not_allowed=%d over_limit=%d server_unreachable=%d idle_closed=%d\n",
		s.Connections, s.Accepted, s.Refused+notAllowed+overLimit, notAllowed, overLimit, s.Refused, s.IdleClosed)
	fmt.Fprintf(w, "calls: %d forwarded=%d unanswered=%d bytes_in=%d bytes_out=%d\n", s.Calls, r.forwarded.Load(), r.lost.Load(), s.BytesIn, s.BytesOut)
	fmt.Fprintf(w, "callbacks: %d unanswered=%d\n", r.callbacks.Load(), r.cbLost.Load())
	fmt.Fprintf(w, "credentials: refused=%d malformed_calls=%d\n", r.credRefused.Load(), r.malformed.Load())
	fmt.Fprintf(w, "gate: %v\n", &r.cfg.gate)
	fmt.Fprintf(w, "errors: chunk=%d reply=%d credit_overruns=%d read_timeouts=%d server_connections_lost=%d\n",
		s.ChunkErrors, s.ReplyErrors, s.Overruns, s.ReadTimeouts, r.serverLost.Load())
	fmt.Fprintf(w, "limits: credits=%d memory=%d read_timeout=%v call_timeout=%v\n", r.cfg.credits, r.cfg.memory, r.cfg.readTimeout, r.cfg.callTimeout)
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.conns {
		fmt.Fprintf(w, "  connection %v: calls=%d age=%v\n", c.rc.RemoteAddr(), c.calls.Load(), time.Since(c.since).Round(time.Second))
	}
}

// relaySocketName is the file name of the stats socket of the relay on
// port.
func relaySocketName(port string) string { return "relay-" + port + ".sock" }

// relayStatsServer answers "rdmafs stats --relay" on the relay's socket.
type relayStatsServer struct {
	ln   net.Listener
	path string
}

func startRelayStats(r *relay, port string) (*relayStatsServer, error) {
	d, err := makeRunDir()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(d, relaySocketName(port))
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("%s: another relay on port %s answers there", path, port)
	}
	os.Remove(path) // a stale socket of a relay that died
	ln, err := listenUnixPrivate(path)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.SetDeadline(time.Now().Add(time.Minute))
			r.writeStats(conn)
			conn.Close()
		}
	}()
	return &relayStatsServer{ln: ln, path: path}, nil
}

// Close stops answering and removes the socket.
func (s *relayStatsServer) Close() { s.ln.Close() }

// dialRelayStats connects to the stats socket of the relay on port.
func dialRelayStats(port string, timeout time.Duration) (net.Conn, error) {
	if _, err := strconv.Atoi(port); err != nil {
		return nil, fmt.Errorf("--relay %s: want the relay's port", port)
	}
	return dialSocket(relaySocketName(port), "", timeout)
}

// loopbackListen reports whether the listen address is a loopback one.
func loopbackListen(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
