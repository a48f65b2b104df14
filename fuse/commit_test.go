package fuse_test

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdmafs/rdmafs/fuse"
)

// TestBackgroundCommit writes a 16 MiB file through one mount in 1 MiB
// writes: with CommitEvery at 1 MiB, COMMITs go out before the close
// (more than the one at close), with background COMMITs off there is
// exactly one. After close the data is on the server: a second mount
// (another NFS client) reads it whole (close-to-open).
func TestBackgroundCommit(t *testing.T) {
	tcpPeers(t, func(t *testing.T, p peer) {
		other, _ := mountPeer(t, p, fuse.Options{})
		const size = 16 << 20
		want := make([]byte, size)
		r := rand.New(rand.NewPCG(3, 4))
		for i := range want {
			want[i] = byte(r.Uint32())
		}
		for _, tc := range []struct {
			every   int
			commits func(n uint64) bool
			want    string
		}{
			{1 << 20, func(n uint64) bool { return n >= 2 }, "at least 2"},
			{-1, func(n uint64) bool { return n == 1 }, "exactly 1"},
		} {
			mnt, m := mountPeer(t, p, fuse.Options{CommitEvery: tc.every})
			d := freshDir(t, mnt)
			name := filepath.Join(d, "big")
			before := countOps(m)
			f, err := os.Create(name)
			if err != nil {
				t.Fatal(err)
			}
			for off := 0; off < size; off += 1 << 20 {
				if _, err := f.Write(want[off : off+1<<20]); err != nil {
					t.Fatalf("write at %d: %v", off, err)
				}
			}
			if err := f.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			if n := countOps(m).since(before)["COMMIT"]; !tc.commits(n) {
				t.Errorf("%s: CommitEvery %d: %d COMMITs for %d bytes, want %s", p.name, tc.every, n, size, tc.want)
			}
			got, err := os.ReadFile(filepath.Join(other, filepath.Base(d), "big"))
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("%s: CommitEvery %d: second mount read %d bytes, %v; equal: %v", p.name, tc.every, len(got), err, bytes.Equal(got, want))
			}
			os.RemoveAll(d)
		}
	})
}
