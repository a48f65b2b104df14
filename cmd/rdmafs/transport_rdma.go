package main

import (
	"fmt"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/rpcrdma"
	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/ibverbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// rdmaTransport is the RPC-over-RDMA transport of a proto=rdma mount,
// with its counters in the form "rdmafs stats" prints.
type rdmaTransport struct {
	*rpcrdma.Transport
	provider string       // which verbs provider and device
	closer   func() error // releases the provider's device (nil: nothing)
}

// Close ends the transport and releases the provider's device.
func (t rdmaTransport) Close() error {
	err := t.Transport.Close()
	if t.closer != nil {
		_ = t.closer()
	}
	return err
}

// rdmaProvider picks the verbs provider (the rdmadev option): rdma-core
// when the machine has an RDMA device or one is named, else pure Go. It
// reports the provider's description, whether the peer may use Send With
// Invalidate, and how to release it.
func rdmaProvider(o *mountOptions) (verbs.Provider, string, bool, func() error, error) {
	if o.RDMADev == "iwarp-go" || (o.RDMADev == "" && !ibverbs.Available(ibverbs.SysfsRoot)) {
		return &iwarp.Provider{}, "iwarp-go (pure Go iWARP over TCP)", true, nil, nil
	}
	p, err := ibverbs.Open(o.RDMADev)
	if err != nil {
		if o.RDMADev == "" {
			return nil, "", false, nil, fmt.Errorf("proto=rdma: %w (rdmadev=iwarp-go uses the pure-Go provider)", err)
		}
		return nil, "", false, nil, fmt.Errorf("rdmadev=%s: %w", o.RDMADev, err)
	}
	return p, p.String(), p.RemoteInvalidate(), p.Close, nil
}

var _ oncrpc.Transport = rdmaTransport{}
var _ TransportStats = rdmaTransport{}

// dialRDMA makes the RPC-over-RDMA transport over the provider
// rdmaProvider picks. It connects on the first call.
func dialRDMA(o *mountOptions, tr *trace.Tracer) (oncrpc.Transport, error) {
	vers := 0
	switch o.RDMAVers {
	case "", "auto":
	case "1":
		vers = rpcrdma.Version1
	case "2":
		vers = rpcrdma.Version2
	default:
		return nil, fmt.Errorf("rdmavers=%s: want auto, 1 or 2", o.RDMAVers)
	}
	prov, desc, remInv, closer, err := rdmaProvider(o)
	if err != nil {
		return nil, err
	}
	if tr.On(trace.Verbs) {
		tr.Printf(trace.Verbs, "provider %s, remote invalidation %v", desc, remInv)
	}
	t := rpcrdma.NewTransport(o.addr(), rpcrdma.Config{
		Provider:         prov,
		Version:          vers,
		XChars:           true,
		AcceptInvalidate: remInv,
		DialTimeout:      o.Timeo,
		MemoryBytes:      o.RDMAMem,
		Tracer:           tr,
	})
	conns := []oncrpc.Transport{rdmaTransport{Transport: t, provider: desc, closer: closer}}
	for len(conns) < o.NConnect {
		// nconnect: more connections sharing t's registered memory.
		conns = append(conns, rdmaTransport{Transport: t.Another(), provider: desc})
	}
	return multiTransport(conns, true, tr)
}

// buffersOf returns the registered memory of an RDMA transport for the
// FUSE layer's READ and WRITE buffers, or nil (TCP: ordinary memory).
func buffersOf(t oncrpc.Transport) fuse.BufferPool {
	if mt, ok := t.(*oncrpc.MultiTransport); ok {
		// The connections share the first one's registered memory.
		t = mt.Conn(0)
	}
	if rt, ok := t.(rdmaTransport); ok {
		return slabBuffers{rt.Buffers()}
	}
	return nil
}

// slabBuffers lends the transport's slab to the FUSE layer.
type slabBuffers struct{ pool *mrcache.Pool }

func (s slabBuffers) Alloc(n int) (fuse.Buffer, error) {
	b, err := s.pool.Alloc(n)
	if err != nil {
		return nil, err
	}
	return b, nil
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
