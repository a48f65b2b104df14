package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// TestMountHelper mounts through mount(8)'s helper convention
// (mount.rdmafs SOURCE DIR -o OPTS) and mount.fuse3's (rdmafs SOURCE DIR
// -o OPTS).
func TestMountHelper(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		bin := rdmafsBin(t)
		helper := filepath.Join(t.TempDir(), "mount.rdmafs")
		if err := os.Symlink(bin, helper); err != nil {
			t.Fatal(err)
		}
		for _, argv := range [][]string{
			{helper, p.source(), "DIR", "-s", "-o", "rw,_netdev,port=" + p.port, "-t", "fuse.rdmafs"},
			{bin, p.source(), "DIR", "-o", "rw,dev,suid,port=" + p.port},
		} {
			dir := mountDir(t)
			argv[2] = dir
			out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v: %s", strings.Join(argv, " "), err, out)
			}
			pid := servingPIDOf(t, dir)
			t.Cleanup(func() { cleanupMount(t, dir, pid) })
			if ok, fstype := isMountpoint(dir); !ok || fstype != "fuse.rdmafs" {
				t.Errorf("%s: not mounted as fuse.rdmafs (%v %q)", argv[0], ok, fstype)
			}
			sh(t, time.Minute, "ls "+dir+" >/dev/null")
			if out, code := runBin(t, time.Minute, "umount", dir); code != 0 {
				t.Errorf("umount: %d %s", code, out)
			}
		}
	})
}

// TestForegroundAndTrace runs a foreground mount with -v all --log and
// checks the trace has NFS, RPC and FUSE lines, then unmounts with
// fusermount3 -u and expects the process to exit 0.
func TestForegroundAndTrace(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		dir := mountDir(t)
		logf := filepath.Join(t.TempDir(), "trace.log")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, rdmafsBin(t), "mount", "-f", "-v", "all", "--log", logf, "-o", "port="+p.port, p.source(), dir)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		t.Cleanup(func() {
			if ok, _ := isMountpoint(dir); ok {
				exec.Command("fusermount3", "-u", "-z", dir).Run()
			}
			cmd.Process.Kill()
		})
		deadline := time.Now().Add(time.Minute)
		for {
			if ok, _ := isMountpoint(dir); ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("not mounted after a minute: %s", out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		d := testDir(t, dir)
		sh(t, time.Minute, "echo traced > "+d+"/f && cat "+d+"/f >/dev/null && rm -r "+d)
		if b, err := exec.Command("fusermount3", "-u", dir).CombinedOutput(); err != nil {
			t.Fatalf("fusermount3 -u: %v %s", err, b)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("rdmafs mount -f exited with %v: %s", err, out.String())
			}
		case <-time.After(time.Minute):
			t.Fatal("rdmafs mount -f still running a minute after the unmount")
		}
		b, err := os.ReadFile(logf)
		if err != nil {
			t.Fatal(err)
		}
		log := string(b)
		for _, want := range []string{" rpc connected to ", " nfs xid=0x", "OPEN|GETFH|GETATTR", " fuse CREATE ", " fuse WRITE ", " fuse RELEASE ", "status=NFS4_OK", " fuse shutdown done"} {
			if !strings.Contains(log, want) {
				t.Errorf("trace lacks %q", want)
			}
		}
		if t.Failed() {
			t.Logf("trace:\n%s", log)
		}
	})
}

// TestCallerCredentials checks that requests carry the caller's uid, gid
// and supplementary groups, and that the server's permission checks
// apply: a group-writable directory admits a member of the group only.
func TestCallerCredentials(t *testing.T) {
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Fatalf("setpriv is missing (util-linux; scripts/deps.sh installs it): %v", err)
	}
	forEachPeer(t, func(t *testing.T, p peer) {
		mnt := mount(t, p, "allow_other")
		// t.TempDir's directories are 0700: let uid 1000 reach the mount.
		for d := filepath.Dir(mnt); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
			os.Chmod(d, 0o755)
		}
		d := testDir(t, mnt)
		defer os.RemoveAll(d)
		sh(t, time.Minute, "chown 0:4242 "+d+" && chmod 0770 "+d)
		as := func(groups string, script string) (string, error) {
			args := []string{"--reuid=1000", "--regid=1000"}
			if groups == "" {
				args = append(args, "--clear-groups")
			} else {
				args = append(args, "--groups="+groups)
			}
			out, err := exec.Command("setpriv", append(args, "/bin/sh", "-c", script)...).CombinedOutput()
			return string(out), err
		}
		if out, err := as("4242", "touch "+d+"/member && stat -c %u:%g "+d+"/member"); err != nil || strings.TrimSpace(out) != "1000:1000" {
			t.Errorf("%s: member of group 4242: %v %q", p.name, err, out)
		}
		if out, err := as("", "touch "+d+"/stranger"); err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("%s: non-member created a file in a 0770 directory: %v %q", p.name, err, out)
		}
		if out, err := as("", "cat "+d+"/member"); err == nil {
			t.Errorf("%s: non-member read into a 0770 directory: %q", p.name, out)
		}
	})
}

