package fuse_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/test/testpeer"
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
			// Retried on EINTR as package os retries its calls: a signal
			// (Go's preemption too) interrupts the FUSE LOOKUP of the
			// path, which may answer EINTR.
			var err error
			for err = unix.EINTR; err == unix.EINTR; {
				err = unix.Renameat2(unix.AT_FDCWD, tc.from, unix.AT_FDCWD, tc.to, tc.flags)
			}
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

// v42Support is what each server does of NFSv4.2 (RFC 7862, RFC 8276),
// as observed through the mount; docs/design.md's table says the same.
var v42Support = map[string]map[string]bool{
	"knfsd":   {"ALLOCATE": true, "DEALLOCATE": true, "SEEK": true, "COPY": true, "XATTR": true},
	"ganesha": {"ALLOCATE": true, "DEALLOCATE": true, "SEEK": true, "COPY": false, "XATTR": false},
}

// v42Peers runs f over TCP on knfsd and ganesha, and over RPC-over-RDMA
// on knfsd.
func v42Peers(t *testing.T, f func(t *testing.T, p peer)) {
	tcpPeers(t, f)
	t.Run("knfsd-rdma", func(t *testing.T) {
		k := testpeer.RequireKnfsd(t)
		f(t, peer{name: "knfsd-rdma", addr: k.RDMAAddr, export: "/", rdma: true, limitsOf: "knfsd"})
	})
}

// v42Dir mounts p, requires NFSv4.2 and makes a fresh directory on the
// mount, removed when the test ends.
func v42Dir(t *testing.T, p peer) (mnt string, m *fuse.Mount, dir string) {
	t.Helper()
	mnt, m = mountPeer(t, p, fuse.Options{})
	requireV42(t, m)
	dir = freshDir(t, mnt)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return mnt, m, dir
}

// requireV42 fails the test unless the mount speaks NFSv4.2.
func requireV42(t *testing.T, m *fuse.Mount) {
	t.Helper()
	if s := m.FS.V42Stats(); s.Minor != 2 {
		t.Fatalf("the mount speaks NFSv4.%d, want 4.2", s.Minor)
	}
}

// pread reads n bytes at off of f.
func pread(t *testing.T, f *os.File, off int64, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	k, err := f.ReadAt(b, off)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("read %d at %d: %v", n, off, err)
	}
	return b[:k]
}

