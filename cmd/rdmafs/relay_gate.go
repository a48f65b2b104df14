package main

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// The relay's gate: whom it lets in (--listen, --allow), what identity
// their calls carry to the server (--root-squash, --all-squash, as
// exports(5) maps them), from which port it speaks to the server
// (reserved as root, --noresvport), and how many connections it holds
// (--max-connections, --max-connections-per-source, --idle-timeout).
// The server sees every call come from the relay's host, so the relay
// applies the client list and squashing the server would have applied
// to the clients themselves.

// Defaults of the gate.
const (
	defaultRelayListen = "127.0.0.1:20049"
	defaultAnonID      = 65534 // exports(5) anonuid, anongid
	defaultMaxConns    = 128
	defaultPerSource   = 16
	// defaultIdleTimeout is longer than any lease renewal interval of
	// a live client (the Linux client renews at 2/3 of the lease, 60 s
	// for knfsd's 90 s; rdmafs at 1/3).
	defaultIdleTimeout = 2 * time.Minute
)

// defaultAllow is whom the relay lets in without --allow: the loopback,
// where it listens by default.
var defaultAllow = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

func relayGateFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "allow", Usage: "serve only clients whose address is in `ADDR/PREFIX,...` (a bare address is /32 or /128); others are refused when they connect", DefaultText: "127.0.0.0/8,::1/128: the loopback alone"},
		&cli.BoolFlag{Name: "root-squash", Usage: "map AUTH_SYS uid 0 to --anonuid and gid 0 to --anongid (exports(5) root_squash)", DefaultText: "on"},
		&cli.BoolFlag{Name: "no-root-squash", Usage: "pass uid and gid 0 to the server as the client sent them"},
		&cli.BoolFlag{Name: "all-squash", Usage: "map every AUTH_SYS uid and gid to --anonuid and --anongid and drop the supplementary groups"},
		&cli.UintFlag{Name: "anonuid", Value: defaultAnonID, Usage: "the `UID` squashed users become"},
		&cli.UintFlag{Name: "anongid", Value: defaultAnonID, Usage: "the `GID` squashed groups become"},
		&cli.BoolFlag{Name: "noresvport", Usage: "connect to the server from any port; by default, as root, the relay connects from a reserved port (below 1024), as a secure export requires"},
		&cli.IntFlag{Name: "max-connections", Value: defaultMaxConns, Usage: "serve at most `N` connections at once"},
		&cli.IntFlag{Name: "max-connections-per-source", Value: defaultPerSource, Usage: "serve at most `N` connections from one address (an IPv6 /64)"},
		&cli.DurationFlag{Name: "idle-timeout", Value: defaultIdleTimeout, Usage: "close a connection that sends nothing for `DURATION` (0: never)"},
	}
}

// gateConfig is what the gate's flags ask for.
type gateConfig struct {
	allow           []netip.Prefix
	squash          oncrpc.Squash
	resvport        bool
	maxConns        int
	maxPerSource    int
	idleTimeout     time.Duration
	defaultAllowing bool // --allow was not given
	counts          *gateCounts
}

func gateFlags(cctx *cli.Context) (gateConfig, error) {
	g := gateConfig{allow: defaultAllow, defaultAllowing: true, counts: &gateCounts{log: &refusalLog{w: os.Stderr}}, resvport: !cctx.Bool("noresvport") && os.Geteuid() == 0,
		maxConns: cctx.Int("max-connections"), maxPerSource: cctx.Int("max-connections-per-source"), idleTimeout: cctx.Duration("idle-timeout")}
	if cctx.IsSet("allow") {
		a, err := parseAllow(cctx.String("allow"))
		if err != nil {
			return g, exitf(exitUsage, err, "--allow %s: %v", cctx.String("allow"), err)
		}
		g.allow, g.defaultAllowing = a, false
	}
	if cctx.Bool("root-squash") && cctx.Bool("no-root-squash") {
		return g, exitf(exitUsage, nil, "--root-squash and --no-root-squash: pick one")
	}
	uid, gid := cctx.Uint("anonuid"), cctx.Uint("anongid")
	if uint64(uid) > 1<<32-1 || uint64(gid) > 1<<32-1 {
		return g, exitf(exitUsage, nil, "--anonuid %d, --anongid %d: want 32-bit ids", uid, gid)
	}
	// exports(5): all_squash wins over no_root_squash.
	g.squash = oncrpc.Squash{All: cctx.Bool("all-squash"), Root: !cctx.Bool("no-root-squash"), AnonUID: uint32(uid), AnonGID: uint32(gid)}
	switch {
	case g.maxConns < 1 || g.maxPerSource < 1:
		return g, exitf(exitUsage, nil, "--max-connections %d, --max-connections-per-source %d: want at least 1", g.maxConns, g.maxPerSource)
	case g.idleTimeout < 0:
		return g, exitf(exitUsage, nil, "--idle-timeout %v: want a duration, 0 for none", g.idleTimeout)
	}
	return g, nil
}

// parseAllow parses a comma-separated list of addresses and prefixes.
func parseAllow(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !strings.Contains(s, "/") {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return nil, fmt.Errorf("%q: want an address or ADDR/PREFIX", s)
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%q: want an address or ADDR/PREFIX", s)
		}
		out = append(out, p.Masked())
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no address")
	}
	return out, nil
}

// allows reports whether peer's address is in the allow list.
func (g *gateConfig) allows(peer net.Addr) bool {
	var a netip.Addr
	switch p := peer.(type) {
	case *net.TCPAddr:
		a, _ = netip.AddrFromSlice(p.IP)
	default:
		if peer == nil {
			return false
		}
		ap, err := netip.ParseAddrPort(peer.String())
		if err != nil {
			return false
		}
		a = ap.Addr()
	}
	a = a.Unmap()
	for _, p := range g.allow {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// String describes the gate for the stats.
func (g *gateConfig) String() string {
	allow := make([]string, len(g.allow))
	for i, p := range g.allow {
		allow[i] = p.String()
	}
	squash := "root"
	switch {
	case g.squash.All:
		squash = "all"
	case !g.squash.Root:
		squash = "none"
	}
	return fmt.Sprintf("allow=%s squash=%s anonuid=%d anongid=%d resvport=%v max_connections=%d max_per_source=%d idle_timeout=%v",
		strings.Join(allow, ","), squash, g.squash.AnonUID, g.squash.AnonGID, g.resvport, g.maxConns, g.maxPerSource, g.idleTimeout)
}

// refusalLog writes one line per refused connection, at most
// refusalBurst a second; those beyond are counted and the count is
// said on the next line written.
type refusalLog struct {
	w io.Writer

	mu         sync.Mutex
	window     time.Time
	n          int
	suppressed int
}

const refusalBurst = 10

func (l *refusalLog) refused(peer net.Addr, reason error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if now.Sub(l.window) >= time.Second {
		l.window, l.n = now, 0
	}
	if l.n >= refusalBurst {
		l.suppressed++
		return
	}
	l.n++
	more := ""
	if l.suppressed > 0 {
		more = fmt.Sprintf(" (and %d more refused before, not logged)", l.suppressed)
		l.suppressed = 0
	}
	fmt.Fprintf(l.w, "rdmafs relay: refused %v: %v%s\n", peer, reason, more)
}
