package main

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// TestRDMAMemoryStats writes and reads 64 MiB with 1 MiB O_DIRECT through
// a proto=rdma mount and checks what `rdmafs stats` reports of the
// registered memory: every call after the first few reused a
// fast-registration region (>= 99%), the slab stays within the rdmamem
// budget, nothing is exposed between calls, and file data was copied once
// on the way in (FUSE into the slab) and not at all in the transport on
// the way out where the server sends large RDMA Writes.
func TestRDMAMemoryStats(t *testing.T) {
	forEachRDMAPeer(t, func(t *testing.T, p peer) {
		mnt := mount(t, p, "rdmamem=32M")
		d := testDir(t, mnt)
		const mib = 64
		src, back := filepath.Join(t.TempDir(), "src"), filepath.Join(t.TempDir(), "back")
		sh(t, 5*time.Minute, fmt.Sprintf(`cd %s && dd if=/dev/urandom of=%s bs=1M count=%d status=none &&
			dd if=%[2]s of=f bs=1M oflag=direct status=none &&
			dd if=f of=%[4]s bs=1M iflag=direct status=none &&
			cmp %[2]s %[4]s`, d, src, mib, back))
		out, code := runBin(t, time.Minute, "stats", mnt)
		if code != 0 {
			t.Fatalf("rdmafs stats: exit %d: %s", code, out)
		}
		t.Logf("%s: stats:\n%s", p.name, out)
		num := func(key string) float64 {
			t.Helper()
			m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(key) + `[:=]\s*([0-9.]+)`).FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("stats lack %q", key)
			}
			v, err := strconv.ParseFloat(m[1], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		// The transport reserves a fast-registration region per
		// credit (128); calls bind and invalidate those.
		if r := num("mr reuse rate"); r < 99 {
			t.Errorf("registration reuse %.2f%%, want >= 99%%", r)
		}
		if n := num("mr fast regions"); n != 128 {
			t.Errorf("%v fast-registration regions, want the 128 reserved", n)
		}
		if reg, budget := num("mr bytes registered"), num("mr budget"); reg == 0 || reg > budget || budget != 32<<20 {
			t.Errorf("registered %v bytes, budget %v (rdmamem=32M)", reg, budget)
		}
		if live := num("mr live exposures"); live != 0 {
			t.Errorf("%v exposures live with no call in flight", live)
		}
		fuseCopied := regexp.MustCompile(`data copies: fuse=(\d+) nfs=(\d+)`).FindStringSubmatch(out)
		if fuseCopied == nil {
			t.Fatal("stats lack the data copies line")
		}
		if v, _ := strconv.Atoi(fuseCopied[1]); v != mib<<20 {
			t.Errorf("FUSE layer copied %d bytes for a %d MiB write, want exactly one copy", v, mib)
		}
		if v, _ := strconv.Atoi(fuseCopied[2]); v > 1<<20 {
			t.Errorf("NFS layer copied %d bytes of READ data; READs should come by Write chunk", v)
		}
		transport := num("bytes copied")
		if p.knfsd == nil && transport > 2<<20 {
			// Our responder sends 64 KiB FPDUs: only the first of a
			// burst may be partly buffered.
			t.Errorf("transport copied %v bytes for %d MiB each way", transport, mib)
		}
		t.Logf("%s: transport copied %v bytes of %d MiB read (Linux siw sends one FPDU per TCP segment; those go through the provider's buffered reader)",
			p.name, transport, mib)
	})
}

// TestDataCopiesTCP: over TCP a 1 MiB O_DIRECT WRITE is copied once in
// user space (into the write-back buffer; the socket write is the
// kernel's). A READ that one NFS READ answers goes to the kernel straight
// from the reply (nfsclient.ReadInPlace): no copy; one that takes several
// (rsize below 1 MiB, as knfsd's 124 KiB) is gathered with one copy.
func TestDataCopiesTCP(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		mnt := mount(t, p)
		d := testDir(t, mnt)
		const mib = 16
		sh(t, 5*time.Minute, fmt.Sprintf(`cd %s && dd if=/dev/zero of=f bs=1M count=%d oflag=direct status=none &&
			dd if=f of=/dev/null bs=1M iflag=direct status=none`, d, mib))
		out, code := runBin(t, time.Minute, "stats", mnt)
		if code != 0 {
			t.Fatalf("rdmafs stats: exit %d: %s", code, out)
		}
		m := regexp.MustCompile(`data copies: fuse=(\d+) nfs=(\d+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("stats lack the data copies line:\n%s", out)
		}
		if v, _ := strconv.Atoi(m[1]); v != mib<<20 {
			t.Errorf("FUSE layer copied %d bytes for a %d MiB write, want one copy", v, mib)
		}
		rsize := regexp.MustCompile(`(?m)^server: .* rsize=(\d+)`).FindStringSubmatch(out)
		if rsize == nil {
			t.Fatalf("stats lack rsize:\n%s", out)
		}
		want := 0 // in place
		if n, _ := strconv.Atoi(rsize[1]); n < 1<<20 {
			want = mib << 20 // gathered from several replies
		}
		if v, _ := strconv.Atoi(m[2]); v != want {
			t.Errorf("NFS layer copied %d bytes for a %d MiB read with rsize %s, want %d", v, mib, rsize[1], want)
		}
	})
}
