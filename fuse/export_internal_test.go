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

func TestHandleCacheCodec(t *testing.T) {
	root := []byte("root-fh")
	var a fileHandles
	a.put(5, []byte("five"))
	a.put(1<<63|1, []byte("big"))
	b := a.encode(root)
	var c fileHandles
	if err := c.decode(b, root); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(c.get(5), []byte("five")) || !bytes.Equal(c.get(1<<63|1), []byte("big")) {
		t.Errorf("decoded %v, want 5 and 1<<63|1", c.cur)
	}
	var d fileHandles
	if err := d.decode(b, []byte("other-root")); err == nil || d.get(5) != nil {
		t.Errorf("a cache of another export was loaded")
	}
	if err := d.decode(b[:len(b)-2], root); err == nil {
		t.Errorf("a truncated cache decoded without error")
	}
}

// FuzzHandleCache feeds the handle cache parser arbitrary files: it
// must not panic, and what it loads must be file handles within
// NFS4_FHSIZE.
func FuzzHandleCache(f *testing.F) {
	var h fileHandles
	h.put(9, []byte("nine"))
	f.Add(h.encode([]byte("r")))
	f.Add([]byte(handleCacheMagic))
	f.Add([]byte(handleCacheMagic + "\x01r\x09\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h fileHandles
		h.decode(b, []byte("r"))
		for _, fh := range h.cur {
			if len(fh) == 0 || len(fh) > maxFH {
				t.Fatalf("loaded a file handle of %d bytes", len(fh))
			}
		}
	})
}
