package fuse_test

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fuse"
)

// TestReadInPlace reads a file back through the kernel's page cache
// after dropping it: over TCP each READ goes to the kernel from the RPC
// reply's buffer, so the client copies no READ data (when one NFS READ
// answers a FUSE READ), and the bytes are the ones written.
func TestReadInPlace(t *testing.T) {
	tcpPeers(t, func(t *testing.T, p peer) {
		mnt, m := mountPeer(t, p, fuse.Options{})
		d := freshDir(t, mnt)
		defer os.RemoveAll(d)
		want := make([]byte, 5<<20+12345)
		r := rand.New(rand.NewPCG(7, 8))
		for i := range want {
			want[i] = byte(r.Uint32())
		}
		name := filepath.Join(d, "f")
		if err := os.WriteFile(name, want, 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			t.Fatal(err)
		}
		copied0, reads0 := m.FS.Client().BytesCopied(), m.FS.Stats.Reads.Load()
		got := make([]byte, len(want)+1)
		n := 0
		for n < len(got) {
			k, err := f.Read(got[n:])
			n += k
			if k == 0 || err != nil {
				break
			}
		}
		if n != len(want) || !bytes.Equal(got[:n], want) {
			t.Fatalf("%s: read %d bytes, want the %d written (equal: %v)", p.name, n, len(want), bytes.Equal(got[:n], want))
		}
		if m.FS.Stats.Reads.Load() == reads0 {
			t.Fatalf("%s: no FUSE READ: the page cache was not dropped", p.name)
		}
		// A FUSE READ larger than rsize takes several NFS READs, whose
		// data is gathered in the FUSE buffer by copying.
		c := m.FS.Client().BytesCopied() - copied0
		if rsize := m.FS.Client().RSize(); rsize < 1<<20 {
			t.Logf("%s: rsize %d below the 1 MiB FUSE READ: %d bytes copied", p.name, rsize, c)
		} else if c != 0 {
			t.Errorf("%s: %d READ data bytes copied out of replies, want 0", p.name, c)
		}
	})
}
