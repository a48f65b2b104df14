package main

import (
	"fmt"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/rpcrdma"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// rdmaTransport is the RPC-over-RDMA transport of a proto=rdma mount,
// with its counters in the form "rdmafs stats" prints.
type rdmaTransport struct {
	*rpcrdma.Transport
}

var _ oncrpc.Transport = rdmaTransport{}
var _ TransportStats = rdmaTransport{}

// dialRDMA makes the RPC-over-RDMA transport over the pure-Go iWARP
// provider. It connects on the first call.
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
	t := rpcrdma.NewTransport(o.addr(), rpcrdma.Config{
		Provider:         &iwarp.Provider{},
		Version:          vers,
		XChars:           true,
		AcceptInvalidate: true,
		DialTimeout:      o.Timeo,
		MemoryBytes:      o.RDMAMem,
		Tracer:           tr,
	})
	return rdmaTransport{t}, nil
}

// buffersOf returns the registered memory of an RDMA transport for the
// FUSE layer's READ and WRITE buffers, or nil (TCP: ordinary memory).
func buffersOf(t oncrpc.Transport) fuse.BufferPool {
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
	}
	if s.PeerAnnounced {
		m["peer rbsize"] = s.Peer.RBSize
		m["peer reqreminv"] = s.Peer.ReqRemInv
		m["peer brs"] = s.Peer.BRS
	}
	return m
}
