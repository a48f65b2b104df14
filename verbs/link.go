package verbs

import (
	"context"

	"github.com/rdmafs/rdmafs/verbs/internal/spi"
)

// The provider side of domains and regions is reachable only through
// verbs/internal/spi, which providers import and consumers cannot.
func init() {
	spi.Set(spi.Link[*MemoryRegion, *ProtectionDomain, Access]{
		NewDomain:        newDomain,
		HookOf:           func(pd *ProtectionDomain) registrationHook { return pd.hook },
		InvalidateRemote: (*ProtectionDomain).invalidateRemote,
		InvalidateNow:    (*MemoryRegion).invalidateNow,
		Quiesce:          func(ctx context.Context, mr *MemoryRegion) error { return mr.quiesce(ctx) },
		Local:            (*MemoryRegion).resolveLocal,
		Bytes:            func(mr *MemoryRegion) []byte { return mr.buf },
		Access:           func(mr *MemoryRegion) Access { return mr.access },
		STag:             func(mr *MemoryRegion) uint32 { return mr.stag },
		Parent:           func(mr *MemoryRegion) *MemoryRegion { return mr.parent },
		SetData:          (*MemoryRegion).setHookData,
		Data:             (*MemoryRegion).hookDataOf,
	})
}

// setHookData attaches the provider's own record of the region, nil to
// drop it (spi.Link.SetData).
func (mr *MemoryRegion) setHookData(v any) {
	if v == nil {
		mr.hookData.Store(nil)
		return
	}
	mr.hookData.Store(&v)
}

// hookDataOf returns what setHookData attached last, nil if nothing.
func (mr *MemoryRegion) hookDataOf() any {
	if p := mr.hookData.Load(); p != nil {
		return *p
	}
	return nil
}
