package verbs

import (
	"errors"
	"sync"
	"testing"
)

// TestPlaceExcludesInvalidate: Place checks the access like Begin, counts
// what it placed (Placed), and never overlaps an invalidation: a region's
// placements racing with its invalidation (run with -race) either land
// before Invalidate returns or fail with ErrInvalidSTag, so the region's
// memory, overwritten after Invalidate returns, keeps the new bytes.
func TestPlaceExcludesInvalidate(t *testing.T) {
	pd := NewProtectionDomain()
	buf := make([]byte, 64)
	mr, err := pd.RegisterMemory(buf, AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	fill := func(b byte) func([]byte) (uint64, error) {
		return func(dst []byte) (uint64, error) {
			for i := range dst {
				dst[i] = b
			}
			return uint64(len(dst)), nil
		}
	}
	if err := pd.Place(mr.STag(), AccessRemoteRead, 0, 8, fill(1)); !errors.Is(err, ErrAccess) {
		t.Fatalf("place without the right: %v", err)
	}
	if err := pd.Place(mr.STag(), AccessRemoteWrite, 60, 8, fill(1)); !errors.Is(err, ErrBounds) {
		t.Fatalf("place out of bounds: %v", err)
	}
	if err := pd.Place(mr.STag(), AccessRemoteWrite, 0, 16, fill(1)); err != nil {
		t.Fatal(err)
	}
	if n, _ := mr.Placed(); n != 16 || buf[15] != 1 || buf[16] != 0 {
		t.Fatalf("placed %d, bytes %v", n, buf[:17])
	}
	// place's error is returned; what it reports placed still counts.
	boom := errors.New("boom")
	if err := pd.Place(mr.STag(), AccessRemoteWrite, 16, 8, func([]byte) (uint64, error) { return 0, boom }); err != boom {
		t.Fatalf("place's error: %v", err)
	}
	if n, _ := mr.Placed(); n != 16 {
		t.Fatalf("placed %d after a failed placement", n)
	}

	stag := mr.STag()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var failed error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := pd.Place(stag, AccessRemoteWrite, 0, 64, fill(2)); err != nil {
				failed = err
				return
			}
		}
	}()
	if err := mr.Deregister(); err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		buf[i] = 3 // races with any placement after Deregister returned
	}
	close(stop)
	wg.Wait()
	if failed != nil && !errors.Is(failed, ErrInvalidSTag) {
		t.Fatalf("placement after deregistration: %v, want ErrInvalidSTag", failed)
	}
	for i, b := range buf {
		if b != 3 {
			t.Fatalf("byte %d placed after Deregister returned", i)
		}
	}
}
