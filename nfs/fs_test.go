package nfs_test

import (
	"bytes"
	"errors"
	"io/fs"
	"path"
	"testing"
	"testing/fstest"

	"github.com/rdmafs/rdmafs/nfs"
)

// TestFS runs testing/fstest.TestFS, which checks every io/fs interface
// FS implements for consistency (Open, ReadDir, Stat, ReadFile, Sub,
// ReadLink and Lstat, ReadAt and Seek of the files), over a tree made
// through the Client.
func TestFS(t *testing.T) {
	forEachPeer(t, func(t *testing.T, c *nfs.Client, dir string) {
		ctx := testCtx(t)
		big := bytes.Repeat([]byte("0123456789abcdef"), 640) // 10 KiB: fstest reads it in many small pieces
		files := map[string][]byte{
			"hello.txt":       []byte("hello, world\n"),
			"empty":           nil,
			"sub/big.bin":     big,
			"sub/deeper/leaf": []byte("leaf"),
		}
		for _, d := range []string{"sub/deeper", "emptydir"} {
			if err := c.MkdirAll(ctx, path.Join(dir, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for name, data := range files {
			if err := c.WriteFile(ctx, path.Join(dir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Symlink(ctx, "hello.txt", path.Join(dir, "link")); err != nil {
			t.Fatal(err)
		}
		sub, err := fs.Sub(c.FS(), dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := fstest.TestFS(sub, "hello.txt", "empty", "sub/big.bin", "sub/deeper/leaf", "emptydir", "link"); err != nil {
			t.Fatal(err)
		}
		for name, want := range files {
			got, err := fs.ReadFile(sub, name)
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("ReadFile %s: %d bytes, %v; want %d bytes", name, len(got), err, len(want))
			}
		}
		if got, err := fs.ReadFile(sub, "link"); err != nil || string(got) != "hello, world\n" {
			t.Errorf("ReadFile through link: %q, %v", got, err)
		}
		if target, err := fs.ReadLink(sub, "link"); err != nil || target != "hello.txt" {
			t.Errorf("ReadLink: %q, %v", target, err)
		}
		for _, bad := range []string{"/hello.txt", "../x", "sub/", ""} {
			if _, err := sub.Open(bad); !errors.Is(err, fs.ErrInvalid) {
				t.Errorf("Open(%q): %v, want fs.ErrInvalid", bad, err)
			}
		}
		if _, err := fs.Stat(sub, "missing"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Stat missing: %v, want fs.ErrNotExist", err)
		}
	})
}
