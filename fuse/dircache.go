package fuse

import (
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/nfsclient"
)

// maxKnownNames bounds the names a directory's listing knowledge holds;
// a directory that grows past it is looked up on the server again.
const maxKnownNames = 4096

// maxListedNames is the largest known listing a create reads again
// when the server's change_info4 is not atomic (wantListing).
const maxListedNames = 64

// listing is what the client knows of a directory's entries: at change
// attribute change, the directory held exactly names. It comes from
// Mkdir (the new directory was empty, see nfsclient.DirChange.Empty) and
// is carried forward through the client's own changes of the directory
// when their change_info4 is atomic and starts from change (RFC 8881
// s3.3.12: before and after bracket exactly that operation), or read
// back in the changing COMPOUND after the directory's GETATTR
// (wantListing); anything else drops it.
type listing struct {
	change uint64
	names  map[string]struct{}
}

// attrFreshLocked reports whether n's attributes were read from the server no
// longer ago than their cache timeout. Caller holds n.mu.
func (n *node) attrFreshLocked(now time.Time) bool {
	return n.attrSet && n.acTimeout > 0 && now.Sub(n.attrTime) < n.acTimeout
}

// listingFreshLocked reports whether n's known listing may answer: it
// is at n's current change attribute, seen no longer ago than both the
// attribute timeout and ListingTTL. Caller holds n.mu.
func (n *node) listingFreshLocked(now time.Time) bool {
	l := n.known
	return l != nil && n.attrFreshLocked(now) && now.Sub(n.attrTime) < n.fsys.opts.ListingTTL &&
		n.attr.Change == l.change
}

// invalidateAttr makes the next Getattr of n ask the server.
func (n *node) invalidateAttr() {
	n.mu.Lock()
	n.attrTime = time.Time{}
	n.mu.Unlock()
}

// invalidateChild makes the next Getattr of the object the kernel knows
// as name in n ask the server.
func (n *node) invalidateChild(name string) {
	if ch := n.GetChild(name); ch != nil {
		if c, ok := ch.Operations().(*node); ok {
			c.invalidateAttr()
		}
	}
}

