//go:build guestrdma

package ibverbs_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/testpeer"
)

// TestKnfsdGuestRxeSiw runs the cgo-built rdmafs inside the kpeer guest and
// mounts the guest's own knfsd over RoCE (rxe0) and over kernel iWARP
// (siw0) through the rdma-core provider, then runs a shell workload (16 MiB
// write and read back with a checksum after a remount, a 200-entry
// directory, rename, link, symlink, unmount) and checks the trace for
// Write chunks, Reply chunks, Read chunks and the version-2 probe falling
// back to version 1. It is a separate suite (build tag guestrdma, make
// test-guest-rdma) because it boots the guest under full emulation and
// takes a few minutes; it fails, never skips, when a component it
// needs is missing.
func TestKnfsdGuestRxeSiw(t *testing.T) {
	root, err := testpeer.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "rdmafs")
	build := exec.Command("go", "build", "-o", bin, "./cmd/rdmafs")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("cgo build of rdmafs (needs libibverbs-dev librdmacm-dev): %v\n%s", err, out)
	}
	if out, _ := exec.Command("ldd", bin).CombinedOutput(); !strings.Contains(string(out), "libibverbs") {
		t.Fatalf("rdmafs is not linked with libibverbs:\n%s", out)
	}
	fm, err := exec.LookPath("fusermount3")
	if err != nil {
		t.Fatalf("fusermount3 (fuse3) is needed in the guest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	k, err := testpeer.StartKnfsd(ctx, testpeer.KnfsdOptions{Env: []string{
		"KPEER_EXTRA_MODS=rdma_rxe ib_uverbs rdma_ucm fuse crc32_generic",
		"KPEER_EXTRA=" + bin + " " + fm,
		"KPEER_EXTRA_RDMA_USER=1",
	}})
	if err != nil {
		t.Fatalf("kpeer guest: %v", err)
	}
	defer k.Stop()
	script, err := os.ReadFile(filepath.Join("testdata", "guest-workload.sh"))
	if err != nil {
		t.Fatal(err)
	}
	bench, err := os.ReadFile(filepath.Join("testdata", "guest-bench.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := k.Exec(ctx, "cat > /tmp/work.sh <<'XEOF'\n"+string(script)+"XEOF\ncat > /tmp/bench.sh <<'XEOF'\n"+string(bench)+"XEOF\n"); err != nil {
		t.Fatalf("guest setup: %v\n%s", err, out)
	}
	// Both soft devices sit on eth0, and RDMA-CM routes 10.0.2.15 through
	// the first one: siw0 (made at boot) is tested first, then replaced
	// by rxe0 (knfsd's wildcard listener follows the new device).
	switchTo := map[string]string{"rxe0": "rdma link delete siw0 && rdma link add rxe0 type rxe netdev eth0 && rdma link show"}
	figures := ""
	for _, dev := range []string{"siw0", "rxe0"} {
		if cmd := switchTo[dev]; cmd != "" {
			if out, err := k.Exec(ctx, cmd); err != nil {
				t.Fatalf("%s: %v\n%s", cmd, err, out)
			}
		}
		t.Run(dev, func(t *testing.T) {
			start := time.Now()
			out, err := k.Exec(ctx, "sh /tmp/work.sh "+dev+" 2>&1")
			t.Logf("%s workload in %v:\n%s", dev, time.Since(start).Round(time.Millisecond), out)
			if err != nil || !strings.Contains(out, "WORKLOAD-OK") {
				log, _ := k.Exec(ctx, "tail -30 /tmp/"+dev+".log; dmesg | tail -20")
				t.Fatalf("workload over %s failed: %v\n%s", dev, err, log)
			}
			for _, w := range []string{`trace writes=\[[^]]: 0`, `trace reply=\[[^]]: 0`, `trace read(pos=: 0`, `trace ERR_VERS: 0`} {
				if strings.Contains(out, w) {
					t.Errorf("over %s the trace lacks %q", dev, strings.TrimSuffix(strings.TrimPrefix(w, "trace "), ": 0"))
				}
			}
			out, _ = k.Exec(ctx, "sh /tmp/bench.sh "+dev+" 2>&1")
			figures += out
		})
	}
	out, _ := k.Exec(ctx, "sh /tmp/bench.sh tcp 2>&1")
	t.Logf("1 MiB O_DIRECT dd, 64 MiB, inside the guest (TCG figures are emulation-bound):\n%s%s", figures, out)
}