// TestOpenStateOnKnfsd checks that a FUSE open holds NFSv4.1 OPEN state
// on the server and that closing the file releases it (knfsd only: it
// shows its state in /proc/fs/nfsd/clients).
func TestOpenStateOnKnfsd(t *testing.T) {
	forEachKnfsd(t, true, func(t *testing.T, p peer) {
		mnt := mount(t, p)
		d := testDir(t, mnt)
		defer os.RemoveAll(d)
		f := filepath.Join(d, "held")
		sh(t, time.Minute, "echo x > "+f)
		opens := func() int {
			n := 0
			for _, info := range knfsdClients(t, p) {
				if strings.Contains(info, "rdmafs") {
					n += strings.Count(info, "type: open")
				}
			}
			return n
		}
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		held := opens()
		closes := opCount(t, mnt, "CLOSE")
		fh.Close()
		// RELEASE is asynchronous: the CLOSE may reach knfsd after
		// close(2) returned. Wait until the mount has its reply; then
		// knfsd has released the open stateid.
		for deadline := time.Now().Add(time.Minute); opCount(t, mnt, "CLOSE") == closes; {
			if time.Now().After(deadline) {
				t.Fatalf("no CLOSE answered a minute after close(2)")
			}
			time.Sleep(20 * time.Millisecond) // polling interval, not synchronisation
		}
		if after := opens(); held != 1 || after != 0 {
			t.Errorf("open stateids on knfsd: %d while open (want 1), %d after the CLOSE (want 0)", held, after)
		}
	})
}

// opCount returns how many op calls the mount at mnt has made and had
// answered ("rdmafs stats", per-op statistics).
func opCount(t *testing.T, mnt, op string) int {
	t.Helper()
	out, code := runBin(t, time.Minute, "stats", mnt)
	if code != 0 {
		t.Fatalf("rdmafs stats: exit %d: %s", code, out)
	}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == op {
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("rdmafs stats: %q: %v", l, err)
			}
			return n
		}
	}
	return 0
}

// TestReadOnlyMount checks that ro refuses writes and allows reads.
func TestReadOnlyMount(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		rw := mount(t, p)
		d := testDir(t, rw)
		defer os.RemoveAll(d)
		sh(t, time.Minute, "echo data > "+d+"/f")
		ro := mount(t, p, "ro")
		rd := filepath.Join(ro, filepath.Base(d))
		if got := sh(t, time.Minute, "cat "+rd+"/f"); got != "data\n" {
			t.Errorf("read on ro mount: %q", got)
		}
		out, err := exec.Command("/bin/sh", "-c", "touch "+rd+"/g").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "Read-only file system") {
			t.Errorf("touch on ro mount: %v %s", err, out)
		}
	})
}

// TestNoSpaceReported fills knfsd's 256 MiB ext4 export (the only
// export small enough to fill): the error of the buffered UNSTABLE
// WRITEs must reach the writer (at write or close).
func TestNoSpaceReported(t *testing.T) {
	forEachKnfsd(t, false, func(t *testing.T, p peer) {
		mnt := mount(t, p)
		d := testDir(t, mnt)
		defer os.RemoveAll(d)
		out, err := exec.Command("/bin/sh", "-c", "head -c 400M /dev/zero > "+d+"/big").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "No space left on device") {
			t.Errorf("writing 400 MiB into a 256 MiB export: %v %q", err, out)
		}
		t.Logf("%s", strings.TrimSpace(string(out)))
	})
}

// TestRemoveFreesSpace removes a file the mount holds a delegation on:
// its space must come back at once, not at unmount. A delegation keeps
// the server's file alive until it is returned, so the client returns it
// before REMOVE takes the last link, as Linux's client does
// (nfs4_proc_remove). knfsd's export is a small ext4, where the space
// shows.
func TestRemoveFreesSpace(t *testing.T) {
	forEachKnfsd(t, false, func(t *testing.T, p peer) {
		mnt := mount(t, p)
		d := testDir(t, mnt)
		defer os.RemoveAll(d)
		free := func() int64 {
			var st syscall.Statfs_t
			err := syscall.Statfs(mnt, &st)
			for err == syscall.EINTR { // the Go runtime's preemption signal
				err = syscall.Statfs(mnt, &st)
			}
			if err != nil {
				t.Fatalf("statfs: %v", err)
			}
			return int64(st.Bavail) * st.Bsize
		}
		before := free()
		f := filepath.Join(d, "f")
		// The read after the write opens the file again: knfsd hands out
		// a read delegation on that open.
		sh(t, 5*time.Minute, "head -c 48M /dev/zero > "+f+" && cat "+f+" > /dev/null && cat "+f+" > /dev/null")
		if used := before - free(); used < 40<<20 {
			t.Fatalf("writing 48 MiB used only %d bytes of the export", used)
		}
		sh(t, time.Minute, "rm "+f)
		// The server frees the blocks when it drops its last reference;
		// give it a few seconds, far less than the lease.
		var left int64
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			if left = before - free(); left < 8<<20 || time.Now().After(deadline) {
				break
			}
		}
		if left >= 8<<20 {
			t.Errorf("after rm, %d MiB of the removed file's space still in use (delegation not returned?)", left>>20)
		}
	})
}

