package soak

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	MaybeWorker()
	os.Exit(m.Run())
}

// TestRunLocal runs two workers on a local directory, where nothing may
// differ: a check of the workload and its model.
func TestRunLocal(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	res, err := Run(context.Background(), Config{
		Dirs: []string{dir}, Seed: 42, Ops: 3000, Duration: time.Hour, Out: &out,
		OpLog: filepath.Join(t.TempDir(), "ops"),
	})
	t.Logf("%v\n%s", res, out.String())
	if err != nil {
		t.Fatal(err)
	}
	if res.Mismatches != 0 || res.Errors != 0 {
		t.Fatalf("%d mismatches, %d errors on a local directory", res.Mismatches, res.Errors)
	}
	if res.Ops < 6000 || res.Handoffs == 0 {
		t.Fatalf("%d operations, %d handoffs: want at least 6000 and some", res.Ops, res.Handoffs)
	}
	for _, k := range []string{"write", "read", "mapread", "mapwrite", "truncate", "fsync", "reopen", "verify", "handoff", "adopt", "final-verify"} {
		if res.Kinds[k] == 0 {
			t.Errorf("no %s operations: %v", k, res.Kinds)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("files left behind after a clean run: %v", ents)
	}
}

// TestMismatchReport changes a file behind the worker's back and checks
// that the read reports it with the seed, operation and bytes.
func TestMismatchReport(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	cfg := Config{Dirs: []string{dir}, Seed: 7, Out: &out}
	cfg.defaults()
	w := &worker{cfg: cfg, rng: rand.New(rand.NewPCG(1, 2)), res: Result{Kinds: map[string]int64{}}, out: &out, buf: make([]byte, cfg.MaxLen+cfg.MaxOp)}
	f := &file{name: "f", path: filepath.Join(dir, "f"), model: bytes.Repeat([]byte{0xaa}, 10000)}
	if err := os.WriteFile(f.path, f.model, 0o644); err != nil {
		t.Fatal(err)
	}
	w.do(kind{"write", 0, func(w *worker, f *file) error {
		w.desc = "write f off=0 len=10000"
		return nil
	}}, f)
	bad := bytes.Clone(f.model)
	bad[5000] = 0x55
	if err := os.WriteFile(f.path, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	w.do(kind{"verify", 0, (*worker).verifyAll}, f)
	rep := out.String()
	t.Log(rep)
	if w.res.Mismatches != 1 || w.res.Errors != 0 {
		t.Fatalf("mismatches %d errors %d, want 1 and 0", w.res.Mismatches, w.res.Errors)
	}
	for _, s := range []string{"MISMATCH seed=7 worker=0 op=#2", "first difference at file offset 5000", "aa aa 55 aa", "#1 write f off=0 len=10000"} {
		if !strings.Contains(rep, s) {
			t.Errorf("report lacks %q", s)
		}
	}
	// The model took the server's bytes: the same difference is not
	// reported again.
	w.do(kind{"verify", 0, (*worker).verifyAll}, f)
	if w.res.Mismatches != 1 {
		t.Errorf("the same difference was reported again")
	}
}

// TestCutConnections cuts a connection of this process by its remote
// port; the reader sees it end.
func TestCutConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n, err := CutConnections(os.Getpid(), ln.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("cut %d connections, want 1", n)
	}
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after the cut: %v, want EOF", err)
	}
}
