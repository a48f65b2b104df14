//go:build cgo && linux && !noibverbs

package ibverbs

import (
	"context"
	"testing"

	"github.com/rdmafs/rdmafs/mrcache"
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
	pd := verbs.NewProtectionDomainWithHook(newHook(nil, dev))
	pool := mrcache.New(pd, mrcache.ChunkSize)
	defer pool.Close()
	buf, err := pool.Get(8192)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := pool.Expose(buf, verbs.AccessRemoteWrite|verbs.AccessLocalWrite)
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
		if err := reg.Invalidate(context.Background()); err == nil {
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
	if err := reg.Invalidate(context.Background()); err != nil {
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