// TestLongSymlink reads back symbolic links whose targets fill PATH_MAX.
// Over RPC-over-RDMA such a READLINK reply is larger than the inline
// receive buffer: the call must offer a Reply chunk, or the reply breaks
// the connection on every retransmission (xfstests generic/013 hung so).
// The mount is soft so that a broken transport fails the readlink
// instead of retrying for ever.
func TestLongSymlink(t *testing.T) {
	forEachKnfsd(t, true, func(t *testing.T, p peer) {
		mnt := mount(t, p, "soft", "timeo=50", "retrans=1")
		d := testDir(t, mnt)
		defer os.RemoveAll(d)
		for _, n := range []int{3900, 4095} {
			target := strings.Repeat("x", n)
			l := filepath.Join(d, "l"+strconv.Itoa(n))
			if err := os.Symlink(target, l); err != nil {
				t.Fatalf("symlink of %d bytes: %v", n, err)
			}
			got, err := os.Readlink(l)
			if err != nil {
				t.Fatalf("readlink of a %d-byte target: %v", n, err)
			}
			if got != target {
				t.Errorf("readlink of a %d-byte target returned %d bytes", n, len(got))
			}
		}
	})
}

// TestCloseToOpen writes a file through one mount and reads it through
// another that has it cached: the open must see the new data and size
// (close-to-open consistency), while attributes otherwise stay cached.
func TestCloseToOpen(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		a := mount(t, p)
		b := mount(t, p)
		d := testDir(t, a)
		defer os.RemoveAll(d)
		fa := filepath.Join(d, "f")
		fb := filepath.Join(b, filepath.Base(d), "f")
		sh(t, time.Minute, "echo one > "+fa)
		if got := sh(t, time.Minute, "cat "+fb+" && stat -c %s "+fb); got != "one\n4\n" {
			t.Fatalf("first read through b: %q", got)
		}
		sh(t, time.Minute, "echo 'two, longer' > "+fa)
		if got := sh(t, time.Minute, "cat "+fb); got != "two, longer\n" {
			t.Errorf("read through b after a rewrote the file: %q", got)
		}
		if got := sh(t, time.Minute, "stat -c %s "+fb); got != "12\n" {
			t.Errorf("size through b after open: %q", got)
		}
	})
}

// TestSoftTimeout mounts through a proxy with soft,timeo=10,retrans=1,
// makes the server go silent and expects ETIMEDOUT within timeo x
// (retrans+1); then unmounts lazily.
func TestSoftTimeout(t *testing.T) {
	t.Run("ganesha", func(t *testing.T) {
		g := testpeer.RequireGanesha(t)
		host, gport := splitAddr(t, g.Addr)
		p := peer{name: "ganesha", host: host, port: gport, export: g.Export}
		bh := newTCPProxy(t, p.host+":"+p.port)
		_, port, _ := net.SplitHostPort(bh.ln.Addr().String())
		mnt := mount(t, peer{name: p.name, host: "127.0.0.1", port: port, export: p.export}, "soft", "timeo=10", "retrans=1", "actimeo=0")
		d := testDir(t, mnt)
		sh(t, time.Minute, "echo x > "+d+"/f")
		bh.dropped.Store(true)
		start := time.Now()
		out, err := exec.Command("stat", d+"/f").CombinedOutput()
		took := time.Since(start)
		if err == nil || !strings.Contains(string(out), "Connection timed out") {
			t.Errorf("stat with a silent server: %v %q", err, out)
		}
		if took > 5*time.Second {
			t.Errorf("stat took %v, want about timeo x (retrans+1) = 2s", took)
		}
		t.Logf("stat failed after %v: %s", took.Round(time.Millisecond), strings.TrimSpace(string(out)))
		bh.dropped.Store(false)
		exec.Command("fusermount3", "-u", "-z", mnt).Run()
	})
}

