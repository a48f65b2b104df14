package fuse

import (
	"context"
	"time"

	"github.com/rdmafs/rdmafs/nfsclient"
)

// Delegation caching (RFC 8881 s10.2, s10.4). While the client holds a
// delegation on a file, no other client can change it: the kernel may
// keep the file's attributes for delegAttrTimeout instead of the ac*
// timeouts, and its page cache across opens. When the server recalls the
// delegation, recall writes out what the file's open handles buffer and
// drops the kernel's attributes and pages, before the client returns the
// delegation; the next open then revalidates as without one.

// Delegations are the client's delegations, optional in a Client: the
// mount asks only a Client that has them (NFSClient's); without, no
// file is taken for delegated.
type Delegations interface {
	// SetRecallHandler sets what runs when the server recalls a
	// delegation (CB_RECALL), before the client returns it.
	SetRecallHandler(h nfsclient.RecallHandler)
	// Delegated reports whether the client holds a delegation on fh.
	Delegated(fh []byte) bool
	// ReturnDelegation gives the delegation on fh back (DELEGRETURN).
	ReturnDelegation(fh []byte)
}

// delegAttrTimeout is how long the kernel keeps attributes of a file
// under a delegation; a recall invalidates them sooner.
const delegAttrTimeout = time.Hour

// delegated reports whether n's file is under a delegation.
func (n *node) delegated() bool {
	return n.fsys.deleg != nil && n.fsys.deleg.Delegated(n.handle())
}

// trackDelegation remembers n as the node of its file handle, for
// recalls, if the client holds a delegation on it.
func (n *node) trackDelegation() {
	if !n.delegated() {
		return
	}
	f := n.fsys
	f.mu.Lock()
	if f.delegNodes == nil {
		f.delegNodes = make(map[string]*node)
	}
	f.delegNodes[string(n.handle())] = n
	f.mu.Unlock()
}

// recall is the client's RecallHandler: the delegation on fh goes back
// to the server once buffered writes are out and the caches dropped.
func (f *FS) recall(ctx context.Context, fh []byte) {
	f.mu.Lock()
	n := f.delegNodes[string(fh)]
	delete(f.delegNodes, string(fh))
	f.mu.Unlock()
	if n == nil {
		return
	}
	// Data written under a write delegation reaches the server before
	// the delegation goes (RFC 8881 s10.4.1).
	errno := n.flushWriters(ctx)
	n.mu.Lock()
	n.cacheValid = false
	n.acTimeout = 0
	n.mu.Unlock()
	n.NotifyContent(0, 0) // the kernel drops cached pages and attributes
	f.trace("RECALL ino=%d flush errno=%d: caches dropped", n.StableAttr().Ino, errno)
}

// returnDelegationBeforeRemove gives back the delegation held on the
// file that name names in directory n when REMOVE is about to take its
// last link. A delegation keeps the server's file alive, and so the
// space of a removed file, until it is returned; Linux's client returns
// it first in nfs4_proc_remove when i_nlink is 1. With more links the
// file lives on and the delegation stays.
func (n *node) returnDelegationBeforeRemove(name string) {
	ch := n.GetChild(name)
	if ch == nil {
		return
	}
	c, ok := ch.Operations().(*node)
	if !ok || !c.delegated() {
		return
	}
	c.mu.Lock()
	links := c.attr.NLink
	c.mu.Unlock()
	if links > 1 {
		return
	}
	n.fsys.deleg.ReturnDelegation(c.handle()) // delegated: deleg is set
}
