package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestPruneHandleCaches: handle caches not saved for a long time go,
// unless a live mount holds one or it is the one about to be used.
func TestPruneHandleCaches(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-30 * 24 * time.Hour)
	mk := func(name string, mtime time.Time) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return p
	}
	stale := mk("a.handles", old)
	fresh := mk("b.handles", time.Now())
	keep := mk("c.handles", old)
	held := mk("d.handles", old)
	other := mk("e.other", old)
	f, err := os.Open(held)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}

	pruneHandleCaches(dir, keep, time.Now().Add(-handleCacheMaxAge))
	for p, want := range map[string]bool{stale: false, fresh: true, keep: true, held: true, other: true} {
		if _, err := os.Stat(p); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", filepath.Base(p), err == nil, want)
		}
	}
}
