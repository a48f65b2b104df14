// Package dial connects to an NFSv4.1 server: it builds the RPC transport
// (TCP, or RPC-over-RDMA over a verbs provider, with nconnect spreading
// calls over several connections), probes the server and establishes the
// nfsclient session on it. The rdmafs mount and the public nfs library
// both connect through Connect, so there is one way of dialling.
package dial

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// Default ports: NFS over TCP (RFC 7530 s3.1) and over RDMA (RFC 8267
// s6.2.1, the "nfsrdma" port).
const (
	TCPPort  = 2049
	RDMAPort = 20049
)

// Config says how to reach the server.
type Config struct {
	// Addr is the server's host:port.
	Addr string
	// Proto is the transport: "tcp" (or "") or "rdma".
	Proto string
	// NConnect is the number of connections (nfs(5) nconnect); 0 means 1.
	NConnect int
	// ResvPort makes TCP connections from a reserved source port
	// (oncrpc.DialResvPort, nfs(5) resvport); it needs root.
	ResvPort bool
	// DialTimeout bounds one connection attempt; zero means 30 s.
	DialTimeout time.Duration
	// RDMAVers is the RPC-over-RDMA version: "" or "auto" (offer 2, fall
	// back to 1), "1" or "2".
	RDMAVers string
	// RDMAMem bounds the registered memory of an RDMA transport; zero
	// means the rpcrdma default.
	RDMAMem int64
	// RDMADev names the verbs provider: an RDMA device (rdma-core),
	// "iwarp-go" (pure Go), or "" to pick (see Provider).
	RDMADev string
	// Tracer receives RPC, RDMA and verbs trace events; nil traces none.
	Tracer *trace.Tracer
}

// Check reports, without connecting, whether proto names a transport.
func Check(proto string) error {
	switch proto {
	case "", "tcp", "rdma":
		return nil
	}
	return fmt.Errorf("proto=%s: unknown transport", proto)
}

// Transport builds the RPC transport cfg selects. It connects on the
// first call.
func Transport(cfg Config) (oncrpc.Transport, error) {
	switch cfg.Proto {
	case "", "tcp":
		tr := cfg.Tracer
		conns := make([]oncrpc.Transport, max(cfg.NConnect, 1))
		for i := range conns {
			conns[i] = oncrpc.NewTCPTransport(cfg.Addr, oncrpc.TCPOptions{
				DialTimeout: cfg.DialTimeout,
				ResvPort:    cfg.ResvPort,
				OnConnect: func(gen uint64) {
					if tr.On(trace.RPC) {
						tr.Printf(trace.RPC, "connected to %s (connection %d.%d)", cfg.Addr, i, gen)
					}
				},
			})
		}
		return multiTransport(conns, false, tr)
	case "rdma":
		return dialRDMA(cfg)
	}
	return nil, Check(cfg.Proto)
}

// multiTransport spreads calls over conns (nconnect=N, N > 1); a single
// connection is used as it is.
func multiTransport(conns []oncrpc.Transport, rdma bool, tr *trace.Tracer) (oncrpc.Transport, error) {
	if len(conns) == 1 {
		return conns[0], nil
	}
	return oncrpc.NewMultiTransport(conns, oncrpc.MultiOptions{
		RDMA: rdma,
		OnEvent: func(i int, event string, err error) {
			if tr.On(trace.RPC) {
				tr.Printf(trace.RPC, "nconnect: connection %d %s: %v", i, event, err)
			}
		},
	})
}

// Probe sends an RPC NULL over its own transport with soft semantics
// (rpc.Timeout and rpc.Retrans, never hard), so that an unreachable server
// fails within timeout x (retrans+1) even for a hard client.
func Probe(ctx context.Context, cfg Config, rpc oncrpc.ClientOptions) error {
	t, err := Transport(cfg)
	if err != nil {
		return err
	}
	defer t.Close()
	c := oncrpc.NewClient(t, 100003, 4, oncrpc.ClientOptions{Timeout: rpc.Timeout, Retrans: rpc.Retrans})
	return c.Ping(ctx)
}

// ErrTransport marks an error building the transport (a bad RDMA version
// or device) rather than one talking to the server.
var ErrTransport = errors.New("transport")

// Connect probes the server, builds the transport and establishes the
// NFS client on it with ncfg (whose Transport it sets). It returns the
// transport too, for its statistics and registered memory (Slab); closing
// the client closes it. Errors wrap the cause: the transport's, an RPC
// one (oncrpc.ErrTimeout, ...) or an nfsclient.Status.
func Connect(ctx context.Context, cfg Config, ncfg nfsclient.Config) (*nfsclient.Client, oncrpc.Transport, error) {
	if err := Probe(ctx, cfg, ncfg.RPC); err != nil {
		return nil, nil, err
	}
	t, err := Transport(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrTransport, err)
	}
	ncfg.Transport = t
	if ncfg.Tracer == nil {
		ncfg.Tracer = cfg.Tracer
	}
	c, err := nfsclient.Dial(ctx, ncfg)
	if err != nil {
		t.Close()
		return nil, nil, err
	}
	return c, t, nil
}