func fstatSize(t *testing.T, f *os.File) int64 {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestFallocate checks fallocate(2) through the mount (fuse/v42.go
// fallocPlan): mode 0 extends the file with zeros, KEEP_SIZE leaves the
// size, PUNCH_HOLE|KEEP_SIZE and ZERO_RANGE zero their range and keep
// the data around it, and COLLAPSE_RANGE/INSERT_RANGE are EOPNOTSUPP.
// A write still buffered by the mount is written before the punch, so
// the punch wins.
func TestFallocate(t *testing.T) {
	v42Peers(t, func(t *testing.T, p peer) {
		_, _, d := v42Dir(t, p)
		f, err := os.OpenFile(filepath.Join(d, "f"), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if !v42Support[p.limitsOf]["ALLOCATE"] {
			if err := unix.Fallocate(int(f.Fd()), 0, 0, 4096); !errors.Is(err, unix.EOPNOTSUPP) {
				t.Fatalf("fallocate on a server without ALLOCATE: %v, want EOPNOTSUPP", err)
			}
			return
		}
		a := bytes.Repeat([]byte{'a'}, 8192)
		if _, err := f.WriteAt(a, 0); err != nil {
			t.Fatal(err)
		}
		check := func(what string, size int64, want []byte) {
			t.Helper()
			if got := fstatSize(t, f); got != size {
				t.Errorf("%s: size %d, want %d", what, got, size)
			}
			if got := pread(t, f, 0, len(want)+1); !bytes.Equal(got, want) {
				t.Errorf("%s: data differs (len %d, want %d)", what, len(got), len(want))
			}
		}
		zeros := func(n int) []byte { return make([]byte, n) }
		cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

		if err := unix.Fallocate(int(f.Fd()), 0, 8192, 8192); err != nil {
			t.Fatalf("fallocate 0: %v", err)
		}
		want := cat(a, zeros(8192))
		check("allocate past the end", 16384, want)
		if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, 12288, 65536); err != nil {
			t.Fatalf("fallocate KEEP_SIZE: %v", err)
		}
		check("allocate KEEP_SIZE across the end", 16384, want)

		// The write goes out before the DEALLOCATE: it is punched.
		if _, err := f.WriteAt([]byte("buffered"), 100); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096); err != nil {
			t.Fatalf("fallocate PUNCH_HOLE: %v", err)
		}
		want = cat(zeros(4096), a[4096:], zeros(8192))
		check("punch", 16384, want)

		if _, err := f.WriteAt(bytes.Repeat([]byte{'b'}, 4096), 0); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_ZERO_RANGE, 1000, 5000); err != nil {
			t.Fatalf("fallocate ZERO_RANGE: %v", err)
		}
		want = cat(bytes.Repeat([]byte{'b'}, 1000), zeros(5000), a[6000:], zeros(8192))
		check("zero range", 16384, want)
		if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_ZERO_RANGE, 16000, 4480); err != nil {
			t.Fatalf("fallocate ZERO_RANGE past the end: %v", err)
		}
		check("zero range past the end", 20480, cat(want, zeros(4096)))
		if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, 20000, 10000); err != nil {
			t.Fatalf("fallocate ZERO_RANGE|KEEP_SIZE: %v", err)
		}
		check("zero range KEEP_SIZE", 20480, cat(want, zeros(4096)))

		for _, mode := range []uint32{unix.FALLOC_FL_COLLAPSE_RANGE, unix.FALLOC_FL_INSERT_RANGE, unix.FALLOC_FL_PUNCH_HOLE} {
			if err := unix.Fallocate(int(f.Fd()), mode, 0, 4096); !errors.Is(err, unix.EOPNOTSUPP) {
				t.Errorf("fallocate mode %#x: %v, want EOPNOTSUPP", mode, err)
			}
		}
		check("after the refused modes", 20480, cat(want, zeros(4096)))
	})
}

// TestSeekDataHole checks lseek(2) SEEK_DATA and SEEK_HOLE through the
// mount (fuse/v42.go Lseek): the server's holes are found, an offset at
// or past the end is ENXIO, SEEK_DATA in the trailing hole is ENXIO, and
// data still buffered by the mount counts.
func TestSeekDataHole(t *testing.T) {
	v42Peers(t, func(t *testing.T, p peer) {
		_, _, d := v42Dir(t, p)
		f, err := os.OpenFile(filepath.Join(d, "f"), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		const mib = 1 << 20
		// data [0, 4 KiB), hole, data [1 MiB, 1 MiB+4 KiB), hole to 3 MiB.
		for _, off := range []int64{0, mib} {
			if _, err := f.WriteAt(bytes.Repeat([]byte{'d'}, 4096), off); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Truncate(3 * mib); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		fd := int(f.Fd())
		seek := func(off int64, whence int) (int64, error) { return unix.Seek(fd, off, whence) }
		if !v42Support[p.limitsOf]["SEEK"] {
			// The kernel's own answer: all data up to the size.
			if got, err := seek(4096, unix.SEEK_HOLE); err != nil || got != 3*mib {
				t.Errorf("SEEK_HOLE without SEEK: %d, %v; want %d", got, err, 3*mib)
			}
			return
		}
		for _, tc := range []struct {
			off    int64
			whence int
			want   int64
			err    error
		}{
			{0, unix.SEEK_DATA, 0, nil},
			{0, unix.SEEK_HOLE, 4096, nil},
			{4096, unix.SEEK_DATA, mib, nil},
			{5000, unix.SEEK_DATA, mib, nil},
			{mib + 10, unix.SEEK_DATA, mib + 10, nil},
			{mib, unix.SEEK_HOLE, mib + 4096, nil},
			{mib + 4096, unix.SEEK_DATA, 0, unix.ENXIO}, // the trailing hole
			{2 * mib, unix.SEEK_HOLE, 2 * mib, nil},
			{3 * mib, unix.SEEK_DATA, 0, unix.ENXIO},
			{3 * mib, unix.SEEK_HOLE, 0, unix.ENXIO},
			{3*mib + 1, unix.SEEK_HOLE, 0, unix.ENXIO},
		} {
			got, err := seek(tc.off, tc.whence)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Errorf("lseek(%d, whence %d) = %d, %v; want %v", tc.off, tc.whence, got, err, tc.err)
				}
				continue
			}
			if err != nil || got != tc.want {
				t.Errorf("lseek(%d, whence %d) = %d, %v; want %d", tc.off, tc.whence, got, err, tc.want)
			}
		}
		// Data written but still buffered by the mount is found.
		if _, err := f.WriteAt(bytes.Repeat([]byte{'e'}, 4096), 2*mib); err != nil {
			t.Fatal(err)
		}
		if got, err := seek(mib+4096, unix.SEEK_DATA); err != nil || got != 2*mib {
			t.Errorf("SEEK_DATA after a buffered write: %d, %v; want %d", got, err, 2*mib)
		}
	})
}

