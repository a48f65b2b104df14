package nfsclient

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// TestReadDirPlus checks that ReadDirPlus returns every entry with the
// file handle and attributes a LOOKUP would give, over several pages.
func TestReadDirPlus(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		c := dial(t, p, oncrpc.TCPOptions{})
		ctx := testCtx(t)
		dir := testDir(t, c)
		const n = 300
		for i := range n {
			of, err := c.Open(ctx, rootCred, dir, fmt.Sprintf("f%03d", i), OpenArgs{
				Access: ShareAccessWrite, Create: Unchecked, Attr: &SetAttr{Mode: ptr(uint32(0o640))}})
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			if err := c.CloseFile(ctx, rootCred, of); err != nil {
				t.Fatalf("close: %v", err)
			}
		}
		ents, err := c.ReadDirPlusAll(ctx, rootCred, dir)
		if err != nil {
			t.Fatalf("%s: ReadDirPlusAll: %v", p.name, err)
		}
		if len(ents) != n {
			t.Fatalf("%s: %d entries, want %d", p.name, len(ents), n)
		}
		for _, e := range ents[:10] {
			fh, a, err := c.Lookup(ctx, rootCred, dir, e.Name)
			if err != nil {
				t.Fatalf("lookup %s: %v", e.Name, err)
			}
			if !bytes.Equal(fh, e.Attr.FileHandle) {
				t.Errorf("%s: %s: READDIR handle %x, LOOKUP handle %x", p.name, e.Name, e.Attr.FileHandle, fh)
			}
			if a.FileID != e.Attr.FileID || a.Mode != e.Attr.Mode || e.Attr.Type != TypeReg {
				t.Errorf("%s: %s: READDIR attrs %+v differ from LOOKUP's %+v", p.name, e.Name, e.Attr, a)
			}
		}
	})
}
