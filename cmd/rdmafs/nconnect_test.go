package main

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestNconnectOption(t *testing.T) {
	for _, bad := range []string{"nconnect=0", "nconnect=17", "nconnect=abc", "nconnect=-1", "nconnect"} {
		o := defaultOptions()
		if err := o.set(bad); err == nil || !strings.Contains(err.Error(), "want 1 to 16 connections") {
			t.Errorf("%s: error %v, want \"want 1 to 16 connections\"", bad, err)
		}
	}
	o := defaultOptions()
	if o.NConnect != 1 || strings.Contains(o.String(), "nconnect") {
		t.Errorf("default: nconnect=%d, opts %s", o.NConnect, o.String())
	}
	for _, n := range []string{"1", "4", "16"} {
		o := defaultOptions()
		o.Server = "s"
		if err := o.parseOptionList("proto=rdma,nconnect=" + n); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(o.String(), ",nconnect="+n); got != (n != "1") {
			t.Errorf("nconnect=%s: opts %s", n, o.String())
		}
	}
	help := helpText(t, "mount", "--help")
	if !regexp.MustCompile(`(?m)^\s+nconnect=N\s`).MatchString(help) {
		t.Error("mount --help does not describe nconnect under MOUNT OPTIONS")
	}
}

// TestNconnectStats mounts with nconnect=2 over each transport, moves a
// file through the mount, and finds two connections in rdmafs stats,
// both carrying calls.
func TestNconnectStats(t *testing.T) {
	forEachTransport(t, func(t *testing.T, p peer) {
		mnt := mount(t, p, "nconnect=2")
		dir := testDir(t, mnt)
		data := make([]byte, 4<<20)
		r := rand.New(rand.NewPCG(5, 6))
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		f := filepath.Join(dir, "f")
		if err := os.WriteFile(f, data, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatal("read back differs from the data written")
		}
		out, code := runBin(t, time.Minute, "stats", mnt)
		if code != 0 {
			t.Fatalf("stats: exit %d: %s", code, out)
		}
		if !strings.Contains(out, ",nconnect=2") || !strings.Contains(out, "connections: 2\n") {
			t.Fatalf("stats lack nconnect=2 and its connections:\n%s", out)
		}
		lines := regexp.MustCompile(`(?m)^  connection (\d+): up calls=(\d+) `).FindAllStringSubmatch(out, -1)
		if len(lines) != 2 {
			t.Fatalf("stats show %d connection lines, want 2:\n%s", len(lines), out)
		}
		for _, l := range lines {
			if l[2] == "0" {
				t.Errorf("connection %s carried no calls:\n%s", l[1], out)
			}
		}
	})
}
