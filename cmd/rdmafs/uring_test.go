package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/fuse"
)

// TestFUSETransport mounts with -o uring and with nouring and checks
// what rdmafs stats says carried the kernel's requests: io_uring with
// requests counted on its rings, or /dev/fuse with none; nouring wins
// over $RDMAFS_URING (make test's second pass sets it).
func TestFUSETransport(t *testing.T) {
	forEachTransport(t, func(t *testing.T, p peer) {
		for _, c := range []struct{ opt, transport string }{
			{"uring", "io_uring"},
			{"nouring", "/dev/fuse"},
		} {
			mnt := mount(t, p, c.opt)
			d := testDir(t, mnt)
			want := bytes.Repeat([]byte("ring"), 300<<10)
			name := filepath.Join(d, "f")
			if err := os.WriteFile(name, want, 0o644); err != nil {
				t.Fatalf("%s -o %s: %v", p.name, c.opt, err)
			}
			if got, err := os.ReadFile(name); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s -o %s: read back %d bytes (%v), want the %d written", p.name, c.opt, len(got), err, len(want))
			}
			out, code := runBin(t, time.Minute, "stats", mnt)
			if code != 0 {
				t.Fatalf("rdmafs stats: exit %d: %s", code, out)
			}
			m := regexp.MustCompile(`(?m)^fuse transport: (\S+) ring_requests=(\d+)$`).FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("%s -o %s: no fuse transport line in:\n%s", p.name, c.opt, out)
			}
			n, _ := strconv.Atoi(m[2])
			if m[1] != c.transport || (c.transport == "io_uring") != (n > 0) {
				t.Errorf("%s -o %s: fuse transport %s with %d ring requests, want %s", p.name, c.opt, m[1], n, c.transport)
			}
			os.RemoveAll(d)
		}
	})
}

func TestURingOptions(t *testing.T) {
	for opt, want := range map[string]fuse.URingMode{
		"uring": fuse.URingOn, "uring=on": fuse.URingOn, "uring=auto": fuse.URingAuto,
		"uring=off": fuse.URingOff, "nouring": fuse.URingOff,
	} {
		o := defaultOptions()
		o.URing = fuse.URingAuto + fuse.URingOn // neither: set must set it
		if err := o.set(opt); err != nil || o.URing != want {
			t.Errorf("%s: %v, %v; want %v", opt, o.URing, err, want)
		}
	}
	for opt, want := range map[string]string{
		"uring=maybe": "want on, auto or off",
		"nouring=1":   "takes no value",
	} {
		o := defaultOptions()
		if err := o.set(opt); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", opt, err, want)
		}
	}
}

func TestURingDefault(t *testing.T) {
	for env, want := range map[string]fuse.URingMode{"": fuse.URingOff, "on": fuse.URingOn, "auto": fuse.URingAuto, "off": fuse.URingOff} {
		t.Setenv(uringEnv, env)
		if got, err := defaultURing(); err != nil || got != want {
			t.Errorf("%s=%q: %v, %v; want %v", uringEnv, env, got, err, want)
		}
	}
	t.Setenv(uringEnv, "yes")
	if _, err := defaultURing(); err == nil || !strings.Contains(err.Error(), "RDMAFS_URING=yes") {
		t.Errorf("RDMAFS_URING=yes: error %v", err)
	}
	// The binary says so and does not mount.
	out, code := runBin(t, time.Minute, "mount", "127.0.0.1:/x", t.TempDir())
	if code == 0 || !strings.Contains(out, "RDMAFS_URING=yes") {
		t.Errorf("mount with RDMAFS_URING=yes: exit %d: %s", code, out)
	}
}
