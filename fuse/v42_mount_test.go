package fuse_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fuse"
)

// TestRenameFlags checks that renameat2(2) with any flag fails with
// EINVAL and changes nothing, as through Linux's NFS client: NFS cannot
// rename without replacing, atomically (fuse/node.go Rename). The VFS
// itself answers EEXIST for RENAME_NOREPLACE onto a name it has cached
// (do_renameat2), before the file system sees the rename.
func TestRenameFlags(t *testing.T) {
	tcpPeers(t, func(t *testing.T, p peer) {
		mnt, _ := mountPeer(t, p, fuse.Options{})
		d := freshDir(t, mnt)
		defer os.RemoveAll(d)
		a, b, c := filepath.Join(d, "a"), filepath.Join(d, "b"), filepath.Join(d, "c")
		for _, f := range []string{a, b} {
			if err := os.WriteFile(f, []byte(filepath.Base(f)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for _, tc := range []struct {
			name     string
			from, to string
			flags    uint
			want     error
		}{
			{"noreplace to a new name", a, c, unix.RENAME_NOREPLACE, unix.EINVAL},
			{"noreplace over a file", a, b, unix.RENAME_NOREPLACE, unix.EEXIST},
			{"exchange", a, b, unix.RENAME_EXCHANGE, unix.EINVAL},
			{"whiteout", a, c, unix.RENAME_WHITEOUT, unix.EINVAL},
		} {
			err := unix.Renameat2(unix.AT_FDCWD, tc.from, unix.AT_FDCWD, tc.to, tc.flags)
			if !errors.Is(err, tc.want) {
				t.Errorf("renameat2 %s: %v, want %v", tc.name, err, tc.want)
			}
		}
		for f, want := range map[string]string{a: "a", b: "b"} {
			if got, err := os.ReadFile(f); err != nil || string(got) != want {
				t.Errorf("%s after the refused renames: %q, %v; want %q", f, got, err, want)
			}
		}
		if _, err := os.Lstat(c); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after the refused renames: %v, want ENOENT", c, err)
		}
	})
}