// TestStatsDirGetattrsCached checks that "rdmafs stats" counts the
// directory GETATTRs the mount answered from the attributes its own
// CREATE or OPEN(create) returned (the kernel asks for the directory's
// attributes again after each change of it).
func TestStatsDirGetattrsCached(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	host, port := splitAddr(t, g.Addr)
	mnt := mount(t, peer{name: "ganesha", host: host, port: port, export: g.Export})
	d := testDir(t, mnt)
	sh(t, time.Minute, "cd "+d+" && for i in 1 2 3 4 5 6 7 8; do echo $i > f$i; done && ls -l >/dev/null")
	out, code := runBin(t, time.Minute, "stats", mnt)
	if code != 0 {
		t.Fatalf("rdmafs stats: exit %d: %s", code, out)
	}
	_, rest, ok := strings.Cut(out, "dir_getattrs_cached=")
	if !ok {
		t.Fatalf("rdmafs stats has no dir_getattrs_cached:\n%s", out)
	}
	n, err := strconv.Atoi(strings.Fields(rest)[0])
	if err != nil || n < 1 {
		t.Fatalf("dir_getattrs_cached=%s after creating 8 files, want at least 1:\n%s", strings.Fields(rest)[0], out)
	}
}

// TestStatsMinorVersion: rdmafs stats shows the NFS minor version the
// mount speaks: 4.2 by default against a server that has it, 4.1 with
// vers=4.1.
func TestStatsMinorVersion(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	host, port := splitAddr(t, g.Addr)
	for _, tc := range []struct {
		opts []string
		want string
	}{
		{nil, "vers=4.2"},
		{[]string{"vers=4.1"}, "vers=4.1"},
	} {
		mnt := mount(t, peer{name: "ganesha", host: host, port: port, export: g.Export}, tc.opts...)
		out, code := runBin(t, time.Minute, "stats", mnt)
		if code != 0 {
			t.Fatalf("rdmafs stats: exit %d: %s", code, out)
		}
		if !regexp.MustCompile(`(?m)^server: .* ` + regexp.QuoteMeta(tc.want) + ` `).MatchString(out) {
			t.Fatalf("mount -o %v: stats lack %q:\n%s", tc.opts, tc.want, out)
		}
	}
}

// TestStatsCallsInFlight: with the server silent, "rdmafs stats" shows
// the unanswered call on its slot with its age, and "rdmafs stats
// --stacks" shows the serving process's goroutines, the one waiting for
// the reply among them.
func TestStatsCallsInFlight(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	host, gport := splitAddr(t, g.Addr)
	bh := newTCPProxy(t, host+":"+gport)
	_, port, _ := net.SplitHostPort(bh.ln.Addr().String())
	mnt := mount(t, peer{name: "ganesha", host: "127.0.0.1", port: port, export: g.Export}, "soft", "timeo=100", "retrans=1", "actimeo=0")
	d := testDir(t, mnt)
	sh(t, time.Minute, "echo x > "+d+"/f")
	bh.dropped.Store(true)
	stat := exec.Command("stat", d+"/f")
	if err := stat.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		bh.dropped.Store(false)
		stat.Wait() // soft: fails within timeo x (retrans+1) = 20 s
	}()
	inFlight := regexp.MustCompile(`(?m)^  slot \d+ xid 0x[0-9a-f]{8} GETATTR for \d`)
	var out string
	for deadline := time.Now().Add(10 * time.Second); ; {
		var code int
		out, code = runBin(t, time.Minute, "stats", mnt)
		if code != 0 {
			t.Fatalf("rdmafs stats: exit %d: %s", code, out)
		}
		if inFlight.MatchString(out) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no GETATTR in flight in rdmafs stats while the server is silent:\n%s", out)
		}
		time.Sleep(100 * time.Millisecond) // polling interval
	}
	if !regexp.MustCompile(`(?m)^slots: \d+ target=\d+ retired=0 in_flight=[1-9]`).MatchString(out) {
		t.Errorf("rdmafs stats: no slots line with a call in flight:\n%s", out)
	}
	// What the test binary prints of its mounts before its -timeout.
	var dump strings.Builder
	dumpSocket(&dump, statsSocket(mnt))
	if !regexp.MustCompile(`(?m)^HUNG:   slot \d+ xid 0x[0-9a-f]{8} GETATTR for`).MatchString(dump.String()) {
		t.Errorf("dumpSocket shows no call in flight:\n%s", dump.String())
	}
	stacks, code := runBin(t, time.Minute, "stats", "--stacks", mnt)
	if code != 0 || !strings.Contains(stacks, "goroutine ") || !strings.Contains(stacks, "nfsclient.(*Client).send") {
		t.Errorf("rdmafs stats --stacks: exit %d, no goroutine in nfsclient send:\n%.2000s", code, stacks)
	}
}
