package fuse

import (
	"context"
	"sync"
	"sync/atomic"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"
)

// requestInfo is what a kernel request says that go-fuse's fs API does
// not pass on to the node method serving it, and what that method tells
// the raw hook back. The raw hook (rawhooks.go) fills it in before the
// call and reads it after.
type requestInfo struct {
	// lockOwner is FLUSH's FlushIn.LockOwner, the POSIX lock owner of
	// the closing process (fs/fuse/file.c fuse_flush); hasLockOwner
	// says the request is a FLUSH.
	lockOwner    uint64
	hasLockOwner bool
	// writeFlags are WRITE's WriteIn.WriteFlags (FUSE_WRITE_*).
	writeFlags uint32
	// leftLocks is set by a FLUSH whose file still holds locks after
	// it (releaseWait).
	leftLocks atomic.Bool
}

// inflight holds the requestInfo of the requests a raw hook runs.
//
// The key is the request's cancel channel because it is the one thing
// of the request that reaches the node method: go-fuse's bridge (fs
// package) makes the method's context itself, a *fuse.Context of the
// request's Caller and cancel channel and nothing else, so no value the
// hook could put into a context gets through. The channel is unique
// while the request runs: killable makes one for each request.
type inflight struct {
	m sync.Map // <-chan struct{} -> *requestInfo
}

// begin records info as the request of cancel's until end is called.
func (t *inflight) begin(cancel <-chan struct{}, info *requestInfo) (end func()) {
	t.m.Store(cancel, info)
	return func() { t.m.Delete(cancel) }
}

// of returns the requestInfo of the request whose node method got ctx
// (the context go-fuse made, not one derived from it), or nil.
func (t *inflight) of(ctx context.Context) *requestInfo {
	fc, ok := ctx.(*gofuse.Context)
	if !ok {
		return nil
	}
	v, ok := t.m.Load(fc.Cancel)
	if !ok {
		return nil
	}
	return v.(*requestInfo)
}

// flushOwner returns the lock owner of the FLUSH whose context is ctx.
func (f *FS) flushOwner(ctx context.Context) (uint64, bool) {
	if info := f.reqs.of(ctx); info != nil && info.hasLockOwner {
		return info.lockOwner, true
	}
	return 0, false
}

// setFlushHolding tells the FLUSH hook that the FLUSH of ctx left the
// file holding locks.
func (f *FS) setFlushHolding(ctx context.Context) {
	if info := f.reqs.of(ctx); info != nil {
		info.leftLocks.Store(true)
	}
}

// writeKillsPriv reports whether the kernel asked the WRITE of ctx to
// clear the set-user-ID and set-group-ID bits (the writer lacks
// CAP_FSETID; FUSE_HANDLE_KILLPRIV_V2).
func (f *FS) writeKillsPriv(ctx context.Context) bool {
	info := f.reqs.of(ctx)
	return info != nil && info.writeFlags&gofuse.WRITE_KILL_SUIDGID != 0
}
