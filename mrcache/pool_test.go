package mrcache_test

import (
	"context"
	"errors"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/mrcache/mrcachetest"
	"sync"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

func TestGetPutCoalesce(t *testing.T) {
	pd := iwarp.NewProtectionDomain()
	p := mrcache.New(pd, mrcache.ChunkSize)
	var bufs []*mrcache.Buffer
	// Fill the chunk with 4 KiB blocks, then free them all: the buddies
	// coalesce back into one chunk-sized block.
	for range mrcache.BlocksPerChunk * mrcache.UpperShareNum / mrcache.UpperShareDen {
		b, err := p.Get(1)
		if err != nil {
			t.Fatal(err)
		}
		if mem := b.Bytes(); len(mem) != 1 || cap(mem) != 1 {
			t.Fatalf("Get(1) returned len %d cap %d", len(mem), cap(mem))
		}
		bufs = append(bufs, b)
	}
	if _, err := p.Get(1); !errors.Is(err, mrcache.ErrNoMemory) {
		t.Fatalf("Get past the upper share: %v", err)
	}
	// The rest of the budget is there for call buffers.
	cb, err := p.GetWait(context.Background(), mrcache.MinBlock)
	if err != nil {
		t.Fatal(err)
	}
	bufs = append(bufs, cb)
	for _, b := range bufs {
		if err := p.Put(b); err != nil {
			t.Fatal(err)
		}
	}
	if s := p.Stats(); s.BytesInUse != 0 || s.Chunks != 1 {
		t.Fatalf("after freeing everything: %+v", s)
	}
	big, err := p.GetWait(context.Background(), mrcache.ChunkSize)
	if err != nil {
		t.Fatalf("whole chunk after coalescing: %v", err)
	}
	if err := p.Put(big); err != nil {
		t.Fatal(err)
	}
}

func TestPutRejectsForeignMemory(t *testing.T) {
	p := mrcache.New(iwarp.NewProtectionDomain(), 0)
	b, err := p.Get(8192)
	if err != nil {
		t.Fatal(err)
	}
	other := mrcache.New(iwarp.NewProtectionDomain(), 0)
	foreign, err := other.Get(8192)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Put(foreign); !errors.Is(err, mrcache.ErrNotRegistered) {
		t.Fatalf("Put of another pool's buffer: %v", err)
	}
	if err := p.Put(nil); !errors.Is(err, mrcache.ErrNotRegistered) {
		t.Fatalf("Put of nil: %v", err)
	}
	if err := other.Put(foreign); err != nil {
		t.Fatal(err)
	}
	if err := p.Put(b); err != nil {
		t.Fatal(err)
	}
	if err := p.Put(b); !errors.Is(err, mrcache.ErrNotRegistered) {
		t.Fatalf("double Put: %v", err)
	}
	if _, err := p.Get(mrcache.ChunkSize + 1); err == nil {
		t.Fatal("Get larger than a chunk succeeded")
	}
}

func TestGetWaitBlocksUntilPut(t *testing.T) {
	p := mrcache.New(iwarp.NewProtectionDomain(), mrcache.ChunkSize)
	all, err := p.GetWait(context.Background(), mrcache.ChunkSize)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := p.GetWait(short, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("GetWait with the budget used up: %v", err)
	}
	got := make(chan error)
	go func() {
		b, err := p.GetWait(context.Background(), 1)
		if err == nil {
			err = p.Put(b)
		}
		got <- err
	}()
	if err := p.Put(all); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestExposeExactly: an exposure grants the peer exactly the bytes of its
// buffer (RFC 8166 s8.1), nothing around them, and nothing after it is
// invalidated; the slab chunk itself grants no remote access.
func TestExposeExactly(t *testing.T) {
	pd := iwarp.NewProtectionDomain()
	p := mrcache.New(pd, 0)
	buf, err := p.Get(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	win := buf.Bytes()[4096 : 4096+1000]
	reg, err := mrcachetest.Expose(buf, 4096, 1000, verbs.AccessRemoteWrite|verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if reg.Len != 1000 || reg.Offset != 0 {
		t.Fatalf("registration %+v", reg)
	}
	got, err := iwarp.TableOf(pd).Resolve(reg.STag, verbs.AccessRemoteWrite, 0, 1000)
	if err != nil || &got[0] != &win[0] {
		t.Fatalf("the window: %v (same memory: %v)", err, err == nil && &got[0] == &win[0])
	}
	for _, tc := range []struct{ off, n uint64 }{{0, 1001}, {1000, 1}, {999, 2}} {
		if _, err := iwarp.TableOf(pd).Resolve(reg.STag, verbs.AccessRemoteWrite, tc.off, tc.n); !errors.Is(err, verbs.ErrBounds) {
			t.Errorf("[%d,+%d) of a 1000-byte exposure: %v", tc.off, tc.n, err)
		}
	}
	if _, err := iwarp.TableOf(pd).Resolve(reg.STag, verbs.AccessRemoteRead, 0, 1); !errors.Is(err, verbs.ErrAccess) {
		t.Errorf("read access to a write-only exposure: %v", err)
	}
	if pd.LiveRemoteRegions() != 1 {
		t.Fatalf("%d regions with remote access, want 1 (the slab chunk grants none)", pd.LiveRemoteRegions())
	}
	stag := reg.STag
	if err := mrcachetest.Invalidate(context.Background(), reg); err != nil {
		t.Fatal(err)
	}
	if _, err := iwarp.TableOf(pd).Resolve(stag, verbs.AccessRemoteWrite, 0, 1); !errors.Is(err, verbs.ErrInvalidSTag) {
		t.Fatalf("STag after invalidation: %v", err)
	}
	// The next exposure reuses the region under a new key: the old STag
	// stays dead.
	reg2, err := mrcachetest.Expose(buf, 0, 10, verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if reg2.STag == stag || reg2.STag>>8 != stag>>8 {
		t.Fatalf("reused region: STag %#x after %#x", reg2.STag, stag)
	}
	if _, err := iwarp.TableOf(pd).Resolve(stag, verbs.AccessRemoteRead, 0, 1); !errors.Is(err, verbs.ErrInvalidSTag) {
		t.Fatalf("old STag after reuse: %v", err)
	}
	if s := p.Stats(); s.Exposures != 2 || s.ExposureReuses != 1 || s.FastRegions != 1 || s.LiveExposures != 1 {
		t.Fatalf("stats %+v", s)
	}
	mrcachetest.Invalidate(context.Background(), reg2)
	if _, err := mrcachetest.Expose(buf, 64<<10-9, 10, verbs.AccessRemoteRead); !errors.Is(err, mrcache.ErrNotRegistered) {
		t.Fatalf("exposing past the buffer: %v", err)
	}
}

// TestInvalidateWaitsForPlacement: an invalidation does not return while
// the provider is still placing data into the exposed bytes.
func TestInvalidateWaitsForPlacement(t *testing.T) {
	pd := iwarp.NewProtectionDomain()
	p := mrcache.New(pd, 0)
	buf, _ := p.Get(4096)
	reg, err := mrcachetest.Expose(buf, 0, 4096, verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	_, mr, err := iwarp.TableOf(pd).Begin(reg.STag, verbs.AccessRemoteWrite, 0, 4096) // a placement starts
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := mrcachetest.Invalidate(short, reg); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("invalidate during a placement: %v", err)
	}
	if _, _, err := iwarp.TableOf(pd).Begin(reg.STag, verbs.AccessRemoteWrite, 0, 1); !errors.Is(err, verbs.ErrInvalidSTag) {
		t.Fatalf("a new placement after the invalidation started: %v", err)
	}
	mr.End() // the placement ends (as when the queue pair is closed)
	if err := mrcachetest.Invalidate(context.Background(), reg); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkFuseReadPath replays what the FUSE read path does with the
// pool: a READ buffer of varying size is taken from the slab, split into
// rsize slices that are exposed concurrently (one call each), invalidated
// and given back.
func BenchmarkFuseReadPath(b *testing.B) {
	pd := iwarp.NewProtectionDomain()
	p := mrcache.New(pd, 0)
	defer p.Close()
	sizes := []int{4 << 10, 128 << 10, 1 << 20, 300 << 10}
	const rsize = 124 << 10
	var wg sync.WaitGroup
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		n := sizes[i%len(sizes)]
		i++
		buf, err := p.Get(n)
		if err != nil {
			b.Fatal(err)
		}
		for off := 0; off < n; off += rsize {
			wg.Add(1)
			go func(off int) {
				defer wg.Done()
				reg, err := mrcachetest.Expose(buf, off, min(n, off+rsize)-off, verbs.AccessRemoteWrite|verbs.AccessLocalWrite)
				if err != nil {
					b.Error(err)
					return
				}
				mrcachetest.Invalidate(context.Background(), reg)
			}(off)
		}
		wg.Wait()
		p.Put(buf)
	}
	s := p.Stats()
	b.ReportMetric(100*s.ReuseRate(), "%reuse")
}

// TestExposeAllocationFree: exposing a lent buffer and invalidating the
// exposure allocates nothing once the pool is warm (the per-call path of
// every RDMA READ and WRITE into or from a FUSE buffer); taking a buffer
// and giving it back allocates its handle only, and nothing when the
// handle is recycled.
func TestExposeAllocationFree(t *testing.T) {
	p := mrcache.New(iwarp.NewProtectionDomain(), 0)
	if err := p.ReserveFastRegions(1); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b, err := p.Get(128 << 10) // maps the first chunk
	if err != nil {
		t.Fatal(err)
	}
	expose := func() {
		reg, err := mrcachetest.Expose(b, 0, 128<<10, verbs.AccessRemoteWrite|verbs.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		if err := mrcachetest.Invalidate(ctx, reg); err != nil {
			t.Fatal(err)
		}
	}
	if allocs := testing.AllocsPerRun(100, expose); allocs != 0 {
		t.Fatalf("%v allocations per Expose+Invalidate", allocs)
	}
	if err := p.Put(b); err != nil {
		t.Fatal(err)
	}
	lend := func() {
		b, err := p.GetWait(ctx, 128<<10)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Put(b); err != nil {
			t.Fatal(err)
		}
	}
	if allocs := testing.AllocsPerRun(100, lend); allocs > 1 {
		t.Fatalf("%v allocations per GetWait+Put, want the handle's only", allocs)
	}
	recycle := func() {
		b, err := p.GetWait(ctx, 128<<10)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Recycle(b); err != nil {
			t.Fatal(err)
		}
	}
	recycle() // the first handle to recycle
	if allocs := testing.AllocsPerRun(100, recycle); allocs != 0 {
		t.Fatalf("%v allocations per GetWait+Recycle", allocs)
	}
}