// TestCopyFileRangeLarge checks that one copy_file_range(2) of a whole
// 24 MiB file (six times knfsd's 4 MiB), as cp(1) asks, is copied whole by one call where the
// server has COPY, although knfsd copies at most 4 MiB per synchronous
// COPY: the client asks for a copy in the background (RFC 7862 s15.2.3)
// and waits for its CB_OFFLOAD, over TCP and over RPC-over-RDMA's
// backward direction, instead of returning each 4 MiB to the kernel
// with a COPY and a COMMIT each. The copy is compared byte for byte,
// through a second mount too.
func TestCopyFileRangeLarge(t *testing.T) {
	v42Peers(t, func(t *testing.T, p peer) {
		_, m, d := v42Dir(t, p)
		// Kept small: the knfsd guest's emulated NIC under TCG is the
		// weak spot of heavy traffic (test/kpeer/README.md).
		const size = 24 << 20
		src := make([]byte, size)
		for i := range src {
			src[i] = byte(i*13/7 + i>>20)
		}
		if err := os.WriteFile(filepath.Join(d, "in"), src, 0o644); err != nil {
			t.Fatal(err)
		}
		in, err := os.Open(filepath.Join(d, "in"))
		if err != nil {
			t.Fatal(err)
		}
		defer in.Close()
		out, err := os.OpenFile(filepath.Join(d, "out"), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		before, ops0 := m.FS.V42Stats(), countOps(m)
		start := time.Now()
		// cp asks for far more than the file holds (coreutils 9: 2^63-2^30).
		offIn, offOut, calls := int64(0), int64(0), 0
		for offIn < size {
			n, err := unix.CopyFileRange(int(in.Fd()), &offIn, int(out.Fd()), &offOut, 1<<40, 0)
			if err != nil {
				t.Fatalf("copy_file_range at %d: %v", offIn, err)
			}
			if n == 0 {
				t.Fatalf("copy_file_range at %d of %d: 0", offIn, size)
			}
			calls++
		}
		ops := countOps(m).since(ops0)
		after := m.FS.V42Stats()
		t.Logf("%d copy_file_range calls, %v; operations %v", calls, time.Since(start), ops)
		if v42Support[p.limitsOf]["COPY"] {
			if calls != 1 {
				t.Errorf("copy_file_range of %d bytes took %d calls, want 1 (the whole file)", size, calls)
			}
			if after.Copies-before.Copies != 1 || after.CopyBytes-before.CopyBytes != size {
				t.Errorf("COPY stats %+v before, %+v after; want one copy of %d bytes", before, after, size)
			}
			// knfsd copies in the background when asked: one COPY, and
			// no COMMIT (it syncs the range itself and says FILE_SYNC).
			if ops["COPY"] > 2 || ops["COMMIT"] > 1 || ops["READ"]+ops["WRITE"] != 0 {
				t.Errorf("operations for the copy: %v; want at most 2 COPYs, 1 COMMIT, no READ or WRITE", ops)
			}
		}
		if got := fstatSize(t, out); got != size {
			t.Errorf("destination size %d, want %d", got, size)
		}
		if got := pread(t, out, 0, size); !bytes.Equal(got, src) {
			t.Errorf("destination data differs from the source")
		}
		mnt2, _ := mountPeer(t, p, fuse.Options{})
		got, err := os.ReadFile(filepath.Join(mnt2, filepath.Base(d), "out"))
		if err != nil || !bytes.Equal(got, src) {
			t.Errorf("destination through a second mount: %d bytes, %v", len(got), err)
		}
	})
}

// TestCopyFileRange checks copy_file_range(2) within the mount (fuse/v42.go
// CopyFileRange): the copy is the source's data, including what the
// mount still buffered, it is done by COPY where the server has it, a
// copy from past the end copies nothing, and the destination's size
// follows.
func TestCopyFileRange(t *testing.T) {
	v42Peers(t, func(t *testing.T, p peer) {
		_, m, d := v42Dir(t, p)
		src := make([]byte, 3<<20+123)
		for i := range src {
			src[i] = byte(i * 7 / 5)
		}
		in, err := os.OpenFile(filepath.Join(d, "in"), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer in.Close()
		if _, err := in.Write(src[:len(src)-1000]); err != nil {
			t.Fatal(err)
		}
		// The tail is still buffered by the mount when the copy starts.
		if _, err := in.Write(src[len(src)-1000:]); err != nil {
			t.Fatal(err)
		}
		out, err := os.OpenFile(filepath.Join(d, "out"), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		before := m.FS.V42Stats()
		offIn, offOut := int64(0), int64(4096)
		for offIn < int64(len(src)) {
			n, err := unix.CopyFileRange(int(in.Fd()), &offIn, int(out.Fd()), &offOut, len(src), 0)
			if err != nil {
				t.Fatalf("copy_file_range at %d: %v", offIn, err)
			}
			if n == 0 {
				t.Fatalf("copy_file_range at %d of %d: 0", offIn, len(src))
			}
		}
		if n, err := unix.CopyFileRange(int(in.Fd()), &offIn, int(out.Fd()), &offOut, 4096, 0); err != nil || n != 0 {
			t.Errorf("copy_file_range at the end: %d, %v; want 0", n, err)
		}
		if got := fstatSize(t, out); got != int64(len(src))+4096 {
			t.Errorf("destination size %d, want %d", got, len(src)+4096)
		}
		if got := pread(t, out, 0, len(src)+4096); !bytes.Equal(got, append(make([]byte, 4096), src...)) {
			t.Errorf("destination data differs from the source")
		}
		after := m.FS.V42Stats()
		if v42Support[p.limitsOf]["COPY"] {
			if after.Copies == before.Copies || after.CopyBytes-before.CopyBytes != uint64(len(src)) {
				t.Errorf("COPY did not copy: stats %+v before, %+v after", before, after)
			}
		} else if after.CopyFallbacks == before.CopyFallbacks {
			t.Errorf("no fallback counted: %+v", after)
		}
		// Through another mount, the copy is on the server.
		mnt2, _ := mountPeer(t, p, fuse.Options{})
		got, err := os.ReadFile(filepath.Join(mnt2, filepath.Base(d), "out"))
		if err != nil || !bytes.Equal(got, append(make([]byte, 4096), src...)) {
			t.Errorf("destination through a second mount: %d bytes, %v", len(got), err)
		}
	})
}

// TestXattrs checks user.* extended attributes through the mount
// (fuse/xattr.go) on a file and a directory, against getxattr(2) and
// friends as Linux answers them: ENODATA for a missing name, ERANGE for
// a buffer too small, EEXIST and ENODATA for XATTR_CREATE and
// XATTR_REPLACE, EOPNOTSUPP for the other namespaces; values are on the
// server (seen through a second mount).
func TestXattrs(t *testing.T) {
	v42Peers(t, func(t *testing.T, p peer) {
		mnt, m := mountPeer(t, p, fuse.Options{})
		requireV42(t, m)
		mnt2, _ := mountPeer(t, p, fuse.Options{})
		d := freshDir(t, mnt)
		defer os.RemoveAll(d)
		file := filepath.Join(d, "f")
		if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if !v42Support[p.limitsOf]["XATTR"] {
			if err := unix.Setxattr(file, "user.a", []byte("1"), 0); !errors.Is(err, unix.EOPNOTSUPP) {
				t.Errorf("setxattr on a server without xattrs: %v, want EOPNOTSUPP", err)
			}
			return
		}
		for _, path := range []string{file, d} {
			other := filepath.Join(mnt2, strings.TrimPrefix(path, mnt))
			buf := make([]byte, 256)
			if _, err := unix.Getxattr(path, "user.a", buf); !errors.Is(err, unix.ENODATA) {
				t.Errorf("%s: getxattr of a missing name: %v, want ENODATA", path, err)
			}
			if n, err := unix.Listxattr(path, nil); err != nil || n != 0 {
				t.Errorf("%s: listxattr with none: %d, %v", path, n, err)
			}
			if err := unix.Setxattr(path, "user.a", []byte("value one"), 0); err != nil {
				t.Fatalf("%s: setxattr: %v", path, err)
			}
			if err := unix.Setxattr(path, "user.a", []byte("x"), unix.XATTR_CREATE); !errors.Is(err, unix.EEXIST) {
				t.Errorf("%s: XATTR_CREATE of an existing name: %v, want EEXIST", path, err)
			}
			if err := unix.Setxattr(path, "user.b", []byte("x"), unix.XATTR_REPLACE); !errors.Is(err, unix.ENODATA) {
				t.Errorf("%s: XATTR_REPLACE of a missing name: %v, want ENODATA", path, err)
			}
			if err := unix.Setxattr(path, "user.b", nil, unix.XATTR_CREATE); err != nil {
				t.Errorf("%s: XATTR_CREATE of an empty value: %v", path, err)
			}
			if n, err := unix.Getxattr(path, "user.a", nil); err != nil || n != len("value one") {
				t.Errorf("%s: getxattr size: %d, %v", path, n, err)
			}
			if _, err := unix.Getxattr(path, "user.a", buf[:3]); !errors.Is(err, unix.ERANGE) {
				t.Errorf("%s: getxattr into 3 bytes: %v, want ERANGE", path, err)
			}
			if n, err := unix.Getxattr(other, "user.a", buf); err != nil || string(buf[:n]) != "value one" {
				t.Errorf("%s: getxattr through the second mount: %q, %v", other, buf[:n], err)
			}
			if err := unix.Setxattr(path, "user.a", []byte("two"), unix.XATTR_REPLACE); err != nil {
				t.Errorf("%s: XATTR_REPLACE: %v", path, err)
			}
			if n, err := unix.Getxattr(path, "user.a", buf); err != nil || string(buf[:n]) != "two" {
				t.Errorf("%s: getxattr after replace: %q, %v", path, buf[:n], err)
			}
			n, err := unix.Listxattr(path, nil)
			if err != nil || n != len("user.a\x00user.b\x00") {
				t.Errorf("%s: listxattr size: %d, %v", path, n, err)
			}
			if _, err := unix.Listxattr(path, buf[:5]); !errors.Is(err, unix.ERANGE) {
				t.Errorf("%s: listxattr into 5 bytes: %v, want ERANGE", path, err)
			}
			if n, err := unix.Listxattr(path, buf); err != nil || !sameNames(buf[:n], "user.a", "user.b") {
				t.Errorf("%s: listxattr: %q, %v", path, buf[:n], err)
			}
			for _, name := range []string{"security.x", "trusted.x", "system.x", "other.x"} {
				if err := unix.Setxattr(path, name, []byte("v"), 0); !errors.Is(err, unix.EOPNOTSUPP) {
					t.Errorf("%s: setxattr %s: %v, want EOPNOTSUPP", path, name, err)
				}
			}
			if err := unix.Removexattr(path, "user.a"); err != nil {
				t.Errorf("%s: removexattr: %v", path, err)
			}
			if err := unix.Removexattr(path, "user.a"); !errors.Is(err, unix.ENODATA) {
				t.Errorf("%s: removexattr of a removed name: %v, want ENODATA", path, err)
			}
			if _, err := unix.Getxattr(other, "user.a", buf); !errors.Is(err, unix.ENODATA) {
				t.Errorf("%s: getxattr of a removed name through the second mount: %v, want ENODATA", other, err)
			}
		}
		// A large value, and one larger than Linux allows.
		big := bytes.Repeat([]byte("0123456789"), 6000)
		if err := unix.Setxattr(file, "user.big", big, 0); err != nil {
			t.Errorf("setxattr of %d bytes: %v", len(big), err)
		}
		got := make([]byte, len(big))
		if n, err := unix.Getxattr(file, "user.big", got); err != nil || !bytes.Equal(got[:n], big) {
			t.Errorf("getxattr of %d bytes: %d, %v", len(big), n, err)
		}
		if err := unix.Setxattr(file, "user.huge", make([]byte, 65537), 0); !errors.Is(err, unix.E2BIG) {
			t.Errorf("setxattr of 65537 bytes: %v, want E2BIG", err)
		}
	})
}

// sameNames reports whether the NUL-terminated list holds exactly names.
func sameNames(list []byte, names ...string) bool {
	got := strings.Split(strings.TrimSuffix(string(list), "\x00"), "\x00")
	sort.Strings(got)
	sort.Strings(names)
	return strings.Join(got, ",") == strings.Join(names, ",")
}

// TestV41Mount checks what a vers=4.1 mount does with the calls NFSv4.2
// serves: fallocate and xattrs fail with EOPNOTSUPP, listxattr lists
// none, SEEK_HOLE finds the end of the file (the kernel's own answer),
// and copy_file_range copies through READ and WRITE.
func TestV41Mount(t *testing.T) {
	tcpPeers(t, func(t *testing.T, p peer) {
		p.minor = 1
		mnt, m := mountPeer(t, p, fuse.Options{})
		if s := m.FS.V42Stats(); s.Minor != 1 {
			t.Fatalf("a vers=4.1 mount speaks 4.%d", s.Minor)
		}
		d := freshDir(t, mnt)
		defer os.RemoveAll(d)
		f, err := os.OpenFile(filepath.Join(d, "f"), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(1 << 20); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fallocate(int(f.Fd()), 0, 0, 4096); !errors.Is(err, unix.EOPNOTSUPP) {
			t.Errorf("fallocate: %v, want EOPNOTSUPP", err)
		}
		if err := unix.Setxattr(f.Name(), "user.a", []byte("1"), 0); !errors.Is(err, unix.EOPNOTSUPP) {
			t.Errorf("setxattr: %v, want EOPNOTSUPP", err)
		}
		if n, err := unix.Listxattr(f.Name(), nil); err != nil || n != 0 {
			t.Errorf("listxattr: %d, %v; want 0", n, err)
		}
		if off, err := unix.Seek(int(f.Fd()), 0, unix.SEEK_HOLE); err != nil || off != 1<<20 {
			t.Errorf("SEEK_HOLE: %d, %v; want %d", off, err, 1<<20)
		}
		out, err := os.OpenFile(filepath.Join(d, "g"), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		if _, err := f.WriteAt([]byte("data"), 100); err != nil {
			t.Fatal(err)
		}
		offIn, offOut := int64(100), int64(0)
		if n, err := unix.CopyFileRange(int(f.Fd()), &offIn, int(out.Fd()), &offOut, 4, 0); err != nil || n != 4 {
			t.Fatalf("copy_file_range: %d, %v", n, err)
		}
		if got := pread(t, out, 0, 10); string(got) != "data" {
			t.Errorf("copied %q, want %q", got, "data")
		}
		if s := m.FS.V42Stats(); s.CopyFallbacks == 0 {
			t.Errorf("the copy was not left to the kernel: %+v", s)
		}
	})
}
