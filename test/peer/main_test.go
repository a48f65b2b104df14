package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// TestGaneshaUpUntilStdinCloses runs peer as scripts/xfstests.sh does:
// the server answers at the address it prints before READY, the
// directories asked for are in the export, and closing stdin stops the
// server and keeps its log where -logs says.
func TestGaneshaUpUntilStdinCloses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nfs-ganesha")
	}
	logs := t.TempDir()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(context.Background(), []string{"-server", "ganesha", "-dirs", "test-1,scratch-1", "-logs", logs}, inR, outW)
		outW.Close()
		done <- err
	}()

	vars := map[string]string{}
	sc := bufio.NewScanner(outR)
	ready := false
	for sc.Scan() {
		if sc.Text() == "READY" {
			ready = true
			break
		}
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			t.Fatalf("peer printed %q, want NAME=VALUE or READY", sc.Text())
		}
		vars[k] = v
	}
	if !ready {
		t.Fatalf("peer ended without READY: %v", <-done)
	}
	go func() { _, _ = io.Copy(io.Discard, outR) }()
	if vars["PEER_EXPORT"] != "/export" || vars["PEER_DIR"] == "" || vars["PEER_LOG"] == "" {
		t.Fatalf("peer's variables: %v", vars)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := testpeer.NullCall(ctx, vars["PEER_TCP"]); err != nil {
		t.Fatalf("the server peer printed does not answer: %v", err)
	}
	for _, d := range []string{"test-1", "scratch-1"} {
		if fi, err := os.Stat(filepath.Join(vars["PEER_DIR"], d)); err != nil || !fi.IsDir() {
			t.Errorf("export lacks %s: %v", d, err)
		}
	}

	inW.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("peer: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("peer still runs a minute after its stdin closed")
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	if err := testpeer.NullCall(ctx2, vars["PEER_TCP"]); err == nil {
		t.Error("the server still answers after peer stopped")
	}
	if _, err := os.Stat(filepath.Join(logs, "ganesha.log")); err != nil {
		t.Errorf("the server's log was not kept: %v", err)
	}
}
