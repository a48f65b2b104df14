package nfsclient

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// TestWriteSetAttr sends WRITE and SETATTR in one COMPOUND: the SETATTR
// runs after the WRITE (its mtime stays), a failed SETATTR leaves the
// data written, and a failed WRITE leaves the attributes unset (RFC 8881
// s16.2.3: the server stops at the first failure).
func TestWriteSetAttr(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		c := dial(t, p, oncrpc.TCPOptions{})
		ctx := testCtx(t)
		dir := testDir(t, c)
		open := func(name string) *OpenFile {
			t.Helper()
			of, err := c.Open(ctx, rootCred, dir, name, OpenArgs{Access: ShareAccessBoth, Create: Guarded, Attr: &SetAttr{Mode: ptr(uint32(0o600))}})
			if err != nil {
				t.Fatalf("create %s: %v", name, err)
			}
			t.Cleanup(func() { c.CloseFile(ctx, rootCred, of) })
			return of
		}
		mtime := time.Unix(1e9, 0)
		// A length that is not a multiple of 4: the WRITE's XDR padding
		// comes before the SETATTR.
		data := pattern(3001, 1)

		of := open("ok")
		res, a, err := c.WriteSetAttr(ctx, rootCred, of.FH, of.StateID, 0, oncrpc.Plain(data), FileSync, StateID{}, &SetAttr{Mtime: &mtime, Mode: ptr(uint32(0o644))})
		if err != nil || res.Count != uint32(len(data)) || !res.AttrOK {
			t.Fatalf("WriteSetAttr: count %d attrOK %v, %v", res.Count, res.AttrOK, err)
		}
		if a.Size != uint64(len(data)) || !a.Mtime.Equal(mtime) || a.Mode != 0o644 {
			t.Errorf("attributes after WRITE+SETATTR: size %d mtime %v mode %o, want %d %v 644", a.Size, a.Mtime, a.Mode, len(data), mtime)
		}
		if g, err := c.GetAttr(ctx, rootCred, of.FH); err != nil || !g.Mtime.Equal(mtime) || g.Size != uint64(len(data)) {
			t.Errorf("GETATTR after: size %d mtime %v, %v", g.Size, g.Mtime, err)
		}
		if got := readAll(ctx, t, c, of, len(data)); !bytes.Equal(got, data) {
			t.Errorf("read back %d bytes, differs from the %d written", len(got), len(data))
		}

		// A stateid newer than the server's is NFS4ERR_BAD_STATEID
		// (RFC 8881 s8.2.2); a size change makes SETATTR check it.
		of = open("setattr-fails")
		bad := StateID{Seq: of.StateID.Seq + 100, Other: of.StateID.Other}
		size := uint64(len(data))
		res, _, err = c.WriteSetAttr(ctx, rootCred, of.FH, of.StateID, 0, oncrpc.Plain(data), FileSync, bad, &SetAttr{Size: &size})
		var oe *OpError
		if !errors.As(err, &oe) || oe.Op != "SETATTR" || res.Count != uint32(len(data)) {
			t.Fatalf("WriteSetAttr with a bad SETATTR stateid: count %d, %v; want the data written and a SETATTR error", res.Count, err)
		}
		if got := readAll(ctx, t, c, of, len(data)); !bytes.Equal(got, data) {
			t.Errorf("after the failed SETATTR: read back %d bytes, differs from the %d written", len(got), len(data))
		}

		of = open("write-fails")
		bad = StateID{Seq: of.StateID.Seq + 100, Other: of.StateID.Other}
		res, _, err = c.WriteSetAttr(ctx, rootCred, of.FH, bad, 0, oncrpc.Plain(data), FileSync, StateID{}, &SetAttr{Mtime: &mtime})
		if !errors.As(err, &oe) || oe.Op != "WRITE" || res.Count != 0 {
			t.Fatalf("WriteSetAttr with a bad WRITE stateid: count %d, %v; want a WRITE error", res.Count, err)
		}
		if g, err := c.GetAttr(ctx, rootCred, of.FH); err != nil || g.Size != 0 || g.Mtime.Equal(mtime) {
			t.Errorf("after the failed WRITE: size %d mtime %v, %v; want the SETATTR not run", g.Size, g.Mtime, err)
		}
	})
}
