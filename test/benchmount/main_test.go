package main

import (
	"os"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
)

func TestStatTicks(t *testing.T) {
	// Field 2 with spaces and parentheses; utime 1234, stime 56.
	line := "4242 (rdma fs) (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 56 0 0 20 0 9 0 5 0 0\n"
	got, err := statTicks([]byte(line))
	if err != nil || got != 1290 {
		t.Errorf("statTicks = %d, %v; want 1290", got, err)
	}
	for _, bad := range []string{"", "4242 rdmafs S 1", "1 (a) S 1 2 3", "1 (a) S 1 1 1 0 -1 0 0 0 0 0 x 5 0", "1 (a) S 1 1 1 0 -1 0 0 0 0 0 -3 5 0"} {
		if n, err := statTicks([]byte(bad)); err == nil {
			t.Errorf("statTicks(%q) = %d, want an error", bad, n)
		}
	}
}

// TestCPUTimeGrows checks that cpuTime reads this process's CPU time: it
// grows while the process computes.
func TestCPUTimeGrows(t *testing.T) {
	before, err := cpuTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for start := time.Now(); time.Since(start) < time.Minute; {
		for i := range 1 << 22 {
			x += i
		}
		now, err := cpuTime(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if now-before >= 30*time.Millisecond {
			return
		}
	}
	t.Errorf("cpu time did not grow by 30ms in a minute of computing (x=%d)", x)
}

func TestCPUTimeNoProcess(t *testing.T) {
	if d, err := cpuTime(-1); err == nil {
		t.Errorf("cpuTime(-1) = %v, want an error", d)
	}
}

// TestFloorNoPassthrough checks that the floor's files cannot hand the
// kernel their backing file, while the plain loopback's can.
func TestFloorNoPassthrough(t *testing.T) {
	if _, ok := fs.FileHandle(&fs.LoopbackFile{}).(fs.FilePassthroughFder); !ok {
		t.Fatal("fs.LoopbackFile no longer implements FilePassthroughFder: floorFile is not needed")
	}
	fh := noPassthrough(&fs.LoopbackFile{})
	if _, ok := fh.(fs.FilePassthroughFder); ok {
		t.Error("floor file implements FilePassthroughFder")
	}
	for _, iface := range []struct {
		name string
		ok   bool
	}{
		{"reader", is[fs.FileReader](fh)},
		{"writer", is[fs.FileWriter](fh)},
		{"flusher", is[fs.FileFlusher](fh)},
		{"fsyncer", is[fs.FileFsyncer](fh)},
		{"releaser", is[fs.FileReleaser](fh)},
		{"getattrer", is[fs.FileGetattrer](fh)},
	} {
		if !iface.ok {
			t.Errorf("floor file lost the loopback's %s", iface.name)
		}
	}
}

func is[T any](v any) bool {
	_, ok := v.(T)
	return ok
}
