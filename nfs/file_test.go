package nfs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/nfs"
	"github.com/rdmafs/rdmafs/nfsclient"
)

// TestFileIO writes and reads a file through every File method that
// moves data or the offset, with writes spanning several WRITEs.
func TestFileIO(t *testing.T) {
	forEachPeer(t, func(t *testing.T, c *nfs.Client, dir string) {
		ctx := testCtx(t)
		name := path.Join(dir, "data")
		f, err := c.OpenFile(ctx, name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		// More than a WRITE carries: UNSTABLE pieces in flight at once.
		want := make([]byte, 3<<20+123)
		for i := range want {
			want[i] = byte(i * 7 / 5)
		}
		if n, err := f.WriteAt(want, 0); err != nil || n != len(want) {
			t.Fatalf("WriteAt: %d, %v", n, err)
		}
		got := make([]byte, len(want)+10)
		n, err := f.ReadAt(got, 0)
		if n != len(want) || err != io.EOF || !bytes.Equal(got[:n], want) {
			t.Fatalf("ReadAt: %d, %v (want %d, io.EOF), data equal %v", n, err, len(want), bytes.Equal(got[:n], want))
		}
		if err := f.Sync(); err != nil {
			t.Fatalf("Sync: %v", err)
		}
		// Read and Write share the offset; Seek moves it.
		if off, err := f.Seek(-3, io.SeekEnd); err != nil || off != int64(len(want))-3 {
			t.Fatalf("Seek end-3: %d, %v", off, err)
		}
		if _, err := f.Write([]byte("XYZW")); err != nil {
			t.Fatal(err)
		}
		if off, _ := f.Seek(0, io.SeekCurrent); off != int64(len(want))+1 {
			t.Fatalf("offset after Write: %d", off)
		}
		fi, err := f.Stat()
		if err != nil || fi.Size() != int64(len(want))+1 || fi.Mode() != 0o640 || fi.Name() != "data" {
			t.Fatalf("Stat: %v %v", fi, err)
		}
		if err := f.Truncate(10); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		all, err := io.ReadAll(f)
		if err != nil || !bytes.Equal(all, want[:10]) {
			t.Fatalf("ReadAll after Truncate(10): %q, %v", all, err)
		}
		if err := f.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if _, err := f.Read(got); !errors.Is(err, fs.ErrClosed) {
			t.Errorf("Read after Close: %v, want fs.ErrClosed", err)
		}

		// O_APPEND writes at the end; O_TRUNC empties.
		a, err := c.OpenFile(ctx, name, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Write([]byte("++")); err != nil {
			t.Fatal(err)
		}
		if _, err := a.WriteAt([]byte("x"), 0); err == nil {
			t.Error("WriteAt on an O_APPEND file succeeded")
		}
		if _, err := a.Read(got); !errors.Is(err, syscall.EBADF) {
			// A write-only open: the server refuses READ (OPENMODE).
			t.Errorf("Read of a write-only file: %v, want EBADF", err)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if data, err := c.ReadFile(ctx, name); err != nil || !bytes.Equal(data, append(want[:10:10], "++"...)) {
			t.Fatalf("after append: %q, %v", data, err)
		}
		tr, err := c.OpenFile(ctx, name, os.O_RDWR|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if fi, err := tr.Stat(); err != nil || fi.Size() != 0 {
			t.Fatalf("after O_TRUNC: %v, %v", fi, err)
		}
		tr.Close()
	})
}

// TestFileManyPieces reads with a 4 KiB rsize, so that one ReadAt is
// hundreds of READs, several in flight (nfsclient.ReadRange): at an
// unaligned offset, across the end of the file, and past it.
func TestFileManyPieces(t *testing.T) {
	for _, p := range peers {
		t.Run(p.label(), func(t *testing.T) {
			opts := p.opts
			opts.RSize, opts.WSize = 4096, 4096
			c := dialPeer(t, p, opts)
			ctx := testCtx(t)
			name := sanitize(fmt.Sprintf("nfstest-pieces-%s-%d-%d", p.label(), os.Getpid(), time.Now().UnixNano()))
			want := make([]byte, 1<<20+123)
			for i := range want {
				want[i] = byte(i*13 + i>>12)
			}
			if err := c.WriteFile(ctx, name, want, 0o600); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Remove(context.Background(), name) })
			f, err := c.OpenFile(ctx, name, os.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, r := range []struct {
				off, len, wantN int
				wantErr         error
			}{
				{off: 1000, len: 512 << 10, wantN: 512 << 10},
				{off: 0, len: len(want), wantN: len(want)},
				{off: len(want) - 70000, len: 100000, wantN: 70000, wantErr: io.EOF},
				{off: len(want) + 5, len: 9000, wantN: 0, wantErr: io.EOF},
			} {
				got := make([]byte, r.len)
				n, err := f.ReadAt(got, int64(r.off))
				if n != r.wantN || err != r.wantErr {
					t.Fatalf("ReadAt(%d bytes at %d) = %d, %v; want %d, %v", r.len, r.off, n, err, r.wantN, r.wantErr)
				}
				if !bytes.Equal(got[:n], want[min(r.off, len(want)):min(r.off, len(want))+n]) {
					t.Fatalf("ReadAt(%d bytes at %d): the data differs from what was written", r.len, r.off)
				}
			}
		})
	}
}

// TestNamespace covers the path operations and their errors.
func TestNamespace(t *testing.T) {
	forEachPeer(t, func(t *testing.T, c *nfs.Client, dir string) {
		ctx := testCtx(t)
		p := func(name string) string { return path.Join(dir, name) }
		if err := c.MkdirAll(ctx, p("a/b/c"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := c.MkdirAll(ctx, p("a/b"), 0o755); err != nil {
			t.Fatalf("MkdirAll of an existing directory: %v", err)
		}
		if err := c.WriteFile(ctx, p("a/f"), []byte("data"), 0o600); err != nil {
			t.Fatal(err)
		}

		checkErr := func(what string, err error, wants ...error) {
			t.Helper()
			var pe *fs.PathError
			var le *os.LinkError
			if !errors.As(err, &pe) && !errors.As(err, &le) {
				t.Errorf("%s: %v (%T), want a *fs.PathError or *os.LinkError", what, err, err)
			}
			for _, w := range wants {
				if !errors.Is(err, w) {
					t.Errorf("%s: %v, want errors.Is %v", what, err, w)
				}
			}
		}
		_, err := c.Stat(ctx, p("missing"))
		checkErr("Stat missing", err, fs.ErrNotExist, syscall.ENOENT, nfsclient.ErrNoEnt)
		checkErr("Mkdir existing", c.Mkdir(ctx, p("a"), 0o755), fs.ErrExist, syscall.EEXIST)
		_, err = c.OpenFile(ctx, p("a/f"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		checkErr("O_EXCL on existing", err, fs.ErrExist)
		_, err = c.Stat(ctx, p("a/f/x"))
		checkErr("file as directory", err, syscall.ENOTDIR)
		_, err = c.OpenFile(ctx, p("a"), os.O_RDWR, 0)
		checkErr("directory for writing", err, syscall.EISDIR)
		checkErr("Remove non-empty", c.Remove(ctx, p("a/b")), syscall.ENOTEMPTY)
		checkErr("Rename missing", c.Rename(ctx, p("nope"), p("x")), fs.ErrNotExist)
		_, err = c.Readlink(ctx, p("a/f"))
		checkErr("Readlink of a file", err, fs.ErrInvalid)

		// Rename, Link, Symlink, Readlink, Lstat.
		if err := c.Rename(ctx, p("a/f"), p("a/b/g")); err != nil {
			t.Fatal(err)
		}
		if err := c.Link(ctx, p("a/b/g"), p("hard")); err != nil {
			t.Fatal(err)
		}
		if err := c.Symlink(ctx, "a/b/g", p("sym")); err != nil {
			t.Fatal(err)
		}
		if err := c.Symlink(ctx, "../../../a", p("a/b/c/up")); err != nil {
			t.Fatal(err)
		}
		if target, err := c.Readlink(ctx, p("sym")); err != nil || target != "a/b/g" {
			t.Errorf("Readlink: %q, %v", target, err)
		}
		if fi, err := c.Lstat(ctx, p("sym")); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			t.Errorf("Lstat sym: %v, %v", fi, err)
		}
		if fi, err := c.Stat(ctx, p("sym")); err != nil || !fi.Mode().IsRegular() || fi.Size() != 4 {
			t.Errorf("Stat sym: %v, %v", fi, err)
		}
		// Links inside the path: up resolves to a, whose b/g is the file.
		if data, err := c.ReadFile(ctx, p("a/b/c/up/b/g")); err != nil || string(data) != "data" {
			t.Errorf("ReadFile through a link to ..: %q, %v", data, err)
		}
		if fi, err := c.Stat(ctx, p("hard")); err != nil || fi.Sys().(*nfsclient.Attr).NLink != 2 {
			t.Errorf("Stat hard link: %v, %v", fi, err)
		}
		if err := c.Symlink(ctx, "loop", p("loop")); err != nil {
			t.Fatal(err)
		}
		_, err = c.Stat(ctx, p("loop"))
		checkErr("symlink loop", err, syscall.ELOOP)

		// Attributes. Chown first: it clears the setgid bit (POSIX).
		if err := c.Chown(ctx, p("a/b/g"), 4242, 4343); err != nil {
			t.Fatal(err)
		}
		if err := c.Chmod(ctx, p("a/b/g"), 0o751|fs.ModeSetgid); err != nil {
			t.Fatal(err)
		}
		mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
		atime := time.Date(2002, 3, 4, 5, 6, 7, 0, time.UTC)
		if err := c.Chtimes(ctx, p("a/b/g"), atime, mtime); err != nil {
			t.Fatal(err)
		}
		fi, err := c.Stat(ctx, p("a/b/g"))
		if err != nil {
			t.Fatal(err)
		}
		attr := fi.Sys().(*nfsclient.Attr)
		if fi.Mode() != 0o751|fs.ModeSetgid || !fi.ModTime().Equal(mtime) || !attr.Atime.Equal(atime) || attr.UID != 4242 || attr.GID != 4343 {
			t.Errorf("after Chmod, Chtimes, Chown: mode %v mtime %v atime %v owner %d:%d", fi.Mode(), fi.ModTime(), attr.Atime, attr.UID, attr.GID)
		}
		if err := c.Truncate(ctx, p("a/b/g"), 2); err != nil {
			t.Fatal(err)
		}
		if data, err := c.ReadFile(ctx, p("hard")); err != nil || string(data) != "da" {
			t.Errorf("after Truncate: %q, %v", data, err)
		}

		// ReadDir, on the Client and on an open directory.
		ents, err := c.ReadDir(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if want := []string{"a", "hard", "loop", "sym"}; !equalStrings(names, want) {
			t.Errorf("ReadDir: %v, want %v", names, want)
		}
		d, err := c.Open(ctx, p("a/b"))
		if err != nil {
			t.Fatal(err)
		}
		first, err := d.ReadDir(1)
		if err != nil || len(first) != 1 {
			t.Fatalf("ReadDir(1): %v, %v", first, err)
		}
		rest, err := d.ReadDir(10)
		if err != nil || len(rest) != 1 || rest[0].Name() == first[0].Name() {
			t.Fatalf("ReadDir(10): %v, %v", rest, err)
		}
		if more, err := d.ReadDir(1); len(more) != 0 || err != io.EOF {
			t.Fatalf("ReadDir at the end: %v, %v", more, err)
		}
		if _, err := d.Read(make([]byte, 1)); !errors.Is(err, syscall.EISDIR) {
			t.Errorf("Read of a directory: %v", err)
		}
		d.Close()

		// Remove and RemoveAll.
		checkErr("Remove root", c.Remove(ctx, "/"), syscall.EBUSY)
		if err := c.Remove(ctx, p("hard")); err != nil {
			t.Fatal(err)
		}
		if err := c.RemoveAll(ctx, p("a")); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Lstat(ctx, p("a")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after RemoveAll: %v", err)
		}
	})
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestPermission checks that the server's refusal for another user
// surfaces as fs.ErrPermission.
func TestPermission(t *testing.T) {
	for _, p := range peers {
		t.Run(p.label(), func(t *testing.T) {
			root := dialPeer(t, p, p.opts)
			ctx := testCtx(t)
			dir := sanitize("nfstest-perm-" + time.Now().Format("150405.000000000"))
			if err := root.Mkdir(ctx, dir, 0o755); err != nil {
				t.Fatal(err)
			}
			defer root.RemoveAll(ctx, dir)
			if err := root.Chown(ctx, dir, 0, 0); err != nil {
				t.Fatal(err)
			}
			opts := p.opts
			opts.Auth = &nfs.Auth{UID: 4242, GID: 4242}
			other := dialPeer(t, p, opts)
			err := other.WriteFile(ctx, path.Join(dir, "f"), []byte("x"), 0o644)
			if !errors.Is(err, fs.ErrPermission) || !errors.Is(err, syscall.EACCES) {
				t.Errorf("create in another user's 0755 directory: %v, want fs.ErrPermission", err)
			}
		})
	}
}

// TestConcurrentFile writes and reads disjoint ranges of one File from
// several goroutines at once.
func TestConcurrentFile(t *testing.T) {
	forEachPeer(t, func(t *testing.T, c *nfs.Client, dir string) {
		ctx := testCtx(t)
		f, err := c.Create(ctx, path.Join(dir, "shared"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		const workers, piece = 8, 100 << 10
		errs := make(chan error, workers)
		for w := range workers {
			go func() {
				data := bytes.Repeat([]byte{byte('a' + w)}, piece)
				if _, err := f.WriteAtContext(ctx, data, int64(w*piece)); err != nil {
					errs <- err
					return
				}
				got := make([]byte, piece)
				if _, err := f.ReadAtContext(ctx, got, int64(w*piece)); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, data) {
					errs <- errors.New("read back other data")
					return
				}
				errs <- nil
			}()
		}
		for range workers {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		if fi, err := f.Stat(); err != nil || fi.Size() != workers*piece {
			t.Fatalf("Stat: %v, %v; want size %d", fi, err, workers*piece)
		}
	})
}
