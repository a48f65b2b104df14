package fuse

import (
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/nfsclient"
)

func newDirNode(c uint64, acdir time.Duration) *node {
	f := &FS{opts: Options{AcDirMin: acdir, AcDirMax: acdir}}
	return f.newNode([]byte{1}, &nfsclient.Attr{Type: nfsclient.TypeDir, Change: c, FileID: 7})
}

// fresh reports whether n's cached attributes would answer a GETATTR,
// and their change attribute.
func fresh(n *node) (bool, uint64) {
	ok := n.postOpFresh()
	n.mu.Lock()
	defer n.mu.Unlock()
	return ok, n.attr.Change
}

// solo is a change of n that overlapped no other.
func solo(n *node) change {
	ch := n.beginChange()
	n.endChange()
	return ch
}

func post(after uint64) *nfsclient.DirChange {
	return &nfsclient.DirChange{Before: after - 1, After: after,
		Attr: nfsclient.Attr{Type: nfsclient.TypeDir, Change: after, FileID: 7}, AttrOK: true}
}

// TestDirAttrCache covers when a directory's GETATTR is answered from the
// attributes its last change returned.
func TestDirAttrCache(t *testing.T) {
	n := newDirNode(10, time.Hour)
	n.dirChanged(post(11), solo(n))
	if ok, c := fresh(n); !ok || c != 11 {
		t.Errorf("after a change with post-op attributes: fresh %v, change %d; want fresh at 11", ok, c)
	}

	n.dirChanged(&nfsclient.DirChange{Before: 11, After: 12}, solo(n))
	if ok, _ := fresh(n); ok {
		t.Error("a change without post-op attributes left the cache fresh")
	}

	// Overlapping changes of one directory may report in any order:
	// the attributes applied last may be the older ones.
	n = newDirNode(20, time.Hour)
	ch1, ch2 := n.beginChange(), n.beginChange()
	n.dirChanged(post(22), ch2)
	n.dirChanged(post(21), ch1) // arrives last
	n.endChange()
	n.endChange()
	if ok, c := fresh(n); ok {
		t.Errorf("overlapping changes: the cache answers with change %d", c)
	}
	// The next change alone makes it fresh again.
	n.dirChanged(post(23), solo(n))
	if ok, c := fresh(n); !ok || c != 23 {
		t.Errorf("a change after the overlap: fresh %v, change %d; want fresh at 23", ok, c)
	}

	n.invalidateAttr()
	if ok, _ := fresh(n); ok {
		t.Error("invalidated attributes are fresh")
	}

	// Attributes from a LOOKUP or READDIR (which may have started
	// before the change) are not post-op attributes.
	n.dirChanged(post(24), solo(n))
	n.setAttr(&nfsclient.Attr{Type: nfsclient.TypeDir, Change: 23, FileID: 7})
	if ok, _ := fresh(n); ok {
		t.Error("attributes from elsewhere after the change answer")
	}
	if n := newDirNode(40, time.Hour); func() bool { ok, _ := fresh(n); return ok }() {
		t.Error("a new node's attributes (from a LOOKUP) answer")
	}

	// With no attribute caching (actimeo=0) nothing is answered.
	n = newDirNode(30, 0)
	n.dirChanged(post(31), solo(n))
	if ok, _ := fresh(n); ok {
		t.Error("with no attribute caching, the attributes are fresh")
	}
}
