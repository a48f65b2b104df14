package fuse_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/test/testpeer"
)

// TestHandleCacheLinks plants a link to a victim file at the handle
// cache's path, as another user could where the cache's name is
// predictable, and checks that a mount (and its unmount, which saves the
// cache) leaves the victim as it was: a symbolic link is not followed,
// and a hard link is replaced by the new cache, not written through.
func TestHandleCacheLinks(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	p := peer{name: "ganesha", addr: g.Addr, export: g.Export, limitsOf: "ganesha"}
	for _, tc := range []struct {
		name string
		link func(victim, cache string) error
	}{
		{"symlink", os.Symlink},
		{"hardlink", os.Link},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			victim := filepath.Join(dir, "victim")
			precious := []byte("precious contents\n")
			if err := os.WriteFile(victim, precious, 0o644); err != nil {
				t.Fatal(err)
			}
			cache := filepath.Join(dir, "handles")
			if err := tc.link(victim, cache); err != nil {
				t.Fatal(err)
			}
			mnt := filepath.Join(dir, "mnt")
			if err := os.Mkdir(mnt, 0o755); err != nil {
				t.Fatal(err)
			}
			m := serveAt(t, p, mnt, fuse.Options{HandleCache: cache})
			if err := os.WriteFile(filepath.Join(freshDir(t, mnt), "file"), []byte("x"), 0o644); err != nil {
				t.Error(err)
			}
			unmountAll(t, m)

			if got, err := os.ReadFile(victim); err != nil || !bytes.Equal(got, precious) {
				t.Errorf("victim after the mount: %q, %v; want %q unchanged", got, err, precious)
			}
			fi, err := os.Lstat(cache)
			if err != nil {
				t.Fatal(err)
			}
			vi, err := os.Stat(victim)
			if err != nil {
				t.Fatal(err)
			}
			switch tc.name {
			case "symlink":
				if fi.Mode()&os.ModeSymlink == 0 {
					t.Errorf("the planted link was replaced: %v", fi.Mode())
				}
			case "hardlink":
				// The unmount saved a cache of its own in the link's place.
				b, err := os.ReadFile(cache)
				if os.SameFile(fi, vi) || err != nil || !bytes.HasPrefix(b, []byte("rdmafs handles")) {
					t.Errorf("cache after the unmount: same file as the victim %v, %q, %v; want a new cache", os.SameFile(fi, vi), b, err)
				}
				if fi.Mode().Perm() != 0o600 {
					t.Errorf("cache mode %04o, want 0600", fi.Mode().Perm())
				}
			}
		})
	}
}
