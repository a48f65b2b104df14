package mrcache

import (
	"bytes"
	"testing"

	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// TestPoison: after Poison, every buffer the pool hands out, of any
// size, holds the marker where nobody wrote.
func TestPoison(t *testing.T) {
	p := New(iwarp.NewProtectionDomain(), 2*ChunkSize)
	defer p.Close()
	marker := []byte("POISON!!")
	if err := p.Poison(marker); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{MinBlock, 64 << 10, ChunkSize} {
		buf, err := p.Get(n)
		if err != nil {
			t.Fatal(err)
		}
		b := buf.Bytes()
		want := bytes.Repeat(marker, n/len(marker))
		if !bytes.Equal(b[:len(want)], want) {
			t.Errorf("Get(%d) after Poison: %q..., want the marker", n, b[:16])
		}
		if err := p.Put(buf); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Poison(nil); err == nil {
		t.Error("Poison with an empty marker: no error")
	}
}
