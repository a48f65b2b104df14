package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestChunksWithinRWSize mounts over RPC-over-RDMA with rsize and wsize of
// 32 KiB and moves 1 MiB each way with O_DIRECT: every Read chunk (a
// WRITE's payload, registered for remote read) stays within wsize, and
// the data goes as at least 32 WRITEs and 32 READs (RFC 8166 s8.1.4: keep
// chunk sizes within the upper layer's rsize/wsize).
func TestChunksWithinRWSize(t *testing.T) {
	const size = 32 << 10
	forEachRDMAPeer(t, func(t *testing.T, p peer) {
		logf := filepath.Join(t.TempDir(), "trace.log")
		mnt := mountWith(t, p, []string{"-v", "mr", "--log", logf}, fmt.Sprintf("rsize=%d,wsize=%d", size, size))
		d := testDir(t, mnt)
		defer os.RemoveAll(d)
		before := opCounts(t, mnt)
		sh(t, 2*time.Minute, "cd "+d+" && dd if=/dev/urandom of=src bs=1M count=1 2>/dev/null && dd if=src of=f bs=1M oflag=direct 2>/dev/null && dd if=f of=back bs=1M iflag=direct 2>/dev/null && cmp src back")
		after := opCounts(t, mnt)
		if n := after["WRITE"] - before["WRITE"]; n < (2<<20)/size {
			// src and f are written: 2 MiB.
			t.Errorf("%s: %d WRITEs for 2 MiB with wsize %d", p.name, n, size)
		}
		if n := after["READ"] - before["READ"]; n < (2<<20)/size {
			// f is read, and src by dd: 2 MiB.
			t.Errorf("%s: %d READs for 2 MiB with rsize %d", p.name, n, size)
		}
		trace, err := os.ReadFile(logf)
		if err != nil {
			t.Fatal(err)
		}
		readChunks := 0
		for _, l := range strings.Split(string(trace), "\n") {
			i := strings.Index(l, "mr_map ")
			if i < 0 {
				continue
			}
			var xid, stag uint32
			var n int
			var access string
			if _, err := fmt.Sscanf(l[i:], "mr_map xid=%v stag=%v len=%d access=%s", &xid, &stag, &n, &access); err != nil {
				t.Fatalf("%s: trace line %q: %v", p.name, l, err)
			}
			if strings.Contains(access, "RR") {
				readChunks++
				if n > size {
					t.Errorf("%s: Read chunk of %d bytes with wsize %d: %s", p.name, n, size, l)
				}
			}
		}
		t.Logf("%s: %d WRITEs, %d READs, %d Read chunks", p.name, after["WRITE"]-before["WRITE"], after["READ"]-before["READ"], readChunks)
		if readChunks < (2<<20)/size {
			t.Errorf("%s: %d Read chunks registered for 2 MiB of WRITEs", p.name, readChunks)
		}
	})
}
