package fuse

import (
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/nfsclient"
)

// newDirNode is a directory node made by Mkdir: attributes at change c,
// and the server's word that it was empty then.
func newDirNode(c uint64, acdir time.Duration) *node {
	f := &FS{opts: Options{AcDirMin: acdir, AcDirMax: acdir, ListingTTL: time.Second}}
	a := nfsclient.Attr{Type: nfsclient.TypeDir, Change: c, FileID: 7}
	n := f.newNode([]byte{1}, &a)
	n.knowEmpty(&nfsclient.Made{Attr: a, Dir: nfsclient.DirChange{Empty: true}})
	return n
}

// solo is a change of n that overlapped no other.
func solo(n *node) change {
	ch := n.beginChange()
	n.endChange()
	return ch
}

func post(atomic bool, before, after, attr uint64) *nfsclient.DirChange {
	return &nfsclient.DirChange{Atomic: atomic, Before: before, After: after,
		Attr: nfsclient.Attr{Type: nfsclient.TypeDir, Change: attr, FileID: 7}, AttrOK: true}
}

func TestListingKnowledge(t *testing.T) {
	n := newDirNode(10, time.Hour)
	if !n.knownAbsent("a") {
		t.Fatal("a new empty directory: a is not known absent")
	}
	// Our own create, atomic and starting from the known change: the
	// listing moves forward with the name in it.
	n.dirChanged("a", true, post(true, 10, 11, 11), solo(n))
	if n.knownAbsent("a") || !n.knownAbsent("b") {
		t.Fatalf("after creating a: a absent %v, b absent %v", n.knownAbsent("a"), n.knownAbsent("b"))
	}
	n.dirChanged("a", false, post(true, 11, 12, 12), solo(n))
	if !n.knownAbsent("a") {
		t.Fatal("after removing a: a is not known absent")
	}

	for _, tc := range []struct {
		name string
		dc   *nfsclient.DirChange
	}{
		{"not atomic (ganesha)", post(false, 12, 13, 13)},
		{"another change before ours", post(true, 99, 100, 100)},
		{"another change after ours", post(true, 12, 13, 14)},
		{"no post-op attributes", &nfsclient.DirChange{Atomic: true, Before: 12, After: 13}},
	} {
		n := newDirNode(12, time.Hour)
		n.dirChanged("x", true, tc.dc, solo(n))
		if n.knownAbsent("b") {
			t.Errorf("%s: the listing was kept", tc.name)
		}
	}

	// A listing read back in the COMPOUND, after its GETATTR, replaces
	// the knowledge whatever change_info4 says.
	n = newDirNode(40, time.Hour)
	dc := post(false, 40, 41, 41)
	dc.Listed, dc.Names = true, []string{"a", "x"}
	n.dirChanged("x", true, dc, solo(n))
	if n.knownAbsent("a") || n.knownAbsent("x") || !n.knownAbsent("b") {
		t.Error("a listed create: the listing is not the one read")
	}
	n.setAttrListed(&nfsclient.Attr{Type: nfsclient.TypeDir, Change: 42, FileID: 7}, []string{"a"}, true, solo(n))
	if !n.knownAbsent("x") || n.knownAbsent("a") {
		t.Error("a listed SETATTR: the listing is not the one read")
	}
	n.setAttrListed(&nfsclient.Attr{Type: nfsclient.TypeDir, Change: 43, FileID: 7}, nil, false, solo(n))
	if n.knownAbsent("x") {
		t.Error("a SETATTR not listed kept the listing")
	}

	// Overlapping changes of one directory may report in any order:
	// neither carries the listing forward.
	n = newDirNode(50, time.Hour)
	ch1, ch2 := n.beginChange(), n.beginChange()
	newer := post(false, 51, 52, 52)
	newer.Listed, newer.Names = true, []string{"x", "y"}
	older := post(false, 50, 51, 51)
	older.Listed, older.Names = true, []string{"x"}
	n.dirChanged("y", true, newer, ch2)
	n.dirChanged("x", true, older, ch1) // arrives last
	n.endChange()
	n.endChange()
	if n.knownAbsent("y") || n.knownAbsent("b") {
		t.Error("overlapping creates: the older listing answered")
	}

	// Attributes from anywhere else that show another change attribute
	// drop the listing.
	n = newDirNode(20, time.Hour)
	n.setAttr(&nfsclient.Attr{Type: nfsclient.TypeDir, Change: 21, FileID: 7})
	if n.knownAbsent("b") {
		t.Error("a GETATTR with a new change attribute kept the listing")
	}

	// A listing last confirmed longer ago than ListingTTL answers
	// nothing, though the attributes are still fresh.
	n = newDirNode(25, time.Hour)
	n.mu.Lock()
	n.attrTime = n.attrTime.Add(-2 * time.Second)
	n.mu.Unlock()
	if n.knownAbsent("b") {
		t.Error("a listing older than ListingTTL answered")
	}

	// Stale attributes answer nothing: with actimeo=0 the server is
	// always asked.
	n = newDirNode(30, 0)
	if n.knownAbsent("b") {
		t.Error("with no attribute caching, the listing answered")
	}
}
