package dial

import (
	"fmt"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/rpcrdma"
	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/ibverbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// IWarpGo names the pure-Go iWARP provider (RDMA over TCP) in RDMADev.
const IWarpGo = "iwarp-go"

// rdmaTransport is an RPC-over-RDMA transport with its provider, and its
// counters in the form "rdmafs stats" prints.
type rdmaTransport struct {
	*rpcrdma.Transport
	provider string       // which verbs provider and device
	closer   func() error // releases the provider's device (nil: nothing)
}

var _ oncrpc.Transport = rdmaTransport{}

// Close ends the transport and releases the provider's device.
func (t rdmaTransport) Close() error {
	err := t.Transport.Close()
	if t.closer != nil {
		_ = t.closer()
	}
	return err
}

// Provider picks the verbs provider (the rdmadev option, the relay's
// --rdmadev): rdma-core when the machine has an RDMA device or dev names
// one, else pure Go. It reports the provider's description, whether the
// peer may use Send With Invalidate, and how to release it (nil: nothing
// to release). option is how the user spells the choice ("rdmadev=",
// "--rdmadev "), for the error.
func Provider(dev, option string) (p verbs.Provider, desc string, remoteInvalidate bool, closer func() error, err error) {
	if dev == IWarpGo || (dev == "" && !ibverbs.Available(ibverbs.SysfsRoot)) {
		return &iwarp.Provider{}, "iwarp-go (pure Go iWARP over TCP)", true, nil, nil
	}
	ip, err := ibverbs.Open(dev)
	if err != nil {
		if dev == "" {
			return nil, "", false, nil, fmt.Errorf("%w (%s%s uses the pure-Go provider)", err, option, IWarpGo)
		}
		return nil, "", false, nil, fmt.Errorf("%s%s: %w", option, dev, err)
	}
	return ip, ip.String(), ip.RemoteInvalidate(), ip.Close, nil
}

// dialRDMA makes the RPC-over-RDMA transport over the provider Provider
// picks. It connects on the first call.
func dialRDMA(cfg Config) (oncrpc.Transport, error) {
	vers := 0
	switch cfg.RDMAVers {
	case "", "auto":
	case "1":
		vers = rpcrdma.Version1
	case "2":
		vers = rpcrdma.Version2
	default:
		return nil, fmt.Errorf("rdmavers=%s: want auto, 1 or 2", cfg.RDMAVers)
	}
	prov, desc, remInv, closer, err := Provider(cfg.RDMADev, "rdmadev=")
	if err != nil {
		return nil, fmt.Errorf("proto=rdma: %w", err)
	}
	tr := cfg.Tracer
	if tr.On(trace.Verbs) {
		tr.Printf(trace.Verbs, "provider %s, remote invalidation %v", desc, remInv)
	}
	t := rpcrdma.NewTransport(cfg.Addr, rpcrdma.Config{
		Provider:         prov,
		Version:          vers,
		XChars:           true,
		AcceptInvalidate: remInv,
		DialTimeout:      cfg.DialTimeout,
		MemoryBytes:      cfg.RDMAMem,
		Tracer:           tr,
	})
	conns := []oncrpc.Transport{rdmaTransport{Transport: t, provider: desc, closer: closer}}
	for len(conns) < cfg.NConnect {
		// nconnect: more connections sharing t's registered memory.
		conns = append(conns, rdmaTransport{Transport: t.Another(), provider: desc})
	}
	return multiTransport(conns, true, tr)
}

// Slab returns the registered memory of an RDMA transport Transport
// made, which READ data lands in and WRITE data leaves from without a
// copy, or nil (TCP: ordinary memory).
func Slab(t oncrpc.Transport) *mrcache.Pool {
	if mt, ok := t.(*oncrpc.MultiTransport); ok {
		// The connections share the first one's registered memory.
		t = mt.Conn(0)
	}
	if rt, ok := t.(rdmaTransport); ok {
		return rt.Buffers()
	}
	return nil
}

// Stats reports the negotiated version, thresholds, credits, chunk
// counts, the peer's transport characteristics and the registration
// cache.
func (t rdmaTransport) Stats() map[string]any {
	s := t.Transport.Stats()
	version := fmt.Sprint(s.Version)
	if s.Version == 0 {
		version = "negotiating"
	}
	m := map[string]any{
		"rdma version":          version,
		"rdma provider":         t.provider,
		"inline send threshold": s.InlineSend,
		"inline recv threshold": s.InlineRecv,
		"credits granted":       s.Credits,
		"connects":              s.Connects,
		"replies":               s.Replies,
		"calls inline":          s.InlineCalls,
		"calls with read chunk": s.ReadChunks,
		"calls position-zero":   s.PosZeroChunks,
		"replies write chunk":   s.WriteChunks,
		"replies reply chunk":   s.ReplyChunks,
		"bytes placed":          s.BytesPlaced,
		"dropped messages":      s.Dropped,
		"backward calls":        s.BackwardCalls,
		"v2 fallbacks":          s.Fallbacks,
		"bytes copied":          s.BytesCopied,
		"mr exposures":          s.Memory.Exposures,
		"mr exposure reuses":    s.Memory.ExposureReuses,
		"mr reuse rate":         fmt.Sprintf("%.2f%%", 100*s.Memory.ReuseRate()),
		"mr fast regions":       s.Memory.FastRegions,
		"mr live exposures":     s.Memory.LiveExposures,
		"mr bytes registered":   s.Memory.BytesRegistered,
		"mr bytes in use":       s.Memory.BytesInUse,
		"mr budget":             s.Memory.BudgetBytes,
		"mr alloc failures":     s.Memory.AllocFailures,
		// rdma-core with memory windows (RDMAFS_IBVERBS_WINDOWS):
		// exposures bound by a work request; 0 otherwise.
		"mr window binds": ibverbs.WindowBinds(t.PD()),
	}
	if s.PeerAnnounced {
		m["peer rbsize"] = s.Peer.RBSize
		m["peer reqreminv"] = s.Peer.ReqRemInv
		m["peer brs"] = s.Peer.BRS
	}
	return m
}
