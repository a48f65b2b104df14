//go:build !cgo || !linux || noibverbs

package ibverbs

import (
	"context"
	"fmt"

	"github.com/rdmafs/rdmafs/verbs"
)

// Provider is the rdma-core provider; in this build (no cgo) it cannot be
// opened.
type Provider struct{}

// Open reports ErrUnsupported: the binary was built without cgo.
func Open(name string) (*Provider, error) {
	return nil, fmt.Errorf("open %q: %w", name, ErrUnsupported)
}

// Close does nothing.
func (p *Provider) Close() error { return nil }

// Device returns nothing.
func (p *Provider) Device() DeviceInfo { return DeviceInfo{} }

// Port returns 0.
func (p *Provider) Port() int { return 0 }

// MaxSGE returns 0.
func (p *Provider) MaxSGE() int { return 0 }

// MaxReadSGE returns 0.
func (p *Provider) MaxReadSGE() int { return 0 }

// RemoteInvalidate reports false.
func (p *Provider) RemoteInvalidate() bool { return false }

// String names the missing provider.
func (p *Provider) String() string { return "ibverbs (not built)" }

// NewProtectionDomain returns a software domain.
func (p *Provider) NewProtectionDomain() *verbs.ProtectionDomain { return verbs.NewProtectionDomain() }

// Dial reports ErrUnsupported.
func (p *Provider) Dial(ctx context.Context, addr string, params *verbs.ConnParams) (verbs.QueuePair, error) {
	return nil, ErrUnsupported
}

// Listen reports ErrUnsupported.
func (p *Provider) Listen(addr string, params *verbs.ConnParams) (verbs.Listener, error) {
	return nil, ErrUnsupported
}

// WindowBinds returns 0: without rdma-core no domain uses memory windows.
func WindowBinds(pd *verbs.ProtectionDomain) uint64 { return 0 }
