package iwarp

// Tests of the STag table standing in for hardware (DeviceStandIn).

import (
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

// reuseHook hands out STags like hardware does: the lowest free index,
// reused as soon as a region is invalidated.
type reuseHook struct {
	used map[uint32]bool
	of   map[*verbs.MemoryRegion]uint32
	key  uint32
}

func (h *reuseHook) take(mr *verbs.MemoryRegion) uint32 {
	for i := uint32(1); ; i++ {
		if !h.used[i] {
			h.used[i] = true
			h.key++
			h.of[mr] = i
			return i<<8 | h.key&0xff
		}
	}
}

func (h *reuseHook) drop(mr *verbs.MemoryRegion) {
	if i, ok := h.of[mr]; ok {
		delete(h.used, i)
		delete(h.of, mr)
	}
}

func (h *reuseHook) Register(mr *verbs.MemoryRegion) (uint32, error) {
	if mr.IsFast() {
		return 0, nil
	}
	return h.take(mr), nil
}
func (h *reuseHook) Reregister(mr *verbs.MemoryRegion) (uint32, error) {
	h.drop(mr)
	return h.take(mr), nil
}
func (h *reuseHook) Invalidate(mr *verbs.MemoryRegion) error  { h.drop(mr); return nil }
func (h *reuseHook) Deregister(mr *verbs.MemoryRegion) error  { h.drop(mr); return nil }
func (h *reuseHook) RemoteAddr(mr *verbs.MemoryRegion) uint64 { return 0x1000 }

// TestHookReusedIndexes: hardware reuses the STag index of an invalidated
// region; the domain follows, and fast regions without a key yet coexist.
func TestHookReusedIndexes(t *testing.T) {
	h := &reuseHook{used: map[uint32]bool{}, of: map[*verbs.MemoryRegion]uint32{}}
	pd := NewProtectionDomainWithHook(h)
	if TableOf(pd).inner != DeviceStandIn(h) {
		t.Fatal("TableOf: inner is not the stand-in")
	}
	slab, err := pd.RegisterMemory(make([]byte, 8192), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	a, err := pd.AllocFastReg()
	if err != nil {
		t.Fatal(err)
	}
	b, err := pd.AllocFastReg()
	if err != nil {
		t.Fatalf("second unbound fast region: %v", err)
	}
	sa, err := a.FastRegister(slab, 0, 100, verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	if a.RemoteAddr() != 0x1000 {
		t.Fatalf("RemoteAddr = %#x", a.RemoteAddr())
	}
	if err := a.Invalidate(); err != nil {
		t.Fatal(err)
	}
	sb, err := b.FastRegister(slab, 100, 100, verbs.AccessRemoteRead)
	if err != nil {
		t.Fatalf("bind on a reused index: %v", err)
	}
	if sb>>8 != sa>>8 {
		t.Fatalf("hook did not reuse the index: %#x %#x", sa, sb)
	}
	if _, err := TableOf(pd).Resolve(sb, verbs.AccessRemoteRead, 0, 100); err != nil {
		t.Fatalf("resolve new holder: %v", err)
	}
	if _, err := TableOf(pd).Resolve(sa, verbs.AccessRemoteWrite, 0, 100); err == nil {
		t.Fatal("stale STag resolved")
	}
	if _, err := a.FastRegister(slab, 0, 10, verbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	for _, mr := range []*verbs.MemoryRegion{a, b, slab} {
		if err := mr.Deregister(); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(TableOf(pd).regions); n != 0 {
		t.Fatalf("%d regions left indexed", n)
	}
}
