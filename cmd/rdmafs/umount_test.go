package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// knfsdClients returns knfsd's client directories with their info files.
func knfsdClients(t *testing.T, p peer) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := p.knfsd.Exec(ctx, `for d in /proc/fs/nfsd/clients/*/; do [ -e "$d/info" ] && echo "== $d" && cat "$d/info" "$d/states"; done; true`)
	if err != nil {
		t.Fatalf("knfsd exec: %v: %s", err, out)
	}
	clients := map[string]string{}
	var cur string
	for _, line := range strings.Split(out, "\n") {
		if d, ok := strings.CutPrefix(line, "== "); ok {
			cur = d
			continue
		}
		if cur != "" {
			clients[cur] += line + "\n"
		}
	}
	return clients
}

// TestUmountCleansUp checks that rdmafs umount leaves no open state and
// no client on knfsd, no process and no mount behind, even with a file
// written but still buffered when the unmount started.
func TestUmountCleansUp(t *testing.T) {
	forEachTransport(t, func(t *testing.T, p peer) {
		var before map[string]string
		if p.knfsd != nil {
			before = knfsdClients(t, p)
		}
		mnt := mount(t, p)
		pid := servingPIDOf(t, mnt)
		d := testDir(t, mnt)
		sh(t, time.Minute, "cd "+d+" && seq 1 100000 > f && cp f g && ln -s f s && cat g > /dev/null")
		if p.knfsd != nil {
			during := knfsdClients(t, p)
			var ours string
			for dir, info := range during {
				if _, ok := before[dir]; !ok && strings.Contains(info, "rdmafs") {
					ours = dir
				}
			}
			if ours == "" {
				t.Fatalf("knfsd shows no rdmafs client while mounted: %v", during)
			}
			t.Logf("knfsd client while mounted: %s\n%s", ours, during[ours])
		}
		out, code := runBin(t, 2*time.Minute, "umount", mnt)
		if code != 0 {
			t.Fatalf("rdmafs umount: exit %d: %s", code, out)
		}
		if !processGone(pid) {
			t.Errorf("serving process %d still running after rdmafs umount returned", pid)
		}
		if ok, _ := isMountpoint(mnt); ok {
			t.Errorf("%s still in /proc/mounts", mnt)
		}
		if _, err := os.Stat(statsSocket(mnt)); !os.IsNotExist(err) {
			t.Errorf("stats socket left behind: %v", err)
		}
		if p.knfsd != nil {
			after := knfsdClients(t, p)
			for dir, info := range after {
				if _, ok := before[dir]; !ok && strings.Contains(info, "rdmafs") {
					t.Errorf("knfsd still has our client after umount: %s\n%s", dir, info)
				}
			}
		}
		// The data reached the server: read it through a new mount.
		mnt2 := mount(t, p)
		got := sh(t, time.Minute, "cd "+filepath.Join(mnt2, filepath.Base(d))+" && sha256sum < g && readlink s && wc -l < f")
		want := sh(t, time.Minute, "seq 1 100000 | sha256sum && echo f && echo 100000")
		if got != want {
			t.Errorf("after remount: got %q, want %q", got, want)
		}
		os.RemoveAll(filepath.Join(mnt2, filepath.Base(d)))
	})
}

// TestStatsSocketOfNextMount: a mount lazily unmounted while a file
// stays open lives on until the file is closed; a new mount on the same
// directory meanwhile has its own stats socket, which the old process
// must not remove when it exits at last.
func TestStatsSocketOfNextMount(t *testing.T) {
	p, dir := ganeshaPeer(t), mountDir(t)
	mountOn := func() int {
		if out, code := runBin(t, 2*time.Minute, "mount", "-o", "port="+p.port, p.source(), dir); code != 0 {
			t.Fatalf("rdmafs mount: exit %d: %s", code, out)
		}
		return servingPIDOf(t, dir)
	}
	oldPID := mountOn()
	d := testDir(t, dir)
	f, err := os.Create(filepath.Join(d, "held"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("fusermount3", "-u", "-z", dir).CombinedOutput(); err != nil {
		f.Close()
		t.Fatalf("lazy unmount: %v: %s", err, out)
	}
	newPID := mountOn()
	t.Cleanup(func() { cleanupMount(t, dir, newPID) })
	f.Close() // the old mount's last file: its process ends
	for deadline := time.Now().Add(time.Minute); !processGone(oldPID); {
		if time.Now().After(deadline) {
			t.Fatalf("old mount's process %d still running a minute after its last file was closed", oldPID)
		}
		time.Sleep(50 * time.Millisecond) // polling interval
	}
	if pid, ok := servingPID(dir); !ok || pid != newPID {
		t.Errorf("after the old mount's process ended: stats socket answers pid %d, %v; want the new mount's %d", pid, ok, newPID)
	}
	os.RemoveAll(filepath.Join(dir, filepath.Base(d)))
}

// TestMountKeepsNoCallerFD: the mount's background process does not hold
// what its caller left open: a lock the caller holds on descriptor 7
// while it runs "rdmafs mount" is free once the caller exits, not when
// the mount ends. (Descriptor 3 would not show it: the report pipe
// replaces it in the background process.)
func TestMountKeepsNoCallerFD(t *testing.T) {
	p, dir := ganeshaPeer(t), mountDir(t)
	lock := filepath.Join(t.TempDir(), "lock")
	script := `exec 7>"$1" && flock 7 && exec "$2" mount -o "port=$3" "$4" "$5"`
	out, err := exec.Command("/bin/sh", "-c", script, "sh", lock, rdmafsBin(t), p.port, p.source(), dir).CombinedOutput()
	if err != nil {
		t.Fatalf("rdmafs mount holding a lock on descriptor 7: %v: %s", err, out)
	}
	t.Cleanup(func() { cleanupMount(t, dir, servingPIDOf(t, dir)) })
	if out, err := exec.Command("flock", "-n", lock, "true").CombinedOutput(); err != nil {
		t.Errorf("the lock the mount command's caller took is still held after the caller exited (by the mount's process?): %v %s", err, out)
	}
}
