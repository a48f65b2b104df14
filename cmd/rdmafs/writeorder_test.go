package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestOverlappingWritesOrder writes a range, then an overlapping range,
// then somewhere else (which sends the second buffered write), and reads
// the overlap back: it must hold the second write's bytes. Buffered
// writes that go out as concurrent UNSTABLE WRITEs can reach the server
// in the other order (found by TestSoak).
func TestOverlappingWritesOrder(t *testing.T) {
	forEachTransport(t, func(t *testing.T, p peer) {
		mnt := mount(t, p)
		d := testDir(t, mnt)
		defer os.RemoveAll(d)
		f, err := os.OpenFile(filepath.Join(d, "f"), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		const n, rounds = 256 << 10, 50
		bad := 0
		for i := range rounds {
			a := bytes.Repeat([]byte{byte(2 * i)}, n)
			b := bytes.Repeat([]byte{byte(2*i + 1)}, n)
			if _, err := f.WriteAt(a, 0); err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(b, n/2); err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte{1}, 4*n); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, n/2)
			if _, err := f.ReadAt(got, n/2); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, b[:n/2]) {
				if bad++; bad <= 3 {
					k := 0
					for got[k] == b[k] {
						k++
					}
					t.Errorf("%s: round %d: byte %d holds %#x (the earlier write's), want the later write's %#x", p.name, i, n/2+k, got[k], b[k])
				}
			}
		}
		if bad > 0 {
			t.Errorf("%s: %d of %d rounds read the earlier of two overlapping writes", p.name, bad, rounds)
		}
	})
}
