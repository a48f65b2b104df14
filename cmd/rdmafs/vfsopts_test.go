package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// ganeshaPeer is the shared nfs-ganesha.
func ganeshaPeer(t *testing.T) peer {
	t.Helper()
	g := testpeer.RequireGanesha(t)
	host, port := splitAddr(t, g.Addr)
	return peer{name: "ganesha", host: host, port: port, export: g.Export}
}

// mountOpts returns the per-mount and the super block options of the
// mount on dir, from /proc/self/mountinfo.
func mountOpts(t *testing.T, dir string) (mnt, sb []string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || unescapeMount(f[4]) != dir {
			continue
		}
		for i := 6; i+3 < len(f); i++ {
			if f[i] == "-" {
				mnt, sb = strings.Split(f[5], ","), strings.Split(f[i+3], ",")
			}
		}
	}
	if mnt == nil {
		t.Fatalf("%s is not in /proc/self/mountinfo", dir)
	}
	return mnt, sb
}

func has(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// TestDevSuidByDefault checks mount(8)'s defaults for a mount by root,
// as for a kernel NFS mount (suid, dev, exec): a character device made
// on the mount works (xfstests generic/184, 434) and a set-user-ID
// program runs with its owner's uid (generic/633); and that nodev and
// nosuid turn both off.
func TestDevSuidByDefault(t *testing.T) {
	p := ganeshaPeer(t)
	idBin, err := exec.LookPath("id")
	if err != nil {
		t.Fatal(err)
	}
	idCopy, err := os.ReadFile(idBin)
	if err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, mnt string, wantDev, wantSuid bool) {
		d := testDir(t, mnt)
		defer os.RemoveAll(d)
		null := filepath.Join(d, "null")
		if err := syscall.Mknod(null, syscall.S_IFCHR|0o666, int(1<<8|3)); err != nil { // /dev/null: 1, 3
			t.Fatalf("mknod: %v", err)
		}
		err := os.WriteFile(null, []byte("gone"), 0)
		switch {
		case wantDev && err != nil:
			t.Errorf("write to a character device on the mount: %v, want it to work (dev)", err)
		case !wantDev && !errors.Is(err, syscall.EACCES):
			t.Errorf("write to a character device on a nodev mount: %v, want EACCES", err)
		}
		prog := filepath.Join(d, "id")
		if err := os.WriteFile(prog, idCopy, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(prog, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Chmod(prog, 0o4755); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(prog)
		if err != nil || st.Mode()&os.ModeSetuid == 0 {
			t.Fatalf("set-user-ID bit not kept: %v %v", st.Mode(), err)
		}
		out, err := exec.Command(prog, "-u").Output()
		if err != nil {
			t.Fatalf("%s -u: %v", prog, err)
		}
		euid := strings.TrimSpace(string(out))
		if want := map[bool]string{true: "65534", false: "0"}[wantSuid]; euid != want {
			t.Errorf("set-user-ID program owned by 65534 ran with euid %s, want %s (suid=%v)", euid, want, wantSuid)
		}
	}
	t.Run("defaults", func(t *testing.T) {
		mnt := mount(t, p)
		opts, _ := mountOpts(t, mnt)
		if has(opts, "nosuid") || has(opts, "nodev") || has(opts, "noexec") {
			t.Errorf("mount options %v: want suid, dev and exec by default", opts)
		}
		check(t, mnt, true, true)
	})
	t.Run("nodev,nosuid", func(t *testing.T) {
		mnt := mount(t, p, "nodev,nosuid")
		opts, _ := mountOpts(t, mnt)
		if !has(opts, "nosuid") || !has(opts, "nodev") {
			t.Errorf("mount options %v: want nosuid,nodev", opts)
		}
		check(t, mnt, false, false)
	})
	t.Run("noexec", func(t *testing.T) {
		mnt := mount(t, p, "noexec")
		d := testDir(t, mnt)
		defer os.RemoveAll(d)
		prog := filepath.Join(d, "true.sh")
		if err := os.WriteFile(prog, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := exec.Command(prog).Run(); !errors.Is(err, syscall.EACCES) {
			t.Errorf("run a program on a noexec mount: %v, want EACCES", err)
		}
	})
}

// TestVFSOptions checks that the file-system-independent options of
// mount(8) are accepted and reach the kernel's mount (xfstests
// generic/003 mounts with nodiratime, generic/120 with noatime).
func TestVFSOptions(t *testing.T) {
	p := ganeshaPeer(t)
	for _, tc := range []struct {
		opts    string
		mnt, sb []string // expected in /proc/self/mountinfo
		notMnt  []string
	}{
		{opts: "noatime", mnt: []string{"noatime"}, notMnt: []string{"relatime"}},
		{opts: "noatime,nodiratime", mnt: []string{"noatime", "nodiratime"}, notMnt: []string{"relatime"}},
		{opts: "strictatime", notMnt: []string{"relatime", "noatime"}},
		{opts: "lazytime", sb: []string{"lazytime"}},
		{opts: "dirsync", sb: []string{"dirsync"}},
		{opts: "relatime,async,exec,suid,dev,nosymfollow", mnt: []string{"relatime", "nosymfollow"}, notMnt: []string{"noatime"}},
		{opts: "sync,nosuid,nodev,noexec", mnt: []string{"nosuid", "nodev", "noexec"}, sb: []string{"sync"}},
	} {
		t.Run(tc.opts, func(t *testing.T) {
			dir := mount(t, p, tc.opts)
			mnt, sb := mountOpts(t, dir)
			for _, o := range tc.mnt {
				if !has(mnt, o) {
					t.Errorf("mount options %v lack %s", mnt, o)
				}
			}
			for _, o := range tc.notMnt {
				if has(mnt, o) {
					t.Errorf("mount options %v have %s", mnt, o)
				}
			}
			for _, o := range tc.sb {
				if !has(sb, o) {
					t.Errorf("super block options %v lack %s", sb, o)
				}
			}
		})
	}
}

// TestSyncMount checks that a sync mount writes through: as on a kernel
// NFS mount with sync (nfs(5)), each write(2) is on the server's stable
// storage before it returns; the kernel sends an FSYNC after every
// write to a file of an MS_SYNCHRONOUS mount (generic_write_sync).
func TestSyncMount(t *testing.T) {
	p := ganeshaPeer(t)
	mnt := mount(t, p, "sync")
	d := testDir(t, mnt)
	defer os.RemoveAll(d)
	before := statsField(t, mnt, "fsyncs")
	f, err := os.Create(filepath.Join(d, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := range 3 {
		if _, err := f.WriteAt([]byte("abc"), int64(3*i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := statsField(t, mnt, "fsyncs") - before; got < 3 {
		t.Errorf("3 writes on a sync mount made %d FSYNCs, want 3", got)
	}
}

// statsField returns a counter of "rdmafs stats".
func statsField(t *testing.T, mnt, name string) int {
	t.Helper()
	out, code := runBin(t, time.Minute, "stats", mnt)
	if code != 0 {
		t.Fatalf("rdmafs stats: exit %d: %s", code, out)
	}
	_, rest, ok := strings.Cut(out, " "+name+"=")
	if !ok {
		t.Fatalf("rdmafs stats has no %s:\n%s", name, out)
	}
	n, err := strconv.Atoi(strings.Fields(rest)[0])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRemount runs the binary as mount(8) runs its helper for "mount -o
// remount,ro DIR" (util-linux 2.38: the options of the mount from
// /proc/self/mountinfo, then remount and the new ones): the mount goes
// read-only and back (xfstests generic/294, 306, 452), and a remount
// changes the atime flags and keeps the others.
func TestRemount(t *testing.T) {
	p := ganeshaPeer(t)
	dir := mount(t, p, "nodev")
	d := testDir(t, dir)
	defer os.RemoveAll(d)
	name := filepath.Join(d, "f")
	if err := os.WriteFile(name, []byte("before"), 0o644); err != nil {
		t.Fatal(err)
	}
	helper := func(opts string) {
		t.Helper()
		cmd := exec.Command(rdmafsBin(t), p.source(), dir, "-o", opts)
		cmd.Args[0] = "mount.fuse.rdmafs"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("mount.fuse.rdmafs -o %s: %v: %s", opts, err, out)
		}
	}
	helper("ro,relatime,remount,user_id=0,group_id=0,default_permissions,max_read=1048576")
	mnt, sb := mountOpts(t, dir)
	if !has(mnt, "ro") || !has(sb, "ro") || !has(mnt, "nodev") {
		t.Errorf("after remount,ro: mount options %v, super block %v: want ro, nodev kept", mnt, sb)
	}
	if err := os.WriteFile(name, []byte("after"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write on the read-only remount: %v, want EROFS", err)
	}
	if b, err := os.ReadFile(name); err != nil || string(b) != "before" {
		t.Errorf("read on the read-only remount: %q %v", b, err)
	}
	helper("rw,relatime,remount,noatime,nodiratime,user_id=0,group_id=0")
	mnt, sb = mountOpts(t, dir)
	if !has(mnt, "rw") || !has(sb, "rw") || !has(mnt, "noatime") || !has(mnt, "nodiratime") || !has(mnt, "nodev") {
		t.Errorf("after remount,rw,noatime,nodiratime: mount options %v, super block %v", mnt, sb)
	}
	if err := os.WriteFile(name, []byte("after"), 0o644); err != nil {
		t.Errorf("write after remount,rw: %v", err)
	}
	if b, err := os.ReadFile(name); err != nil || string(b) != "after" {
		t.Errorf("read after remount,rw: %q %v", b, err)
	}
	// A remount of something that is not an rdmafs mount is an error.
	cmd := exec.Command(rdmafsBin(t), p.source(), "/proc", "-o", "remount,ro")
	cmd.Args[0] = "mount.fuse.rdmafs"
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "/proc is not an rdmafs mount (proc)") {
		t.Errorf("remount of a plain directory: %v: %s", err, out)
	}
}

// TestNoatimeSendsNoAtime checks that reading and running files of a
// noatime mount send no SETATTR: like the kernel NFS client, which marks
// its inodes S_NOATIME and leaves atime to the server, rdmafs never
// sets an access time the application did not set (the kernel FUSE side
// does not either). The server still updates atime when it serves a
// READ, as for a kernel NFS mount (xfstests generic/120 is skipped on
// NFS for that reason).
func TestNoatimeSendsNoAtime(t *testing.T) {
	p := ganeshaPeer(t)
	mnt := mount(t, p, "noatime")
	d := testDir(t, mnt)
	defer os.RemoveAll(d)
	prog := filepath.Join(d, "prog.sh")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	before := opCount(t, mnt, "SETATTR")
	for range 3 {
		if _, err := os.ReadFile(prog); err != nil {
			t.Fatal(err)
		}
		if err := exec.Command(prog).Run(); err != nil {
			t.Fatalf("run %s: %v", prog, err)
		}
		if _, err := os.ReadDir(d); err != nil {
			t.Fatal(err)
		}
	}
	if n := opCount(t, mnt, "SETATTR") - before; n != 0 {
		t.Errorf("reading, running and listing on a noatime mount sent %d SETATTRs, want none", n)
	}
}
