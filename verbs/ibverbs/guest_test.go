//go:build guestrdma

package ibverbs_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/rpcrdma"
	"github.com/rdmafs/rdmafs/test/testpeer"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// TestKnfsdGuestRxeSiw runs the rdma-core provider inside the kpeer guest,
// over kernel iWARP (siw0) and then RoCE (rxe0):
//
//   - the verbs conformance suite (TestGuestConformance, the tests the
//     pure-Go provider passes in the ordinary run);
//   - the requester against a server that claims more of a Write or
//     Reply chunk than it wrote, with the slab filled with a marker
//     (TestGuestStaleBytes): no stale byte is delivered;
//   - the cgo-built rdmafs mounting the guest's own knfsd (over rxe0 also
//     with memory windows), with a shell
//     workload (16 MiB written and read back with a checksum after a
//     remount, a 200-entry directory, rename, link, symlink, a delegation
//     recall forced by a second mount over TCP, unmount) whose trace must
//     show Write, Reply and Read chunks and the version-2 probe falling
//     back to version 1;
//   - over siw0, interoperation: the guest's rdma-core provider mounts
//     through this host's pure-Go iWARP provider running the in-process
//     RPC-over-RDMA responder (relaying to the same knfsd over TCP), so
//     the two providers meet on the wire;
//   - 1 MiB O_DIRECT dd figures over siw, rxe and TCP, from this one run.
//
// It is a separate suite (build tag guestrdma, make test-guest-rdma, which
// make test runs) because it boots the guest under full emulation; it
// fails, never skips, when a component it needs is missing.
func TestKnfsdGuestRxeSiw(t *testing.T) {
	root, err := testpeer.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin, tbin := filepath.Join(dir, "rdmafs"), filepath.Join(dir, "ibverbs.test")
	for _, args := range [][]string{
		{"build", "-o", bin, "./cmd/rdmafs"},
		{"test", "-c", "-tags", "guestrdma", "-o", tbin, "./verbs/ibverbs"},
	} {
		build := exec.Command("go", args...)
		build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=1")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go %s (needs libibverbs-dev librdmacm-dev): %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if out, _ := exec.Command("ldd", bin).CombinedOutput(); !strings.Contains(string(out), "libibverbs") {
		t.Fatalf("rdmafs is not linked with libibverbs:\n%s", out)
	}
	fm, err := exec.LookPath("fusermount3")
	if err != nil {
		t.Fatalf("fusermount3 (fuse3) is needed in the guest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	k, err := testpeer.StartKnfsd(ctx, testpeer.KnfsdOptions{Env: []string{
		"KPEER_EXTRA_MODS=rdma_rxe ib_uverbs rdma_ucm fuse crc32_generic",
		"KPEER_EXTRA=" + bin + " " + tbin + " " + fm,
		"KPEER_EXTRA_RDMA_USER=1",
	}})
	if err != nil {
		t.Fatalf("kpeer guest: %v", err)
	}
	defer k.Stop()

	// The host's pure-Go provider with the in-process responder,
	// relaying to knfsd over TCP. The guest reaches this host's
	// loopback as 10.0.2.2 (qemu user networking).
	relay := oncrpc.NewTCPTransport(k.TCPAddr, oncrpc.TCPOptions{})
	defer relay.Close()
	resp, err := rpcrdma.Listen("127.0.0.1:0", rpcrdma.ResponderConfig{
		Provider: &iwarp.Provider{}, Handler: oncrpc.Relay(relay, time.Minute),
		ReplyBulk: nfsclient.ReplyBulk, RemoteInvalidate: true,
	})
	if err != nil {
		t.Fatalf("host responder: %v", err)
	}
	defer resp.Close()
	_, respPort, err := net.SplitHostPort(resp.Addr())
	if err != nil {
		t.Fatal(err)
	}

	var files strings.Builder
	for _, f := range []string{"guest-workload.sh", "guest-bench.sh"} {
		b, err := os.ReadFile(filepath.Join("testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		files.WriteString("cat > /tmp/" + f + " <<'XEOF'\n" + string(b) + "XEOF\n")
	}
	if out, err := k.Exec(ctx, files.String()); err != nil {
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
		t.Run(dev+"/conformance", func(t *testing.T) {
			out, err := k.Exec(ctx, "RDMAFS_CONFORMANCE_DEV="+dev+" RDMAFS_CONFORMANCE_ADDR=10.0.2.15:0 /usr/local/bin/ibverbs.test -test.run '^TestGuestConformance$' -test.v -test.timeout 15m")
			t.Logf("verbs conformance over %s:\n%s", dev, summary(out))
			if err != nil || !strings.Contains(out, "\nPASS") {
				t.Fatalf("conformance suite over %s failed: %v\n%s", dev, err, out)
			}
		})
		t.Run(dev+"/stale", func(t *testing.T) {
			out, err := k.Exec(ctx, "RDMAFS_CONFORMANCE_DEV="+dev+" RDMAFS_CONFORMANCE_ADDR=10.0.2.15:0 /usr/local/bin/ibverbs.test -test.run '^TestGuestStaleBytes$' -test.v -test.timeout 5m")
			if err != nil || !strings.Contains(out, "STALE "+dev) || !strings.Contains(out, "\nPASS") {
				t.Fatalf("stale bytes over %s: %v\n%s", dev, err, out)
			}
			t.Logf("over-claiming server over %s:\n%s", dev, summary(out))
		})
		t.Run(dev+"/exposure", func(t *testing.T) {
			out, err := k.Exec(ctx, "RDMAFS_CONFORMANCE_DEV="+dev+" RDMAFS_CONFORMANCE_ADDR=10.0.2.15:0 /usr/local/bin/ibverbs.test -test.run '^TestGuest(ExposureRate|WindowInvalidated)$' -test.timeout 5m")
			if err != nil || !strings.Contains(out, "EXPOSE "+dev) || !strings.Contains(out, "WINDOWS "+dev) {
				t.Fatalf("exposure rate over %s: %v\n%s", dev, err, out)
			}
			t.Logf("exposure cost over %s (TCG figures are emulation-bound):\n%s", dev, out)
		})
		t.Run(dev+"/exchange", func(t *testing.T) {
			out, err := k.Exec(ctx, "RDMAFS_CONFORMANCE_DEV="+dev+" RDMAFS_CONFORMANCE_ADDR=10.0.2.15:0 /usr/local/bin/ibverbs.test -test.run '^TestGuestWriteExchange$' -test.timeout 10m")
			if err != nil || !strings.Contains(out, "EXCHANGE") {
				t.Fatalf("write exchange over %s: %v\n%s", dev, err, out)
			}
			t.Logf("the WRITE message pattern over the kernel's %s and TCP in the guest (throughput ratios):\n%s", dev, out)
		})
		t.Run(dev+"/knfsd", func(t *testing.T) {
			workload(ctx, t, k, dev, "", "")
		})
		if dev == "rxe0" {
			// The same with memory windows (opt-in: see docs/design.md, rxe
			// bounds window accesses by the chunk, not the window).
			t.Run(dev+"/knfsd-windows", func(t *testing.T) {
				out := workload(ctx, t, k, dev, "", "RDMAFS_IBVERBS_WINDOWS=1 WTAG=mw")
				if !strings.Contains(out, "window binds: ") {
					t.Fatal("the workload did not report its memory-window binds")
				}
			})
		}
		if dev == "siw0" {
			t.Run(dev+"/interop", func(t *testing.T) {
				calls, invs := resp.Calls(), resp.SendInvalidates()
				workload(ctx, t, k, dev, "10.0.2.2 "+respPort, "")
				if resp.Calls() == calls {
					t.Fatal("the host's pure-Go responder served no call")
				}
				// siw invalidated the exposed STags the pure-Go
				// provider named in its Send With Invalidate.
				if resp.SendInvalidates() == invs {
					t.Fatal("the host's pure-Go responder sent no Send With Invalidate")
				}
				t.Logf("host pure-Go responder: %d calls, %d replies with Send With Invalidate", resp.Calls()-calls, resp.SendInvalidates()-invs)
			})
		}
		out, err := k.Exec(ctx, "sh /tmp/guest-bench.sh "+dev)
		if err != nil || !strings.Contains(out, "BENCH") || strings.Contains(out, "failed") {
			t.Errorf("dd over %s: %v\n%s", dev, err, out)
		}
		figures += out
	}
	out, err := k.Exec(ctx, "sh /tmp/guest-bench.sh tcp")
	if err != nil || !strings.Contains(out, "BENCH") || strings.Contains(out, "failed") {
		t.Errorf("dd over tcp: %v\n%s", err, out)
	}
	t.Logf("1 MiB O_DIRECT dd, 64 MiB, inside the guest against its knfsd (TCG figures are emulation-bound):\n%s%s", figures, out)
}

// workload runs guest-workload.sh over dev (with server and port for a
// server other than the guest's knfsd; with env, variable assignments,
// in its environment), checks its trace counts and returns its output.
func workload(ctx context.Context, t *testing.T, k *testpeer.Knfsd, dev, server, env string) string {
	t.Helper()
	start := time.Now()
	out, err := k.Exec(ctx, env+" sh /tmp/guest-workload.sh "+dev+" "+server)
	t.Logf("%s %s workload in %v:\n%s", dev, server, time.Since(start).Round(time.Millisecond), out)
	if err != nil || !strings.Contains(out, "WORKLOAD-OK") {
		log, _ := k.Exec(ctx, "tail -30 /tmp/"+dev+"*.log; dmesg | tail -20")
		t.Fatalf("workload over %s failed: %v\n%s", dev, err, log)
	}
	if server == "" && !strings.Contains(out, "recall ok") {
		t.Error("the workload did no delegation recall")
	}
	for w, what := range map[string]string{`writes=\[[^]]`: "Write chunks", `reply=\[[^]]`: "Reply chunks",
		`read(pos=`: "Read chunks", `ERR_VERS`: "the version-2 probe falling back to version 1"} {
		m := regexp.MustCompile(`trace ` + regexp.QuoteMeta(w) + `: (\d+)`).FindStringSubmatch(out)
		if m == nil || m[1] == "0" {
			t.Errorf("over %s the trace lacks %s (%q)", dev, what, w)
		}
	}
	return out
}

// summary keeps the result lines of a verbose test run.
func summary(out string) string {
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "--- ") || strings.Contains(l, "conformance_guest_test.go") || strings.HasPrefix(l, "STALE") || strings.HasPrefix(l, "PASS") || strings.HasPrefix(l, "FAIL") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}
