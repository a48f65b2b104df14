package fuse_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/test/fusetest"
	"github.com/rdmafs/rdmafs/test/testpeer"
)

// TestKnfsdDelegationTwoMounts mounts knfsd twice (two client IDs). A
// reads a file under a read delegation and keeps it open; B writes it,
// so knfsd recalls A's delegation; A's caches are dropped before the
// delegation goes back, and A then reads B's data through the same
// descriptor, never the stale bytes it had cached.
func TestKnfsdDelegationTwoMounts(t *testing.T) {
	k := testpeer.RequireKnfsd(t)
	for _, rdma := range []bool{false, true} {
		name := map[bool]string{false: "tcp", true: "rdma"}[rdma]
		t.Run(name, func(t *testing.T) {
			pa := peer{name: "knfsd-" + name, addr: k.TCPAddr, export: "/", deleg: true}
			if rdma {
				pa.addr, pa.rdma = k.RDMAAddr, true
			}
			ma, mountA := mountPeer(t, pa, fuse.Options{})
			mb, _ := mountPeer(t, peer{name: "knfsd", addr: k.TCPAddr, export: "/"}, fuse.Options{})
			d := freshDir(t, ma)
			pathA := filepath.Join(d, "f")
			pathB := filepath.Join(mb, filepath.Base(d), "f")
			old := bytes.Repeat([]byte("old "), 25<<10)
			if err := os.WriteFile(pathA, old, 0o666); err != nil {
				t.Fatal(err)
			}
			c := mountA.FS.Client()
			fa, ok := fusetest.OpenDelegated(t, c, pathA, 10*time.Second)
			if !ok {
				t.Fatal("knfsd granted no read delegation")
			}
			defer fa.Close()
			got := make([]byte, len(old))
			if _, err := fa.ReadAt(got, 0); err != nil || !bytes.Equal(got, old) {
				t.Fatalf("read under the delegation: %v", err)
			}
			if st, err := os.Stat(pathA); err != nil || st.Size() != int64(len(old)) {
				t.Fatalf("stat under the delegation: %v", err)
			}

			updated := bytes.Repeat([]byte("NEW!"), 40<<10)
			if err := os.WriteFile(pathB, updated, 0o666); err != nil {
				t.Fatalf("write through the second mount: %v", err)
			}
			ds := c.DelegationStats()
			if ds.Recalled == 0 {
				t.Fatalf("the second mount's write recalled nothing: %+v", ds)
			}
			st, err := fa.Stat()
			if err != nil || st.Size() != int64(len(updated)) {
				t.Fatalf("size after the recall: %v, %v, want %d", st.Size(), err, len(updated))
			}
			got = make([]byte, len(updated))
			if n, err := fa.ReadAt(got, 0); n != len(updated) || !bytes.Equal(got, updated) {
				t.Fatalf("read after the recall: %d bytes, %v; stale data: %v", n, err, !bytes.Equal(got, updated))
			}
			t.Logf("%s: delegations %+v", pa.name, c.DelegationStats())
		})
	}
}
