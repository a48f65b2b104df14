package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/rpcrdma"
	"github.com/rdmafs/rdmafs/test/fusetest"
	"github.com/rdmafs/rdmafs/test/testpeer"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// mountDelegating mounts export through the RPC-over-RDMA server at addr
// in this process, with delegations allowed (the command has no option
// for them), and unmounts it when the test ends.
func mountDelegating(t *testing.T, addr, export string) (string, *fuse.Mount) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := nfsclient.Dial(ctx, nfsclient.Config{
		Transport:   rpcrdma.NewTransport(addr, rpcrdma.Config{Provider: &iwarp.Provider{}, AcceptInvalidate: true}),
		Export:      export,
		RPC:         oncrpc.ClientOptions{Timeout: 30 * time.Second, Retrans: 3},
		Delegations: true,
	})
	if err != nil {
		t.Fatalf("dial %s through the relay: %v", export, err)
	}
	dir := mountDir(t)
	opts := fuse.Options{FSName: addr + ":" + export}
	if os.Getenv("RDMAFS_URING") == "on" {
		opts.URing = fuse.URingOn // make test's second pass
	}
	m, err := fuse.Serve(ctx, fuse.NFSClient(c), dir, opts)
	if err != nil {
		c.Close(ctx)
		t.Fatalf("mount through the relay: %v", err)
	}
	fusetest.UnmountAtCleanup(t, m, dir)
	return dir, m
}

// TestRelayDelegationRecall: mount A reaches knfsd over RPC-over-RDMA
// through an "rdmafs relay" process to knfsd's TCP listener, mount B
// reaches knfsd over TCP directly. A holds a read delegation on a file;
// B's write makes knfsd send CB_RECALL on the relay's TCP connection,
// which the relay carries to A as a backward call on A's RDMA connection.
// A returns the delegation, and then reads B's data, never its cached
// bytes; the relay counted the callbacks.
func TestRelayDelegationRecall(t *testing.T) {
	k := testpeer.RequireKnfsd(t)
	r := startRelayBin(t, k.TCPAddr, "-v", "rpc")
	ma, mountA := mountDelegating(t, r.addr, "/")
	mb := mount(t, peer{name: "knfsd", host: "127.0.0.1", port: portOf(k.TCPAddr), export: "/"})
	d := testDir(t, ma)
	defer os.RemoveAll(d)
	pathA := filepath.Join(d, "f")
	pathB := filepath.Join(mb, filepath.Base(d), "f")
	old := bytes.Repeat([]byte("old "), 25<<10)
	if err := os.WriteFile(pathA, old, 0o666); err != nil {
		t.Fatal(err)
	}
	c := mountA.FS.Client()
	fa, ok := fusetest.OpenDelegated(t, c, pathA, 20*time.Second)
	if !ok {
		t.Fatalf("knfsd granted no read delegation through the relay (its callback probe did not come back?); relay stats:\n%s", r.stats(t))
	}
	defer fa.Close()
	got := make([]byte, len(old))
	if _, err := fa.ReadAt(got, 0); err != nil || !bytes.Equal(got, old) {
		t.Fatalf("read under the delegation: %v", err)
	}
	updated := bytes.Repeat([]byte("NEW!"), 40<<10)
	if err := os.WriteFile(pathB, updated, 0o666); err != nil {
		t.Fatalf("write through the second mount: %v", err)
	}
	if ds := c.DelegationStats(); ds.Recalled == 0 || c.Recalls() == 0 {
		t.Fatalf("the second mount's write recalled nothing through the relay: %+v, %d CB_RECALLs", ds, c.Recalls())
	}
	got = make([]byte, len(updated))
	if n, err := fa.ReadAt(got, 0); n != len(updated) || !bytes.Equal(got, updated) {
		t.Fatalf("read after the recall: %d bytes, %v; stale data: %v", n, err, !bytes.Equal(got, updated))
	}
	st := r.stats(t)
	t.Logf("relay stats:\n%s", st)
	if n := statField(t, st, "callbacks:", "callbacks"); n < 1 {
		t.Errorf("the relay carried %d callbacks; want the CB_RECALL at least", n)
	}
	if n := statField(t, st, "callbacks:", "unanswered"); n != 0 {
		t.Errorf("%d callbacks went unanswered", n)
	}
}
