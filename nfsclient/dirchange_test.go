package nfsclient

import (
	"testing"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// TestDirChange checks the directory post-op attributes folded into the
// COMPOUNDs that change a directory (no GETATTR has to follow), and
// WRITE's.
func TestDirChange(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		c := dial(t, p, oncrpc.TCPOptions{})
		ctx := testCtx(t)
		parent := testDir(t, c)
		m, err := c.Mkdir(ctx, rootCred, parent, "d", &SetAttr{Mode: ptr(uint32(0o755))})
		if err != nil {
			t.Fatal(err)
		}
		if !m.Dir.AttrOK || m.Dir.Attr.Type != TypeDir || m.Dir.Attr.NLink < 3 || m.Dir.Attr.Change != m.Dir.After {
			t.Errorf("mkdir: parent post-op attributes %+v (ok %v), change_info after %d", m.Dir.Attr, m.Dir.AttrOK, m.Dir.After)
		}
		dir := m.FH

		of, err := c.Open(ctx, rootCred, dir, "f", OpenArgs{Access: ShareAccessWrite, Create: Guarded, Attr: &SetAttr{Mode: ptr(uint32(0o644))}})
		if err != nil {
			t.Fatal(err)
		}
		if !of.Dir.AttrOK || of.Dir.Attr.FileID != m.Attr.FileID || of.Dir.Before == of.Dir.After || of.Dir.Attr.Change != of.Dir.After {
			t.Errorf("open(create): directory %+v (ok %v), change_info %d -> %d", of.Dir.Attr, of.Dir.AttrOK, of.Dir.Before, of.Dir.After)
		}
		wr, err := c.WriteGetAttr(ctx, rootCred, of.FH, of.StateID, 0, oncrpc.Plain([]byte("hello")), FileSync)
		if err != nil {
			t.Fatal(err)
		}
		if !wr.AttrOK || wr.Attr.Size != 5 || wr.Attr.FileID != of.Attr.FileID {
			t.Errorf("write: post-op attributes %+v (ok %v), want size 5", wr.Attr, wr.AttrOK)
		}
		if err := c.CloseFile(ctx, rootCred, of); err != nil {
			t.Fatal(err)
		}

		la, ldc, err := c.Link(ctx, rootCred, of.FH, dir, "g")
		if err != nil || la.NLink != 2 || !ldc.AttrOK || ldc.Attr.Change != ldc.After {
			t.Errorf("link: nlink %d, directory %+v (ok %v), %v", la.NLink, ldc.Attr, ldc.AttrOK, err)
		}
		src, dst, err := c.Rename(ctx, rootCred, dir, "g", parent, "g")
		if err != nil || !src.AttrOK || !dst.AttrOK || src.Attr.FileID != m.Attr.FileID || dst.Attr.FileID == m.Attr.FileID {
			t.Errorf("rename: source %+v (ok %v), target %+v (ok %v), %v", src.Attr, src.AttrOK, dst.Attr, dst.AttrOK, err)
		}
		rdc, err := c.Remove(ctx, rootCred, parent, "g")
		if err != nil || !rdc.AttrOK || rdc.Attr.Change != rdc.After {
			t.Errorf("remove: directory %+v (ok %v), change_info after %d, %v", rdc.Attr, rdc.AttrOK, rdc.After, err)
		}
		t.Logf("%s: change_info4 atomic: %v", p.name, rdc.Atomic)
	})
}
