package main

import (
	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/nfs/dial"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
)

// rdmaProvider picks the verbs provider of the rdmadev option (package
// dial, which the transport is built by, decides).
func rdmaProvider(o *mountOptions) (verbs.Provider, string, bool, func() error, error) {
	return dial.Provider(o.RDMADev, "rdmadev=")
}

// buffersOf returns the registered memory of an RDMA transport for the
// FUSE layer's READ and WRITE buffers, or nil (TCP: ordinary memory).
func buffersOf(t oncrpc.Transport) fuse.BufferPool {
	if pool := dial.Slab(t); pool != nil {
		return slabBuffers{pool}
	}
	return nil
}

// slabBuffers lends the transport's slab to the FUSE layer.
type slabBuffers struct{ pool *mrcache.Pool }

func (s slabBuffers) Alloc(n int) (fuse.Buffer, error) {
	b, err := s.pool.Get(n)
	if err != nil {
		return nil, err
	}
	return b, nil
}
