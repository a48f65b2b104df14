package mrcache

import (
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

func TestReuseGetsFreshKey(t *testing.T) {
	pd := verbs.NewProtectionDomain()
	c := New(pd, 0)
	buf := make([]byte, 1<<20)
	r1, err := c.Register(buf, verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	s1 := r1.STag
	if pd.LiveRemoteRegions() != 1 {
		t.Fatalf("live regions %d", pd.LiveRemoteRegions())
	}
	r1.Invalidate()
	if pd.LiveRemoteRegions() != 0 {
		t.Fatal("region still live after Invalidate")
	}
	if _, err := pd.Resolve(s1, verbs.AccessRemoteWrite, 0, 1); err == nil {
		t.Fatal("invalidated STag still resolves")
	}
	r2, err := c.Register(buf[:4096], verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if r2.STag == s1 || r2.STag>>8 != s1>>8 {
		t.Fatalf("reuse STag %#x vs first %#x: want same region, new key", r2.STag, s1)
	}
	if _, err := pd.Resolve(s1, verbs.AccessRemoteRead, 0, 1); err == nil {
		t.Fatal("old STag matches the re-registered region")
	}
	r2.Invalidate()
	st := c.Stats()
	if st.Hits != 1 || st.Misses != 1 || st.Registrations != 1 || st.Invalidations != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestConcurrentUseOfOneBuffer(t *testing.T) {
	pd := verbs.NewProtectionDomain()
	c := New(pd, 0)
	buf := make([]byte, 8192)
	r1, _ := c.Register(buf, verbs.AccessRemoteWrite)
	r2, err := c.Register(buf, verbs.AccessRemoteWrite)
	if err != nil || r1.STag == r2.STag {
		t.Fatalf("second use: %v, stags %#x %#x", err, r1.STag, r2.STag)
	}
	r2.Invalidate()
	r1.Invalidate()
	if pd.LiveRemoteRegions() != 0 {
		t.Fatal("live regions left")
	}
}

func TestEviction(t *testing.T) {
	pd := verbs.NewProtectionDomain()
	c := New(pd, 3*4096)
	var bufs [][]byte
	for range 5 {
		b := make([]byte, 4096)
		bufs = append(bufs, b)
		r, err := c.Register(b, verbs.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		r.Invalidate()
	}
	st := c.Stats()
	if st.BytesRegistered > 3*4096 || st.Evictions != 2 || st.Regions != 3 {
		t.Fatalf("stats after 5 regions with room for 3: %+v", st)
	}
	// The most recent buffer is still cached, the oldest is not.
	r, _ := c.Register(bufs[4], verbs.AccessRemoteRead)
	r.Invalidate()
	r, _ = c.Register(bufs[0], verbs.AccessRemoteRead)
	r.Invalidate()
	if st := c.Stats(); st.Hits != 1 {
		t.Fatalf("hits %d, want 1", st.Hits)
	}
}

// BenchmarkFuseBufferReuse models go-fuse's buffer pool: a few buffers
// reused round robin for 1 MiB reads. It reports the hit rate.
func BenchmarkFuseBufferReuse(b *testing.B) {
	pd := verbs.NewProtectionDomain()
	c := New(pd, 0)
	pool := make([][]byte, 8)
	for i := range pool {
		pool[i] = make([]byte, 1<<20)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r, err := c.Register(pool[i%len(pool)], verbs.AccessRemoteWrite)
		if err != nil {
			b.Fatal(err)
		}
		r.Invalidate()
		i++
	}
	st := c.Stats()
	b.ReportMetric(float64(st.Hits)/float64(st.Hits+st.Misses)*100, "hit%")
}
