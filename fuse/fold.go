package fuse

import (
	"bytes"
	"context"
	"fmt"
	"syscall"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// A SETATTR of a file with buffered writes must send them first: a
// WRITE after a utimes would move the mtime it set. tar x does exactly
// that for every file (write, then futimens, fchown, fchmod, close), so
// the buffered data goes out in the SETATTR's own COMPOUND (PUTFH,
// WRITE, SETATTR, GETATTR; Client.WriteSetAttr) instead of a WRITE of
// its own before it: one round trip where the Linux client, which
// flushes in nfs_setattr before sending SETATTR, takes two.

// writeSetAttr sends the one buffered write of n with sa, when that is
// all n has to write and cred may send it. folded is false when it did
// nothing: the caller flushes and sends SETATTR on its own. sid is the
// SETATTR's stateid.
func (n *node) writeSetAttr(ctx context.Context, cred oncrpc.Credential, sid nfsclient.StateID, sa *nfsclient.SetAttr) (a nfsclient.Attr, folded bool, err error) {
	h := n.soleWriter()
	if h == nil {
		return a, false, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// Only a file whose dirty data is all in the buffer (no UNSTABLE
	// WRITE sent, so none to COMMIT), and only with the credential the
	// WRITE needs: a COMPOUND has one.
	if h.w == nil || h.sent || len(h.wb.b) == 0 || h.werr != nil || !sameCred(h.cred, cred) {
		return a, false, nil
	}
	c := n.fsys.c
	data, off, release := h.wb.view(), h.bufOff, h.wb.release()
	h.wb = writeBuffer{}
	defer func() {
		if release != nil {
			release()
		}
	}()
	if n.fsys.tr.On(trace.FUSE) {
		n.fsys.trace("WRITE ino=%d off=%d len=%d (file_sync, in the SETATTR's COMPOUND)", n.StableAttr().Ino, off, data.Len())
	}
	res, a, err := c.WriteSetAttr(ctx, h.cred, h.of.FH, h.of.StateID, off, data, nfsclient.FileSync, sid, sa)
	if res.Count == 0 {
		// The WRITE did not go through: it is the file's write error,
		// as a failed flush would be.
		if err == nil {
			err = fmt.Errorf("write at %d: server wrote 0 bytes: %w", off, syscall.EIO)
		}
		h.werr = fmt.Errorf("write at %d: %w", off, err)
		n.fsys.Stats.WriteErrors.Add(1)
		return a, true, h.werr
	}
	setErr := err
	if int(res.Count) < data.Len() {
		// A short WRITE: the rest goes now, and the SETATTR again so
		// that the rest does not move the times it set.
		if err := h.writeStable(ctx, data.Slice(int(res.Count), data.Len()), off+uint64(res.Count)); err != nil {
			h.werr = err
			n.fsys.Stats.WriteErrors.Add(1)
			return a, true, err
		}
		if setErr == nil {
			a, setErr = c.SetAttr(ctx, cred, n.handle(), sid, sa)
		}
	} else if res.Committed != nfsclient.FileSync {
		// RFC 8881 s18.32.3: the server may write less stably than
		// asked; COMMIT then.
		if _, err := c.Commit(ctx, h.cred, h.of.FH, 0, 0); err != nil {
			h.werr = fmt.Errorf("commit: %w", err)
			return a, true, h.werr
		}
	}
	h.dirty = false
	n.removeWriter(h)
	return a, true, setErr
}

// soleWriter returns the one open file of n with buffered writes, or nil
// when there are none or several.
func (n *node) soleWriter() *file {
	f, ino := n.fsys, n.StableAttr().Ino
	f.mu.Lock()
	defer f.mu.Unlock()
	ws := f.writers[ino]
	if len(ws) != 1 {
		return nil
	}
	for h := range ws {
		return h
	}
	return nil
}

func sameCred(a, b oncrpc.Credential) bool {
	return a.Flavor == b.Flavor && bytes.Equal(a.Body, b.Body)
}
