package rpcrdma

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// failingHook is a registration hook (as a hardware provider has) whose
// invalidations of fast-registration regions fail on demand: a LOCAL_INV
// work request that completes in error.
type failingHook struct {
	mu    sync.Mutex
	next  uint32
	stags map[*verbs.MemoryRegion]uint32
	fail  atomic.Bool
}

func (h *failingHook) Register(mr *verbs.MemoryRegion) (uint32, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next++
	h.stags[mr] = h.next<<8 | 1
	return h.stags[mr], nil
}

func (h *failingHook) Reregister(mr *verbs.MemoryRegion) (uint32, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.stags[mr]
	h.stags[mr] = old&^0xff | (old+1)&0xff
	return h.stags[mr], nil
}

func (h *failingHook) Invalidate(mr *verbs.MemoryRegion) error {
	if h.fail.Load() && mr.IsFast() {
		return errors.New("injected LOCAL_INV failure")
	}
	return nil
}

func (h *failingHook) Deregister(mr *verbs.MemoryRegion) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.stags, mr)
	return nil
}

// hookedProvider gives the transport a protection domain with a hook.
type hookedProvider struct {
	verbs.Provider
	pd *verbs.ProtectionDomain
}

func (p hookedProvider) NewProtectionDomain() *verbs.ProtectionDomain { return p.pd }

// TestHostileInvalidationFailure: when the call's regions cannot be
// invalidated after its reply came, the connection is closed before the
// call completes, the call fails (to be retransmitted) instead of
// delivering a reply whose memory the peer may still reach, that memory
// is never reused, and the transport refuses further calls: the region
// stays valid in a protection domain that outlives connections (RFC 8166
// s4.5.4).
func TestHostileInvalidationFailure(t *testing.T) {
	fp := newFakePeer(t, peerOpts{Credits: 4})
	hook := &failingHook{stags: make(map[*verbs.MemoryRegion]uint32)}
	tr := fp.transport(Config{Version: Version1, Provider: hookedProvider{fp.provider(), iwarp.NewProtectionDomainWithHook(hook)}})
	pc := warmUp(t, fp, tr)
	ec := newExposedCall(t, tr, 95)
	ch := goRoundTrip(fp.ctx, tr, ec.call)
	m := pc.recvCall()
	tr.mu.Lock()
	qp := tr.conn.qp
	tr.mu.Unlock()
	hook.fail.Store(true)
	h := pc.replyHeader(m)
	h.Writes[0][0].Length = 16
	if err := pc.write(h.Writes[0][0].Handle, h.Writes[0][0].Offset, pattern(16)); err != nil {
		t.Fatal(err)
	}
	pc.replyWith(m, h, be32(16))
	r := fp.wait(ch)
	if !errors.Is(r.err, oncrpc.ErrConnection) || r.rep != nil {
		t.Fatalf("call returned %v, %v after its regions could not be invalidated; want a connection error and no reply", r.rep, r.err)
	}
	select {
	case <-qp.Done():
	default:
		t.Fatal("the call completed before its connection was closed")
	}
	pc.waitClosed()
	if st := tr.Stats(); st.QuarantinedBytes == 0 {
		t.Fatal("the transport buffers of the call went back to the pool")
	}
	if _, err := tr.RoundTrip(fp.ctx, &oncrpc.Call{XID: 96, Head: mkCall(96, procEcho, be32(0)), MaxReplySize: 128}); !errors.Is(err, ErrExposed) {
		t.Fatalf("next call: %v, want ErrExposed", err)
	}
	if st := tr.Stats(); st.Connects != 1 {
		t.Fatalf("%d connections: the transport dialled again with a region exposed", st.Connects)
	}
}
