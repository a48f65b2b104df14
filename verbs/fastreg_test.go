package verbs

import (
	"context"
	"testing"
	"time"
)

// blockingHook holds the binding of one region until release is closed,
// as a slow device call would.
type blockingHook struct {
	counterHook
	block   *MemoryRegion
	entered chan struct{}
	release chan struct{}
}

func (h *blockingHook) Reregister(mr *MemoryRegion) (uint32, error) {
	if mr == h.block {
		h.entered <- struct{}{}
		<-h.release
	}
	return h.counterHook.Reregister(mr)
}

// TestFastRegisterWithoutDomainLock: a fast registration's provider call
// (ibv_reg_mr per exposure on hardware) does not hold the domain's lock,
// so the domain's other users go on meanwhile: another region is bound,
// SGEs are checked, the domain is asked about its regions. The region
// being bound cannot be bound again or deregistered until it is done,
// and is valid only afterwards.
func TestFastRegisterWithoutDomainLock(t *testing.T) {
	h := &blockingHook{entered: make(chan struct{}, 1), release: make(chan struct{})}
	pd := newDomain(h)
	slab, err := pd.RegisterMemory(make([]byte, 8192), AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	slow, err := pd.AllocFastReg()
	if err != nil {
		t.Fatal(err)
	}
	h.block = slow
	done := make(chan error, 1)
	go func() {
		_, err := slow.FastRegister(slab, 0, 4096, AccessRemoteWrite|AccessLocalWrite)
		done <- err
	}()
	<-h.entered // the provider call is in progress

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	others := make(chan error, 1)
	go func() {
		if _, err := slab.resolveLocal(AccessLocalWrite, 0, 8192); err != nil {
			others <- err
			return
		}
		if n := pd.LiveRemoteRegions(); n != 0 {
			t.Errorf("%d live remote regions while the only exposure is being bound", n)
		}
		if _, err := slow.FastRegister(slab, 4096, 10, AccessRemoteRead); err == nil {
			t.Error("a second binding of the region being bound succeeded")
		}
		if err := slow.Deregister(); err == nil {
			t.Error("deregistration of the region being bound succeeded")
		}
		quick, err := pd.AllocFastReg()
		if err != nil {
			others <- err
			return
		}
		_, err = quick.FastRegister(slab, 4096, 100, AccessRemoteRead)
		others <- err
	}()
	select {
	case err := <-others:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the domain was held while a fast registration was in the provider")
	}
	if slow.Valid() {
		t.Fatal("the region is valid before its binding finished")
	}
	close(h.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !slow.Valid() || pd.LiveRemoteRegions() != 2 {
		t.Fatalf("after the bindings: valid %v, %d live remote regions, want 2", slow.Valid(), pd.LiveRemoteRegions())
	}
}
