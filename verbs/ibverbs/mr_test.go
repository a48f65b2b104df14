//go:build cgo && linux && !noibverbs

package ibverbs

import (
	"context"
	"errors"
	"testing"

	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/mrcache/mrcachetest"
	"github.com/rdmafs/rdmafs/verbs"
)

// TestDeregFailureKeepsKey: when ibv_dereg_mr fails the key stays live on
// the device, so the registration is not forgotten: a retried
// invalidation tries the device again and fails again instead of
// reporting success, the region stays valid in the domain (the transport
// then quarantines the memory and closes the connection, RFC 8166
// s4.5.4), and once the device lets go the retry succeeds.
func TestDeregFailureKeepsKey(t *testing.T) {
	dev := newFakeDevice()
	pd := link.NewDomain(newHook(nil, dev))
	pool := mrcache.New(pd, mrcache.ChunkSize)
	defer pool.Close()
	buf, err := pool.Get(8192)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := mrcachetest.Expose(buf, 0, 8192, verbs.AccessRemoteWrite|verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if n := dev.count(); n != 2 {
		t.Fatalf("%d device registrations, want the chunk and the exposure", n)
	}
	dev.mu.Lock()
	dev.failDereg = true
	dev.mu.Unlock()
	for i := range 2 {
		if err := mrcachetest.Invalidate(context.Background(), reg); err == nil {
			t.Fatalf("invalidation %d reported success while the key is still on the device", i+1)
		}
	}
	if !reg.MR().Valid() || !dev.usable(reg.STag) || pd.LiveRemoteRegions() != 1 {
		t.Fatalf("after failed deregistrations: region valid %v, key on device %v, %d live remote regions; want the key kept",
			reg.MR().Valid(), dev.usable(reg.STag), pd.LiveRemoteRegions())
	}
	dev.mu.Lock()
	dev.failDereg = false
	dev.mu.Unlock()
	if err := mrcachetest.Invalidate(context.Background(), reg); err != nil {
		t.Fatal(err)
	}
	if dev.usable(reg.STag) || dev.count() != 1 || pd.LiveRemoteRegions() != 0 {
		t.Fatalf("after the deregistration worked: key on device %v, %d device registrations, %d live remote regions",
			dev.usable(reg.STag), dev.count(), pd.LiveRemoteRegions())
	}
	if err := pool.Put(buf); err != nil {
		t.Fatal(err)
	}
}

// TestSGEsOfThisDomainOnly: the data path converts SGEs from the record
// each region carries (no lock shared by the domain's queue pairs), and
// still accepts only live registered memory of its own domain: a region
// of another domain on the same device, a fast-registration region and a
// deregistered region are refused, as the device would refuse their
// lkeys.
func TestSGEsOfThisDomainOnly(t *testing.T) {
	dev := newFakeDevice()
	h := newHook(nil, dev)
	pool := mrcache.New(link.NewDomain(h), mrcache.ChunkSize)
	defer pool.Close()
	other := mrcache.New(link.NewDomain(newHook(nil, dev)), mrcache.ChunkSize)
	defer other.Close()
	mine, err := pool.Get(4096)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := other.Get(4096)
	if err != nil {
		t.Fatal(err)
	}
	sge, _ := mine.SGE(0, 4096)
	foreign, _ := theirs.SGE(0, 4096)
	addr, lkey, err := h.sge(sge, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatalf("SGE of this domain: %v", err)
	}
	if r := h.registration(sge.MR); r == nil || lkey != r.lkey || addr != uint64(r.addr)+sge.Offset {
		t.Fatalf("SGE converted to lkey %#x addr %#x; registration %+v", lkey, addr, r)
	}
	if _, _, err := h.sge(foreign, verbs.AccessLocalWrite); !errors.Is(err, verbs.ErrInvalidWR) {
		t.Fatalf("SGE of another domain: %v, want ErrInvalidWR", err)
	}
	reg, err := mrcachetest.Expose(mine, 0, 4096, verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.sge(verbs.SGE{MR: reg.MR(), Length: 16}, 0); !errors.Is(err, verbs.ErrInvalidWR) {
		t.Fatalf("SGE of a fast-registration region: %v, want ErrInvalidWR", err)
	}
	if err := mrcachetest.Invalidate(context.Background(), reg); err != nil {
		t.Fatal(err)
	}
	if err := sge.MR.Deregister(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.sge(sge, verbs.AccessLocalWrite); !errors.Is(err, verbs.ErrInvalidWR) {
		t.Fatalf("SGE of a deregistered region: %v, want ErrInvalidWR", err)
	}
}
