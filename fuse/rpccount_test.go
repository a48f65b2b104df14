package fuse_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/test/testpeer"
)

// opCounts is the COMPOUNDs a mount sent, by main operation.
type opCounts map[string]uint64

func countOps(m *fuse.Mount) opCounts {
	ops, _ := m.FS.Client().Snapshot()
	c := opCounts{}
	for _, o := range ops {
		c[o.Op] = o.Count
	}
	return c
}

// since returns c minus before, without zero entries.
func (c opCounts) since(before opCounts) opCounts {
	d := opCounts{}
	for op, n := range c {
		if k := n - before[op]; k != 0 {
			d[op] = k
		}
	}
	return d
}

func (c opCounts) total() uint64 {
	var t uint64
	for _, n := range c {
		t += n
	}
	return t
}

// waitOps waits until m has sent at least n COMPOUNDs of op since
// before: the kernel sends RELEASE (our CLOSE) after close(2) returns.
// The deadline only catches a CLOSE that never comes.
func waitOps(t *testing.T, m *fuse.Mount, before opCounts, op string, n uint64) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); countOps(m).since(before)[op] < n; {
		if time.Now().After(deadline) {
			t.Fatalf("no %d %s COMPOUNDs: %v", n, op, countOps(m).since(before))
		}
		time.Sleep(time.Millisecond)
	}
}

// tcpPeers are the servers over TCP: counting COMPOUNDs does not depend
// on the transport.
func tcpPeers(t *testing.T, f func(t *testing.T, p peer)) {
	eachWay(t, []testpeer.Way{testpeer.KnfsdTCP, testpeer.GaneshaTCP}, f)
}