// cachedDirAttr reports whether a directory's Getattr can be answered
// from its cached attributes. Like the Linux client's nfs_getattr, which
// revalidates only when the attribute cache has expired or was marked
// invalid: the kernel asks again right after any change of the
// directory (fuse_dir_changed), but every change this client makes
// refreshes the cache with the post-op attributes of the same COMPOUND
// (dirChanged). Regular files keep asking: their size and times move
// with WRITEs that carry no attributes.
func (n *node) cachedDirAttr() bool {
	if n.StableAttr().Mode != syscall.S_IFDIR {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.attrFreshLocked(time.Now())
}

// knownAbsent reports whether name is certainly not in directory n: the
// listing of n is known at the change attribute n's fresh attributes
// carry, and name is not in it. This is the Linux client's negative
// dentry (nfs_neg_need_reval: a negative entry is trusted while the
// parent's change attribute, revalidated when its attribute cache
// expires, matches the one it was made under; nfs(5) lookupcache=all).
func (n *node) knownAbsent(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.listingFreshLocked(time.Now()) {
		return false
	}
	_, ok := n.known.names[name]
	return !ok
}

// knownChildDir returns the kernel's inode for name in n when a LOOKUP
// of it can be answered without the server: n's listing is fresh and
// has name, and name is a directory node whose attributes are fresh.
// The kernel looks a directory up again after a chmod of it
// (fuse_setattr: "Directory mode changed, may need to revalidate
// access"); the Linux client keeps such a dentry, valid while the
// parent's change attribute is unchanged (nfs_lookup_revalidate).
func (n *node) knownChildDir(name string) (*node, *fs.Inode) {
	n.mu.Lock()
	ok := n.listingFreshLocked(time.Now())
	if ok {
		_, ok = n.known.names[name]
	}
	n.mu.Unlock()
	if !ok {
		return nil, nil
	}
	ch := n.GetChild(name)
	if ch == nil || ch.StableAttr().Mode != syscall.S_IFDIR {
		return nil, nil
	}
	cn, isNode := ch.Operations().(*node)
	if !isNode || !cn.cachedDirAttr() {
		return nil, nil
	}
	return cn, ch
}

// change is one COMPOUND of this client that changes directory n, from
// beginChange to its end.
type change struct {
	seq   uint64
	alone bool // no other change of n was in flight when it began
}

// beginChange notes a COMPOUND that changes directory n (or n itself)
// going out; endChange, deferred, notes its end.
func (n *node) beginChange() change {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.changing++
	n.changeSeq++
	return change{seq: n.changeSeq, alone: n.changing == 1}
}

func (n *node) endChange() {
	n.mu.Lock()
	n.changing--
	n.mu.Unlock()
}

// aloneLocked reports whether ch overlapped no other change of n: its
// results are then the newest, and may carry knowledge forward.
// Results of overlapping COMPOUNDs can arrive in any order.
func (n *node) aloneLocked(ch change) bool {
	return ch.alone && n.changeSeq == ch.seq
}

// dirChanged records what one of this client's operations did to
// directory n: name was added (or removed, !added), dc is what the
// COMPOUND ch reported. The post-op attributes refresh the cache; the
// listing knowledge moves forward only if dc proves nothing else
// happened to the directory in between.
func (n *node) dirChanged(name string, added bool, dc *nfsclient.DirChange, ch change) {
	n.mu.Lock()
	alone := n.aloneLocked(ch)
	n.mu.Unlock()
	if !dc.AttrOK || !alone {
		if dc.AttrOK {
			n.setAttr(&dc.Attr)
		}
		// The attributes may be older than another change's: the
		// next GETATTR asks the server.
		n.mu.Lock()
		n.known = nil
		n.attrTime = time.Time{}
		n.mu.Unlock()
		return
	}
	if !dc.Atomic {
		n.fsys.cinfoNotAtomic.Store(true)
	}
	n.mu.Lock()
	if dc.Listed {
		// Read after the GETATTR that gave dc.Attr, in the same
		// COMPOUND: the listing at that change attribute.
		n.known = newListing(dc.Attr.Change, dc.Names)
	} else if l := n.known; l != nil {
		// The GETATTR after the operation must show exactly its after
		// value: a different one means another change came between.
		if dc.Atomic && dc.Before == l.change && dc.Attr.Change == dc.After && len(l.names) < maxKnownNames {
			l.change = dc.After
			if added {
				l.names[name] = struct{}{}
			} else {
				delete(l.names, name)
			}
		} else {
			if n.fsys.tr.On(trace.FUSE) {
				n.fsys.trace("dir=%d listing dropped after %q: atomic=%v before=%d after=%d known=%d attr=%d", n.StableAttr().Ino, name, dc.Atomic, dc.Before, dc.After, l.change, dc.Attr.Change)
			}
			n.known = nil
		}
	}
	n.mu.Unlock()
	n.setAttr(&dc.Attr)
}

func newListing(change uint64, names []string) *listing {
	l := &listing{change: change, names: make(map[string]struct{}, len(names))}
	for _, nm := range names {
		l.names[nm] = struct{}{}
	}
	return l
}

// smallListing reports whether n's listing is known and small enough
// to read back in a COMPOUND that changes n.
func (n *node) smallListing() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.known != nil && len(n.known.names) < maxListedNames
}

// setAttrListed records attributes a of directory n from a COMPOUND
// that read n after them (nfsclient.SetAttrListed).
func (n *node) setAttrListed(a *nfsclient.Attr, names []string, listed bool, ch change) {
	n.setAttr(a)
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.aloneLocked(ch) {
		n.known = nil
		n.attrTime = time.Time{}
		return
	}
	if listed && n.attr.Change == a.Change {
		n.known = newListing(a.Change, names)
	}
}

// wantListing reports whether a create in directory n should read the
// directory back in its COMPOUND (nfsclient.OpenArgs.ListDir). Only
// when the server's change_info4 is not atomic, so the create alone
// cannot carry n's listing forward (dirChanged), and only for a small
// directory whose listing is known: that keeps the LOOKUP the kernel
// sends before each create answerable without a round trip, at the
// cost of a few hundred bytes per create in the reply.
func (n *node) wantListing() bool {
	return n.fsys.cinfoNotAtomic.Load() && n.smallListing()
}

// knowEmpty records that directory n, just made, was empty at the
// change attribute of its attributes.
func (n *node) knowEmpty(m *nfsclient.Made) {
	if !m.Dir.Empty {
		return
	}
	n.mu.Lock()
	if n.attr.Change == m.Attr.Change {
		n.known = &listing{change: m.Attr.Change, names: map[string]struct{}{}}
	}
	n.mu.Unlock()
}
