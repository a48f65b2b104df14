package main

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// hugeOffset is where xfstests' seek_sanity_test (generic/490) writes
// with a 1 MiB block size: past ext4's 16 TiB, below FATTR4_MAXFILESIZE.
const hugeOffset = 1 << 59

// TestWriteTooFar checks that a write at an offset the export's file
// system cannot hold fails with EFBIG at that write, and leaves the open
// file working: before, it was buffered, and the server's NFS4ERR_FBIG
// came back from a later fstat, fsync or close (xfstests generic/490).
// ganesha reports FATTR4_MAXFILESIZE 2^63-1 for an export on ext4, whose
// files stop at 16 TiB.
func TestWriteTooFar(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	if g.Dir == "" {
		t.Fatal("the ganesha export's directory is not known (RDMAFS_GANESHA_DIR)")
	}
	// The export's own file system must refuse the offset, or there is
	// nothing to test.
	probe, err := os.CreateTemp(g.Dir, "efbig-probe-")
	if err != nil {
		t.Fatal(err)
	}
	_, perr := probe.WriteAt([]byte("x"), hugeOffset)
	probe.Close()
	os.Remove(probe.Name())
	if !errors.Is(perr, syscall.EFBIG) {
		t.Fatalf("a write at 2^59 in the export's directory %s: %v; this test needs a file system that refuses it (ext4)", g.Dir, perr)
	}
	host, port := splitAddr(t, g.Addr)
	mnt := mount(t, peer{name: "ganesha", host: host, port: port, export: g.Export})
	d := testDir(t, mnt)
	defer os.RemoveAll(d)
	f, err := os.Create(filepath.Join(d, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, 4096), hugeOffset); !errors.Is(err, syscall.EFBIG) {
		t.Errorf("write at 2^59: %v, want EFBIG", err)
	}
	if _, err := f.WriteAt([]byte("abc"), 0); err != nil {
		t.Errorf("write at 0 after the refused one: %v", err)
	}
	if st, err := f.Stat(); err != nil || st.Size() != 3 {
		t.Errorf("fstat after the refused write: %v, %v; want size 3", st, err)
	}
	if err := f.Sync(); err != nil {
		t.Errorf("fsync after the refused write: %v", err)
	}
	if err := f.Truncate(hugeOffset); !errors.Is(err, syscall.EFBIG) {
		t.Errorf("ftruncate to 2^59: %v, want EFBIG", err)
	}
	// A write that leaves a small hole goes through and reads back.
	if _, err := f.WriteAt([]byte("z"), 1<<20); err != nil {
		t.Errorf("write past the end: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	b, err := os.ReadFile(f.Name())
	if err != nil || len(b) != 1<<20+1 || string(b[:3]) != "abc" || b[1<<20] != 'z' {
		t.Errorf("read back: %d bytes, %v", len(b), err)
	}
}