// TestSmallFileRPCs counts the COMPOUNDs of the small-file and metadata
// steps of tar x, ls -l and rm -rf. The bounds come from the protocol,
// with the Linux client as the bar:
//
//   - creating and writing a small file is OPEN(create) + WRITE + CLOSE,
//     as on Linux, plus the LOOKUP the kernel sends before a FUSE
//     create (Linux's atomic_open sends none): the directory's
//     attributes come back in the OPEN's COMPOUND, so the kernel's
//     permission check of the directory for the next create sends no
//     GETATTR, and the flush's WRITE brings the file's;
//   - chmod, chown and utimes are one SETATTR each, with no GETATTR;
//   - listing a cold directory is READDIRs only: no LOOKUP or GETATTR
//     per entry (READDIR's attributes fill the kernel's cache);
//   - rm -rf is one REMOVE per entry plus the READDIR, with no GETATTR
//     of the directory between REMOVEs.
func TestSmallFileRPCs(t *testing.T) {
	tcpPeers(t, func(t *testing.T, p peer) {
		mnt, m := mountPeer(t, p, fuse.Options{})
		top := freshDir(t, mnt)
		data := bytes.Repeat([]byte("rdmafs small-file workload\n"), 80)

		before := countOps(m)
		d := filepath.Join(top, "d")
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		// The LOOKUP of "d" before the mkdir is the kernel's.
		if got := countOps(m).since(before); got["CREATE"] != 1 || got["LOOKUP"] != 1 || got.total() != 2 {
			t.Errorf("mkdir: %v, want LOOKUP=1 CREATE=1 only", got)
		}

		const files = 8
		for i := range files {
			before := countOps(m)
			name := filepath.Join(d, fmt.Sprintf("f%d.c", i))
			f := createWritten(t, name, data)
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			waitOps(t, m, before, "CLOSE", 1)
			if got := countOps(m).since(before); got["OPEN"] != 1 || got["WRITE"] != 1 || got["CLOSE"] != 1 || got["LOOKUP"] != 1 || got.total() != 4 {
				t.Errorf("file %d: create+write+close took %v, want LOOKUP=1 OPEN=1 WRITE=1 CLOSE=1 only", i, got)
			}

			before = countOps(m)
			if err := os.Chmod(name, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(name, os.Getuid(), os.Getgid()); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(name, time.Unix(1e9, 0), time.Unix(1e9, 0)); err != nil {
				t.Fatal(err)
			}
			if got := countOps(m).since(before); got["SETATTR"] != 3 || got.total() != 3 {
				t.Errorf("file %d: chmod, chown, utimes took %v, want SETATTR=3 only", i, got)
			}
		}

		// A second mount lists the directory cold, then removes it.
		mnt2, m2 := mountPeer(t, p, fuse.Options{})
		d2 := filepath.Join(mnt2, filepath.Base(top), "d")
		if _, err := os.Stat(d2); err != nil {
			t.Fatal(err)
		}
		before = countOps(m2)
		out, err := exec.Command("ls", "-l", d2).CombinedOutput()
		if err != nil || bytes.Count(out, []byte(".c\n")) != files {
			t.Fatalf("ls -l: %v:\n%s", err, out)
		}
		if got := countOps(m2).since(before); got["READDIR"] < 1 || got.total() != got["READDIR"] {
			t.Errorf("ls -l of %d entries: %v, want READDIRs only", files, got)
		}

		before = countOps(m2)
		if out, err := exec.Command("rm", "-rf", d2).CombinedOutput(); err != nil {
			t.Fatalf("rm -rf: %v: %s", err, out)
		}
		got := countOps(m2).since(before)
		// The GETATTRs are of the directory, before and after rm reads
		// it (READDIR moves its atime, which Linux revalidates too):
		// a few per directory, none per entry.
		if got["REMOVE"] != files+1 || got["GETATTR"] > 3 || got["LOOKUP"] != 0 || got.total() > files+1+got["READDIR"]+3 {
			t.Errorf("rm -rf of %d files and their directory: %v, want REMOVE=%d, the READDIRs and at most 3 GETATTRs", files, got, files+1)
		}
	})
}

// TestTarFileRPCs counts the COMPOUNDs of one file as tar x makes it:
// create, write, then futimens, fchown and fchmod on the open file, and
// close. Create+write+close is LOOKUP+OPEN+WRITE+CLOSE as in
// TestSmallFileRPCs; the three SETATTRs are tar's own (Linux sends them
// too), and the buffered write goes out in the first one's COMPOUND
// (fold.go), so the WRITE costs no round trip of its own: 6 COMPOUNDs,
// where Linux, flushing before its SETATTR, sends OPEN, WRITE, 3
// SETATTRs and CLOSE. The file must come out with the data, the mtime
// and the mode set: a WRITE sent after the SETATTR would move the mtime.
func TestTarFileRPCs(t *testing.T) {
	tcpPeers(t, func(t *testing.T, p peer) {
		mnt, m := mountPeer(t, p, fuse.Options{})
		top := freshDir(t, mnt)
		data := bytes.Repeat([]byte("rdmafs tar x workload\n"), 93) // 2046 bytes
		mtime := time.Unix(1e9, 0)
		const files = 4
		for i := range files {
			before := countOps(m)
			name := filepath.Join(top, fmt.Sprintf("f%d.c", i))
			f := createWritten(t, name, data)
			// A zero atime is UTIME_OMIT, as tar sends it.
			if err := os.Chtimes(name, time.Time{}, mtime); err != nil {
				t.Fatal(err)
			}
			if err := f.Chown(os.Getuid(), os.Getgid()); err != nil {
				t.Fatal(err)
			}
			if err := f.Chmod(0o644); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			waitOps(t, m, before, "CLOSE", 1)
			got := countOps(m).since(before)
			if got["LOOKUP"] != 1 || got["OPEN"] != 1 || got["WRITE"] != 1 || got["SETATTR"] != 2 || got["CLOSE"] != 1 || got.total() != 6 {
				t.Errorf("file %d: tar's create, write, utimes, chown, chmod, close took %v, want LOOKUP=1 OPEN=1 WRITE=1 (with the first SETATTR) SETATTR=2 CLOSE=1 only", i, got)
			}
		}

		// A second mount sees what the server has.
		mnt2, _ := mountPeer(t, p, fuse.Options{})
		for i := range files {
			name := filepath.Join(mnt2, filepath.Base(top), fmt.Sprintf("f%d.c", i))
			st, err := os.Stat(name)
			if err != nil {
				t.Fatal(err)
			}
			if !st.ModTime().Equal(mtime) || st.Mode().Perm() != 0o644 || st.Size() != int64(len(data)) {
				t.Errorf("file %d: mtime %v mode %v size %d, want %v -rw-r--r-- %d", i, st.ModTime(), st.Mode(), st.Size(), mtime, len(data))
			}
			if b, err := os.ReadFile(name); err != nil || !bytes.Equal(b, data) {
				t.Errorf("file %d: read back %d bytes (%v), differs from the %d written", i, len(b), err, len(data))
			}
		}
	})
}

// TestWriteStatRPCs checks that a stat of a file with buffered writes
// (the kernel drops its cached size and mtime after a write) takes the
// attributes from the flush's WRITE, which asks for them: no GETATTR.
func TestWriteStatRPCs(t *testing.T) {
	tcpPeers(t, func(t *testing.T, p peer) {
		mnt, m := mountPeer(t, p, fuse.Options{})
		top := freshDir(t, mnt)
		data := bytes.Repeat([]byte("x"), 3001)
		before := countOps(m)
		f, err := os.Create(filepath.Join(top, "f"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
		st, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() != int64(len(data)) {
			t.Errorf("size %d after writing %d", st.Size(), len(data))
		}
		if got := countOps(m).since(before); got["WRITE"] != 1 || got["GETATTR"] != 0 {
			t.Errorf("create, write, fstat: %v, want WRITE=1 and no GETATTR", got)
		}
	})
}

// createWritten creates name (it must be new) and writes data to it, as
// tar x does for each file, and returns the file still open.
func createWritten(t *testing.T, name string, data []byte) *os.File {
	t.Helper()
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		t.Fatal(err)
	}
	return f
}
