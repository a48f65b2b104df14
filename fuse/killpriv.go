package fuse

import (
	"context"
	"syscall"

	"github.com/rdmafs/rdmafs/nfsclient"
)

// A write by a process without CAP_FSETID clears the set-user-ID bit, and
// the set-group-ID bit of a group-executable file (POSIX write(2); Linux
// should_remove_suid). On an NFS mount the server does it as part of the
// WRITE, which it runs with the writer's credentials; the Linux client
// then only drops its cached mode. rdmafs mounts with
// FUSE_HANDLE_KILLPRIV_V2, so that the kernel leaves this to us instead
// of sending a SETATTR of the mode as the writer, which the server
// refuses (EPERM) unless the writer owns the file. The kernel marks such
// writes with FUSE_WRITE_KILL_SUIDGID.

// mayKill reports whether a write may clear bits of mode: set-user-ID,
// and set-group-ID (cleared without group execute too when the writer is
// not in the file's group, Linux setattr_should_drop_sgid; the server
// knows the writer's groups).
func mayKill(mode uint32) bool { return mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 }

// privBits returns the bits a write must clear whoever writes.
func privBits(mode uint32) uint32 {
	var b uint32
	if mode&syscall.S_ISUID != 0 {
		b |= syscall.S_ISUID
	}
	if mode&(syscall.S_ISGID|syscall.S_IXGRP) == syscall.S_ISGID|syscall.S_IXGRP {
		b |= syscall.S_ISGID
	}
	return b
}

// killPrivAfterWrite runs after a WRITE that the kernel marked
// FUSE_WRITE_KILL_SUIDGID, on a file whose cached mode has the bits: the
// data goes to the server now (the server clears the bits on WRITE), the
// mode is fetched again, and, if the server left the bits, a SETATTR of
// the mode clears them (allowed when the writer owns the file). The
// kernel's cached attributes are dropped so stat shows the new mode.
func (h *file) killPrivAfterWrite(ctx context.Context) {
	n := h.n
	if !n.fsys.writeKillsPriv(ctx) {
		return
	}
	n.mu.Lock()
	mode := n.attr.Mode
	n.mu.Unlock()
	if !mayKill(mode) {
		return
	}
	ctx = uninterrupted(ctx)
	h.mu.Lock()
	err := h.writeOutLocked()
	h.mu.Unlock()
	if err != nil {
		return // reported by the next write, flush or fsync
	}
	c := n.fsys.c
	a, err := c.GetAttr(ctx, h.cred, h.of.FH)
	if err != nil {
		return
	}
	if b := privBits(a.Mode); b != 0 {
		m := a.Mode &^ b & 07777
		if a2, err := c.SetAttr(ctx, h.cred, h.of.FH, nfsclient.StateID{}, &nfsclient.SetAttr{Mode: &m}); err == nil {
			a = a2
		}
	}
	n.setAttr(&a)
	n.NotifyContent(-1, 0) // attributes only
	n.fsys.trace("WRITE ino=%d kill_suidgid: mode %o -> %o", n.StableAttr().Ino, mode, a.Mode)
}
