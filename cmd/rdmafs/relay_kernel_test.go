package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// kernelClientMods are the guest's extra modules for the kernel NFS
// client: bench-kernel.sh's list, so that the two share the cached cpio
// (test/kpeer/run.sh builds it on first use from the guest kernel's
// package).
const kernelClientMods = "nfsv4 nfs rdma_rxe ib_uverbs rdma_ucm fuse crc32_generic"

// TestRelayKernelClient: the Linux kernel's NFS client (xprtrdma over
// siw, in a kpeer guest of the test's own) mounts ganesha through an
// "rdmafs relay" process on the host, which it reaches as 10.0.2.2 (qemu
// user networking's host): the kernel's RPC-over-RDMA requester against
// our responder and our iWARP provider's passive side (MPA request from
// siw, RFC 8797 private data, credits, inline thresholds). A shell
// workload with checksums runs in the guest over that mount.
func TestRelayKernelClient(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	k, err := testpeer.StartKnfsd(ctx, testpeer.KnfsdOptions{Env: []string{"KPEER_EXTRA_MODS=" + kernelClientMods}})
	if err != nil {
		t.Fatalf("guest with the kernel NFS client: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("guest log:\n%s", k.LogTail())
		}
		if err := k.Stop(); err != nil {
			t.Error(err)
		}
	})
	r := startRelayBin(t, g.Addr, "-v", "rpc")
	guest := func(cmd string) string {
		t.Helper()
		out, err := k.Exec(ctx, cmd)
		if err != nil {
			t.Fatalf("guest: %v\n%s", err, out)
		}
		return out
	}
	opts := fmt.Sprintf("vers=4.1,proto=rdma,port=%s,addr=10.0.2.2", r.port)
	if out, err := k.Exec(ctx, "mkdir -p /mnt/relay && mount -t nfs4 -o "+opts+" 10.0.2.2:"+g.Export+" /mnt/relay"); err != nil {
		dmesg, _ := k.Exec(ctx, "dmesg | tail -40")
		t.Fatalf("kernel mount through the relay: %v\n%s\ndmesg:\n%s\nrelay stats:\n%s", err, out, dmesg, r.stats(t))
	}
	defer k.Exec(context.Background(), "umount -f /mnt/relay")
	if m := guest("grep ' /mnt/relay ' /proc/mounts"); !strings.Contains(m, "proto=rdma") {
		t.Fatalf("the guest's mount is not over RDMA: %s", m)
	}
	d := fmt.Sprintf("/mnt/relay/kernel-%d", time.Now().UnixNano())
	out := guest(`set -e
mkdir ` + d + ` && cd ` + d + `
dd if=/dev/urandom of=/tmp/big bs=1024 count=1500 2>/dev/null
dd if=/dev/urandom of=/tmp/small bs=100 count=37 2>/dev/null
cp /tmp/big big && cp /tmp/small small && cp big big2
mkdir -p tree/a/b && for i in 1 2 3 4 5; do echo "file $i" > tree/a/b/f$i; done
mv tree/a tree/c && mv big2 tree/c/big3
sync && echo 3 > /proc/sys/vm/drop_caches
want=$(cat /tmp/big /tmp/small /tmp/big | sha256sum)
got=$(cat big small tree/c/big3 | sha256sum)
[ "$want" = "$got" ] || { echo "checksum mismatch: $got, want $want"; exit 1; }
[ "$(cat tree/c/b/f4)" = "file 4" ] || { echo "tree/c/b/f4 wrong"; exit 1; }
rm -r tree big small && cd / && rmdir ` + d + `
echo workload ok`)
	if !strings.Contains(out, "workload ok") {
		t.Fatalf("guest workload:\n%s", out)
	}
	st := r.stats(t)
	t.Logf("relay stats:\n%s", st)
	if n := statField(t, st, "calls:", "bytes_in"); n < 1500*1024 {
		t.Errorf("relay received %d bytes of calls; the guest wrote 1.5 MB", n)
	}
	if n := statField(t, st, "calls:", "unanswered"); n != 0 {
		t.Errorf("%d calls the server did not answer", n)
	}
	guest("umount /mnt/relay")
}
