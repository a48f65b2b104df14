package fuse

import (
	"syscall"
	"time"

	"github.com/rdmafs/rdmafs/nfsclient"
)

// attrFreshLocked reports whether n's attributes were read from the
// server no longer ago than their cache timeout. Caller holds n.mu.
func (n *node) attrFreshLocked(now time.Time) bool {
	return n.attrSet && n.acTimeout > 0 && now.Sub(n.attrTime) < n.acTimeout
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
	return n.StableAttr().Mode == syscall.S_IFDIR && n.postOpFresh()
}

// postOpFresh reports whether n's attributes are the post-op attributes
// of its last change and still within their cache timeout. Attributes
// from anywhere else (a LOOKUP or READDIR that may have started before
// the change) make the next GETATTR ask the server.
func (n *node) postOpFresh() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.postOp && n.attrFreshLocked(time.Now())
}

// change is one COMPOUND of this client that changes directory n (or
// n itself), from beginChange to its end.
type change struct {
	seq   uint64
	alone bool // no other change of n was in flight when it began
}

// beginChange notes a COMPOUND that changes n going out; endChange,
// deferred, notes its end.
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
// attributes are then the newest. Replies of overlapping COMPOUNDs can
// be applied in any order.
func (n *node) aloneLocked(ch change) bool {
	return ch.alone && n.changeSeq == ch.seq
}

// dirChanged records what one of this client's operations (COMPOUND ch)
// did to directory n: its post-op attributes refresh the cache, so the
// GETATTR the kernel sends after the change is answered from them.
// Without them, or when another change overlapped, the next GETATTR
// asks the server.
func (n *node) dirChanged(dc *nfsclient.DirChange, ch change) {
	n.changed(&dc.Attr, dc.AttrOK, ch)
}

// changed records attributes a (when ok) that COMPOUND ch returned
// after changing n.
func (n *node) changed(a *nfsclient.Attr, ok bool, ch change) {
	if ok {
		n.setAttr(a)
	}
	n.mu.Lock()
	if ok && n.aloneLocked(ch) {
		n.postOp = true
	} else {
		n.attrTime = time.Time{}
	}
	n.mu.Unlock()
}
