package mrcache

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// deregHook is a registration hook (as a hardware provider has) whose
// deregistrations of the regions in bad fail, as a failing ibv_dereg_mr
// does: the key stays live on the device.
type deregHook struct {
	mu   sync.Mutex
	next uint32
	bad  map[*verbs.MemoryRegion]bool
}

func (h *deregHook) Register(mr *verbs.MemoryRegion) (uint32, error) {
	if mr.IsFast() {
		return 0, nil
	}
	return h.Reregister(mr)
}

func (h *deregHook) Reregister(mr *verbs.MemoryRegion) (uint32, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next++
	return h.next << 8, nil
}

func (h *deregHook) drop(mr *verbs.MemoryRegion) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.bad[mr] {
		return errors.New("injected ibv_dereg_mr failure")
	}
	return nil
}

func (h *deregHook) Invalidate(mr *verbs.MemoryRegion) error { return h.drop(mr) }
func (h *deregHook) Deregister(mr *verbs.MemoryRegion) error { return h.drop(mr) }

// TestCloseKeepsUnderegisteredMemory: memory whose deregistration failed
// may still be reached by the device, so the pool never unmaps it, even
// once closed with every buffer back (RFC 8166 s4.5.4: registered memory
// that cannot be protected is never reused); it is reported as
// quarantined. A chunk that deregisters is unmapped as before.
func TestCloseKeepsUnderegisteredMemory(t *testing.T) {
	h := &deregHook{bad: make(map[*verbs.MemoryRegion]bool)}
	p := New(iwarp.NewProtectionDomainWithHook(h), 2*ChunkSize)
	a, err := p.GetWait(context.Background(), ChunkSize)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.GetWait(context.Background(), ChunkSize)
	if err != nil {
		t.Fatal(err)
	}
	amem := a.Bytes()
	for i := range amem {
		amem[i] = 1
	}
	sge, err := a.SGE(0, len(amem))
	if err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	h.bad[sge.MR] = true
	h.mu.Unlock()
	p.Close()
	for _, buf := range []*Buffer{b, a} {
		if err := p.Put(buf); err != nil {
			t.Fatal(err)
		}
	}
	st := p.Stats()
	if st.QuarantinedBytes != ChunkSize || st.Chunks != 1 {
		t.Fatalf("after a failed deregistration: %d chunks mapped, %d bytes quarantined; want 1 chunk, %d bytes",
			st.Chunks, st.QuarantinedBytes, ChunkSize)
	}
	// Still mapped: reading it does not fault.
	for i, v := range amem {
		if v != 1 {
			t.Fatalf("byte %d of the quarantined chunk is %d", i, v)
		}
	}
}
