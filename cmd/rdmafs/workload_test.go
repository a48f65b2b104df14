package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMountSmoke mounts each server in the background, does a few file
// operations with shell tools, reads the stats and unmounts.
func TestMountSmoke(t *testing.T) {
	forEachTransport(t, func(t *testing.T, p peer) {
		mnt := mount(t, p)
		d := testDir(t, mnt)
		out := sh(t, time.Minute, `cd `+d+` && echo hello > a && cat a && ls -la && mkdir sub && mv a sub/b && cat sub/b && df -h . | tail -1`)
		if !strings.Contains(out, "hello\n") {
			t.Errorf("%s: unexpected output:\n%s", p.name, out)
		}
		stats, code := runBin(t, time.Minute, "stats", mnt)
		if code != 0 || !strings.Contains(stats, "per-op statistics") || !strings.Contains(stats, "OPEN") {
			t.Errorf("%s: rdmafs stats: exit %d:\n%s", p.name, code, stats)
		}
		t.Logf("%s: stats:\n%s", p.name, stats)
		if err := os.RemoveAll(d); err != nil {
			t.Errorf("rm -rf: %v", err)
		}
	})
}

// TestCopy100MiB copies a 100 MiB file into the mount and back out with
// cp and compares checksums; it logs the throughput both ways.
func TestCopy100MiB(t *testing.T) {
	local := t.TempDir()
	src := filepath.Join(local, "big")
	sh(t, time.Minute, "head -c 104857600 /dev/urandom > "+src)
	want := strings.Fields(sh(t, time.Minute, "sha256sum "+src))[0]
	forEachTransport(t, func(t *testing.T, p peer) {
		mnt := mount(t, p)
		d := testDir(t, mnt)
		defer os.RemoveAll(d)
		start := time.Now()
		sh(t, 10*time.Minute, fmt.Sprintf("cp %s %s/big", src, d))
		in := time.Since(start)
		// Read back through a fresh mount so the data comes from the
		// server, not the page cache.
		mnt2 := mount(t, p)
		d2 := filepath.Join(mnt2, filepath.Base(d))
		out := filepath.Join(local, "back-"+p.name)
		start = time.Now()
		sh(t, 10*time.Minute, fmt.Sprintf("cp %s/big %s", d2, out))
		back := time.Since(start)
		got := strings.Fields(sh(t, time.Minute, "sha256sum "+out))[0]
		if got != want {
			t.Fatalf("%s: sha256 of the copy out is %s, want %s", p.name, got, want)
		}
		inMount := strings.Fields(sh(t, 10*time.Minute, "sha256sum "+d2+"/big"))[0]
		if inMount != want {
			t.Fatalf("%s: sha256 in the mount is %s, want %s", p.name, inMount, want)
		}
		os.Remove(out)
		t.Logf("%s: cp 100 MiB in: %v (%.1f MB/s), out: %v (%.1f MB/s)", p.name,
			in.Round(time.Millisecond), 104.8576/in.Seconds(), back.Round(time.Millisecond), 104.8576/back.Seconds())
	})
}

// treeDirs are the parts of GOROOT/src the tar test unpacks: about 2300
// files.
var treeDirs = []string{"net", "crypto", "go", "encoding"}

// TestTarTree unpacks a source tree of a few thousand files with tar x
// and compares it with diff -r, then removes it with rm -rf.
func TestTarTree(t *testing.T) {
	goroot := strings.TrimSpace(sh(t, time.Minute, "go env GOROOT"))
	local := t.TempDir()
	tarball := filepath.Join(local, "src.tar")
	sh(t, 2*time.Minute, fmt.Sprintf("cd %s/src && tar cf %s %s", goroot, tarball, strings.Join(treeDirs, " ")))
	nfiles := atoi(t, sh(t, time.Minute, "tar tf "+tarball+" | wc -l"))
	forEachTransport(t, func(t *testing.T, p peer) {
		mnt := mount(t, p)
		d := testDir(t, mnt)
		start := time.Now()
		sh(t, 20*time.Minute, fmt.Sprintf("cd %s && tar xf %s", d, tarball))
		untar := time.Since(start)
		start = time.Now()
		for _, sub := range treeDirs {
			sh(t, 20*time.Minute, fmt.Sprintf("diff -r %s/src/%s %s/%s", goroot, sub, d, sub))
		}
		diff := time.Since(start)
		start = time.Now()
		sh(t, 20*time.Minute, "rm -rf "+d)
		rm := time.Since(start)
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s: %s still there after rm -rf: %v", p.name, d, err)
		}
		t.Logf("%s: %d entries: tar x %v, diff -r %v, rm -rf %v", p.name, nfiles,
			untar.Round(time.Millisecond), diff.Round(time.Millisecond), rm.Round(time.Millisecond))
	})
}

// TestNamespaceTools runs mkdir -p, mv across directories, ln, ln -s,
// chmod, chown, touch -d, df and rm -rf through the mount.
func TestNamespaceTools(t *testing.T) {
	forEachTransport(t, func(t *testing.T, p peer) {
		mnt := mount(t, p)
		d := testDir(t, mnt)
		out := sh(t, 5*time.Minute, `
cd `+d+`
mkdir -p a/b/c/d x/y
echo data > a/b/c/d/f
mv a/b/c/d/f x/y/g
test ! -e a/b/c/d/f
test "$(cat x/y/g)" = data
echo other > x/y/h
mv x/y/h x/y/g                     # rename over an existing target
test "$(cat x/y/g)" = other
ln x/y/g hard
test "$(stat -c %h x/y/g)" = 2
test "$(stat -c %i x/y/g)" = "$(stat -c %i hard)"
ln -s x/y/g soft
test "$(readlink soft)" = x/y/g
test "$(cat soft)" = other
chmod 0640 hard
test "$(stat -c %a x/y/g)" = 640
chown 1234:5678 hard
test "$(stat -c %u:%g x/y/g)" = 1234:5678
touch -d '2001-02-03 04:05:06' hard
test "$(stat -c %Y hard)" = "$(date -d '2001-02-03 04:05:06' +%s)"
mv a x/y/                          # directory across directories
test -d x/y/a/b/c/d
df -P . | tail -1
mkfifo fifo
test -p fifo
rm -rf x hard soft fifo
test -z "$(ls -A)"
echo ok
`)
		if !strings.Contains(out, "ok") {
			t.Errorf("%s: %s", p.name, out)
		}
		os.RemoveAll(d)
	})
}

// TestAppendTwoWriters has two processes append lines to one file with
// O_APPEND (the shell's >>) and checks that no line was lost.
func TestAppendTwoWriters(t *testing.T) {
	forEachTransport(t, func(t *testing.T, p peer) {
		mnt := mount(t, p)
		d := testDir(t, mnt)
		defer os.RemoveAll(d)
		f := filepath.Join(d, "log")
		const lines = 2000
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				script := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo "writer%d line $i"; i=$((i+1)); done >> %s`, lines, w, f)
				out, err := exec.Command("/bin/sh", "-c", script).CombinedOutput()
				if err != nil {
					errs[w] = fmt.Errorf("%v: %s", err, out)
				}
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
			seen[l] = true
		}
		for w := range 2 {
			for i := range lines {
				if l := fmt.Sprintf("writer%d line %d", w, i); !seen[l] {
					t.Fatalf("%s: line %q lost (file has %d bytes)", p.name, l, len(b))
				}
			}
		}
		if n := strings.Count(string(b), "\n"); n != 2*lines {
			t.Errorf("%s: %d lines, want %d", p.name, n, 2*lines)
		}
	})
}
