package fuse_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fuse"
)

// sillyNames lists the ".nfs" names in dir.
func sillyNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".nfs") {
			s = append(s, e.Name())
		}
	}
	return s
}

// waitNoSilly waits until dir has no ".nfs" names: the kernel sends
// RELEASE after close(2) returns. The deadline only catches a name that
// is never removed.
func waitNoSilly(t *testing.T, dir string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s := sillyNames(t, dir)
		if len(s) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v still in %s after the last close", s, dir)
		}
	}
}

// fstatOK checks that fstat of fd works and finds the type wanted.
func fstatOK(t *testing.T, fd int, what string, typ uint32) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatalf("fstat of %s: %v", what, err)
	}
	if st.Mode&unix.S_IFMT != typ {
		t.Errorf("fstat of %s: mode %o, want type %o", what, st.Mode, typ)
	}
	return st
}

// TestRenameOverOpen is xfstests generic/035 and an unlink of an open
// file, through one mount: a file or directory renamed over (or a file
// removed) while open stays usable through its descriptor, fstat and
// read work, fstat shows no links (as generic/035 checks), and the
// ".nfs" name it was renamed to in the meantime goes
// at the last close, as with the Linux client. Before, fstat of the
// directory failed with ESTALE (the server had removed it).
func TestRenameOverOpen(t *testing.T) {
	tcpPeers(t, func(t *testing.T, p peer) {
		mnt, _ := mountPeer(t, p, fuse.Options{})
		top := freshDir(t, mnt)
		old, src := []byte("the file renamed over\n"), []byte("the file renamed\n")
		f1, f2 := filepath.Join(top, "f1"), filepath.Join(top, "f2")
		for name, data := range map[string][]byte{f1: src, f2: old} {
			if err := os.WriteFile(name, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		fd, err := unix.Open(f2, unix.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(f1, f2); err != nil {
			t.Fatal(err)
		}
		if st := fstatOK(t, fd, "a file renamed over", unix.S_IFREG); st.Nlink != 0 {
			t.Errorf("fstat of a file renamed over: nlink %d, want 0", st.Nlink)
		}
		buf := make([]byte, 100)
		n, err := unix.Pread(fd, buf, 0)
		if err != nil || !bytes.Equal(buf[:n], old) {
			t.Errorf("read of a file renamed over: %q, %v; want %q", buf[:n], err, old)
		}
		if b, err := os.ReadFile(f2); err != nil || !bytes.Equal(b, src) {
			t.Errorf("the new %s reads %q, %v; want %q", f2, b, err, src)
		}
		t.Logf("%s: open file renamed over: silly names %v", p.name, sillyNames(t, top))
		unix.Close(fd)
		waitNoSilly(t, top)

		// Unlink of an open file.
		fd, err = unix.Open(f2, unix.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(f2); err != nil {
			t.Fatal(err)
		}
		if st := fstatOK(t, fd, "an unlinked file", unix.S_IFREG); st.Nlink != 0 {
			t.Errorf("fstat of an unlinked file: nlink %d, want 0", st.Nlink)
		}
		if n, err := unix.Pread(fd, buf, 0); err != nil || !bytes.Equal(buf[:n], src) {
			t.Errorf("read of an unlinked open file: %q, %v; want %q", buf[:n], err, src)
		}
		if _, err := os.Stat(f2); !os.IsNotExist(err) {
			t.Errorf("stat of the unlinked name: %v, want ENOENT", err)
		}
		unix.Close(fd)
		waitNoSilly(t, top)

		// A directory renamed over while open (generic/035's second half).
		d1, d2 := filepath.Join(top, "d1"), filepath.Join(top, "d2")
		for _, d := range []string{d1, d2} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		// An open directory that is not empty cannot be renamed over:
		// it is not renamed out of the way either.
		full := filepath.Join(top, "full")
		if err := os.MkdirAll(filepath.Join(full, "x"), 0o755); err != nil {
			t.Fatal(err)
		}
		ffd, err := unix.Open(full, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Rename(d1, full); err != unix.ENOTEMPTY && err != unix.EEXIST {
			t.Errorf("rename over an open directory that is not empty: %v, want ENOTEMPTY or EEXIST", err)
		}
		if s := sillyNames(t, top); len(s) != 0 {
			t.Errorf("%v left after a failed rename", s)
		}
		if _, err := os.Stat(filepath.Join(full, "x")); err != nil {
			t.Errorf("the directory not renamed over: %v", err)
		}
		unix.Close(ffd)
		if err := os.RemoveAll(full); err != nil {
			t.Fatal(err)
		}
		fd, err = unix.Open(d2, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		defer unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Rename(d1, d2); err != nil { // os.Rename refuses a directory target
			t.Fatal(err)
		}
		if st := fstatOK(t, fd, "a directory renamed over", unix.S_IFDIR); st.Nlink != 0 {
			t.Errorf("fstat of a directory renamed over: nlink %d, want 0", st.Nlink)
		}
		if _, err := os.Stat(d1); !os.IsNotExist(err) {
			t.Errorf("stat of the renamed name: %v, want ENOENT", err)
		}
		unix.Close(fd)
		waitNoSilly(t, top)
		if err := os.Remove(d2); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(top); err != nil {
			t.Errorf("rmdir of the emptied directory: %v", err)
		}
	})
}

// TestRenameOverOpenTwoMounts: a file or directory open through one
// mount is renamed over through another. The file stays readable by its
// open state; fstat of the directory, asked of the server each time
// (actimeo=0), is answered from the cached attributes with no links
// instead of failing with ESTALE.
func TestRenameOverOpenTwoMounts(t *testing.T) {
	tcpPeers(t, func(t *testing.T, p peer) {
		mntA, _ := mountPeer(t, p, fuse.Options{NoAC: true})
		mntB, _ := mountPeer(t, p, fuse.Options{})
		top := freshDir(t, mntA)
		topB := filepath.Join(mntB, filepath.Base(top))
		old := []byte("open through mount A\n")
		if err := os.WriteFile(filepath.Join(top, "f2"), old, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(top, "f1"), []byte("new"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, d := range []string{"d1", "d2"} {
			if err := os.Mkdir(filepath.Join(top, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		fd, err := unix.Open(filepath.Join(top, "f2"), unix.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		dfd, err := unix.Open(filepath.Join(top, "d2"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(dfd)
		fstatOK(t, dfd, "the directory before", unix.S_IFDIR)

		if err := os.Rename(filepath.Join(topB, "f1"), filepath.Join(topB, "f2")); err != nil {
			t.Fatal(err)
		}
		if err := unix.Rename(filepath.Join(topB, "d1"), filepath.Join(topB, "d2")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 100)
		if n, err := unix.Pread(fd, buf, 0); err != nil || !bytes.Equal(buf[:n], old) {
			t.Errorf("read of a file another mount renamed over: %q, %v; want %q", buf[:n], err, old)
		}
		st := fstatOK(t, dfd, "a directory another mount renamed over", unix.S_IFDIR)
		t.Logf("%s: fstat of the directory renamed over elsewhere: nlink %d", p.name, st.Nlink)
	})
}

// TestUnlinkAfterClose removes files right after closing them, many
// times: the kernel sends RELEASE without waiting for it, so the unlink
// may be served while the file still counts as open and be turned into
// a silly rename; the last close must still remove that name, whichever
// of the two finishes first (a ".nfs" name left behind is a leak).
func TestUnlinkAfterClose(t *testing.T) {
	tcpPeers(t, func(t *testing.T, p peer) {
		mnt, _ := mountPeer(t, p, fuse.Options{})
		top := freshDir(t, mnt)
		for i := range 100 {
			name := filepath.Join(top, "f")
			if err := os.WriteFile(name, []byte{byte(i)}, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(name); err != nil {
				t.Fatalf("remove after close, round %d: %v", i, err)
			}
		}
		waitNoSilly(t, top)
	})
}
