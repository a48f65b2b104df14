package fuse

import (
	"bytes"
	"testing"
)

func TestFileHandleTable(t *testing.T) {
	var h fileHandles
	h.put(7, []byte("seven"))
	if got := h.get(7); !bytes.Equal(got, []byte("seven")) {
		t.Fatalf("get(7) = %q", got)
	}
	// It survives one generation turnover, not two.
	for i := range uint64(fhTableSize) {
		h.put(1000+i, []byte{1})
	}
	if h.get(7) == nil {
		t.Errorf("handle of 7 lost after one turnover")
	}
	for i := range uint64(fhTableSize) {
		h.put(1<<40+i, []byte{2})
	}
	if h.get(7) != nil {
		t.Errorf("handle of 7 kept after two turnovers: the table is not bounded")
	}
	if n := len(h.cur) + len(h.old); n > 2*fhTableSize {
		t.Errorf("%d entries, want at most %d", n, 2*fhTableSize)
	}
}

func TestInoMapping(t *testing.T) {
	f := &FS{rootIno: 2}
	for _, id := range []uint64{1, 3, 1 << 40, ^uint64(0), ^uint64(0) - 1} {
		ino := f.ino(id)
		if ino == 1 || ino == ^uint64(0) {
			t.Errorf("fileid %#x: node ID %#x is reserved", id, ino)
		}
		if back := f.fileidOf(ino); back != id {
			t.Errorf("fileid %#x -> %#x -> %#x", id, ino, back)
		}
	}
	if f.ino(2) != 2 {
		t.Errorf("root fileid remapped")
	}
	if r := (&FS{rootIno: 1}); r.ino(1) != 1 {
		t.Errorf("root fileid 1 remapped")
	}
}
