package mrcache_test

import (
	"errors"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/mrcache/mrcachetest"
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// TestBufferLifetime: a lent Buffer exposes exactly the part of itself
// it is asked to, and nothing outside it; after Release it can be
// neither exposed nor released again, and its memory is free.
func TestBufferLifetime(t *testing.T) {
	pd := iwarp.NewProtectionDomain()
	p := mrcache.New(pd, mrcache.ChunkSize)
	b, err := p.Get(3 * mrcache.MinBlock)
	if err != nil {
		t.Fatal(err)
	}
	if b.Pool() != p || len(b.Bytes()) != 3*mrcache.MinBlock {
		t.Fatalf("Get(%d): %d bytes", 3*mrcache.MinBlock, len(b.Bytes()))
	}
	if st := p.Stats(); st.BytesInUse != 4*mrcache.MinBlock {
		t.Fatalf("in use after Get: %d bytes, want a %d-byte block", st.BytesInUse, 4*mrcache.MinBlock)
	}
	mem := b.Bytes()
	mem[100] = 0x5a
	reg, err := mrcachetest.Expose(b, 100, 1000, verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	got, err := iwarp.TableOf(pd).Resolve(reg.STag, verbs.AccessRemoteRead, reg.Offset, 1000)
	if err != nil || &got[0] != &mem[100] {
		t.Fatalf("the exposure does not resolve to the bytes asked for: %v", err)
	}
	if _, err := iwarp.TableOf(pd).Resolve(reg.STag, verbs.AccessRemoteRead, reg.Offset, 1001); !errors.Is(err, verbs.ErrBounds) {
		t.Fatalf("a byte past the exposure: %v", err)
	}
	if err := mrcachetest.Invalidate(t.Context(), reg); err != nil {
		t.Fatal(err)
	}

	// Bytes outside the buffer: before it, running past its end (the
	// block is 4 MinBlocks: the byte after mem is slab memory), past it.
	for name, at := range map[string][2]int{
		"before":       {-1, 10},
		"past the end": {len(mem) - 10, 11},
		"after":        {len(mem), 1},
	} {
		if _, err := mrcachetest.Expose(b, at[0], at[1], verbs.AccessRemoteRead); !errors.Is(err, mrcache.ErrNotRegistered) {
			t.Errorf("Expose %s the buffer: %v, want mrcache.ErrNotRegistered", name, err)
		}
	}
	if _, err := mrcachetest.Expose(b, 0, 0, verbs.AccessRemoteRead); err == nil {
		t.Error("Expose of nothing succeeded")
	}
	other, err := p.Get(mrcache.MinBlock)
	if err != nil {
		t.Fatal(err)
	}

	if err := b.Release(); err != nil {
		t.Fatal(err)
	}
	if b.Bytes() != nil {
		t.Error("Bytes after Release")
	}
	if _, err := mrcachetest.Expose(b, 0, 10, verbs.AccessRemoteRead); !errors.Is(err, mrcache.ErrNotRegistered) {
		t.Errorf("Expose after Release: %v", err)
	}
	if err := b.Release(); !errors.Is(err, mrcache.ErrNotRegistered) {
		t.Errorf("second Release: %v", err)
	}
	if err := p.Put(other); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.BytesInUse != 0 || st.LiveExposures != 0 {
		t.Fatalf("after the releases: %d bytes in use, %d exposures live", st.BytesInUse, st.LiveExposures)
	}
}

// TestGetIsTheUpperShare: Get draws on the upper layer's share of the
// budget and fails without waiting when it is used up.
func TestGetIsTheUpperShare(t *testing.T) {
	p := mrcache.New(iwarp.NewProtectionDomain(), mrcache.ChunkSize)
	var held []*mrcache.Buffer
	for range mrcache.UpperShareNum {
		b, err := p.Get(mrcache.ChunkSize / mrcache.UpperShareDen)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, b)
	}
	if _, err := p.Get(mrcache.MinBlock); !errors.Is(err, mrcache.ErrNoMemory) {
		t.Fatalf("Get beyond the upper share: %v, want mrcache.ErrNoMemory", err)
	}
	for _, b := range held {
		if err := b.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Get(mrcache.MinBlock); err != nil {
		t.Fatalf("Get after the releases: %v", err)
	}
}
