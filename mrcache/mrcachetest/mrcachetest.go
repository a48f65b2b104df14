// Package mrcachetest exposes mrcache buffers for tests that have no
// queue pair to post registration work requests on (a provider's own
// tests, a domain's bookkeeping): it carries the work requests out at
// once with the domain's synchronous registration, as the providers do
// when such a request is posted (verbs/iwarp and verbs/ibverbs
// postRegistration). A transport posts them (see mrcache.Registration).
package mrcachetest

import (
	"context"
	"fmt"

	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/verbs"
)

// Expose is b.Expose with its fast-register carried out.
func Expose(b *mrcache.Buffer, off, n int, access verbs.Access) (*mrcache.Registration, error) {
	r, err := b.Expose(off, n, access)
	if err != nil {
		return nil, err
	}
	bd := r.FastRegisterWR(0).Binding
	if _, err := bd.MR.FastRegister(bd.Target, bd.Offset, bd.Length, bd.Access); err != nil {
		r.Abandon()
		return nil, fmt.Errorf("mrcachetest: fast register: %w", err)
	}
	r.Posted()
	return r, nil
}

// InvalidatePlaced carries out r's local invalidation, waiting for the
// accesses in progress until ctx ends (if it ends first, r stays live),
// and returns what mrcache.Registration.Invalidated does.
func InvalidatePlaced(ctx context.Context, r *mrcache.Registration) (placed int, ok bool, err error) {
	if !r.Live() {
		return 0, false, nil
	}
	if err := r.LocalInvalidateWR(0).Binding.MR.InvalidateContext(ctx); err != nil {
		return 0, false, fmt.Errorf("mrcachetest: invalidate STag %#08x: %w", r.STag, err)
	}
	placed, ok = r.Invalidated()
	return placed, ok, nil
}

// Invalidate is InvalidatePlaced without the count.
func Invalidate(ctx context.Context, r *mrcache.Registration) error {
	_, _, err := InvalidatePlaced(ctx, r)
	return err
}
