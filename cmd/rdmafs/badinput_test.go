package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// checkFailure checks that a failed mount printed exactly one line
// containing want and exited with code.
func checkFailure(t *testing.T, out string, code, wantCode int, want string, took, limit time.Duration) {
	t.Helper()
	if code != wantCode {
		t.Errorf("exit code %d, want %d; output: %q", code, wantCode, out)
	}
	if strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "rdmafs: ") {
		t.Errorf("want one line starting with \"rdmafs: \", got %q", out)
	}
	if !strings.Contains(out, want) {
		t.Errorf("output %q does not say %q", out, want)
	}
	if took > limit {
		t.Errorf("took %v, want at most %v", took, limit)
	}
	t.Logf("exit %d after %v: %s", code, took.Round(time.Millisecond), strings.TrimSpace(out))
}

func mountDir(t *testing.T) string {
	d := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// timeo=20,retrans=1: a mount must fail within 2 s x 2 transmissions.
const quickOpts = "timeo=20,retrans=1"
const quickLimit = 4*time.Second + 2*time.Second // timeo x (retrans+1), plus process start

func timedMount(t *testing.T, args ...string) (string, int, time.Duration) {
	rdmafsBin(t) // build outside the timed part
	start := time.Now()
	out, code := runBin(t, time.Minute, append([]string{"mount"}, args...)...)
	return out, code, time.Since(start)
}

func TestMountWrongPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens there now
	out, code, took := timedMount(t, "-o", quickOpts+",port="+strconv.Itoa(port), "127.0.0.1:/export", mountDir(t))
	checkFailure(t, out, code, exitServer, "connection refused", took, quickLimit)
}

func TestMountServerClosesConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	for _, mode := range []string{"soft", "hard"} {
		t.Run(mode, func(t *testing.T) {
			out, code, took := timedMount(t, "-o", quickOpts+","+mode+",port="+strconv.Itoa(port), "127.0.0.1:/export", mountDir(t))
			checkFailure(t, out, code, exitServer, "closed the connection", took, quickLimit)
		})
	}
}

func TestMountNotADirectory(t *testing.T) {
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out, code, took := timedMount(t, "127.0.0.1:/export", f)
	checkFailure(t, out, code, exitMountpoint, "is not a directory", took, quickLimit)
	out, code, took = timedMount(t, "127.0.0.1:/export", f+"-missing")
	checkFailure(t, out, code, exitMountpoint, "does not exist", took, quickLimit)
}

func TestMountBadOptions(t *testing.T) {
	for _, tc := range []struct{ opts, want string }{
		{"colour=blue", `unknown mount option "colour=blue"`},
		{"vers=3", "NFS version 4.1 and 4.2 only"},
		{"vers=4.3", "NFS version 4.1 and 4.2 only"},
		{"proto=udp", "want proto=tcp or proto=rdma"},
		{"rsize=abc", "rsize=abc: not a non-negative number"},
		{"rdmavers=3", "want auto, 1 or 2"},
		{"soft=1", "soft takes no value"},
	} {
		t.Run(tc.opts, func(t *testing.T) {
			out, code, took := timedMount(t, "-o", tc.opts, "127.0.0.1:/export", mountDir(t))
			checkFailure(t, out, code, exitUsage, tc.want, took, quickLimit)
		})
	}
	out, code, took := timedMount(t, "127.0.0.1", mountDir(t))
	checkFailure(t, out, code, exitUsage, "want server[:port]:/export", took, quickLimit)
}

// TestMountNonexistentExport asks each server for an export it does not
// have.
func TestMountNonexistentExport(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		out, code, took := timedMount(t, "-o", quickOpts+",port="+p.port, p.host+":/no/such/export", mountDir(t))
		checkFailure(t, out, code, exitExport, "export /no/such/export not found", took, quickLimit)
	})
}

// TestMountBusy mounts twice on one directory.
func TestMountBusy(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		mnt := mount(t, p)
		out, code, took := timedMount(t, "-o", "port="+p.port, p.source(), mnt)
		checkFailure(t, out, code, exitMountpoint, "is busy", took, quickLimit)
	})
}

// TestMountNoDevFuse runs the mount in a mount namespace whose /dev has
// no fuse device.
func TestMountNoDevFuse(t *testing.T) {
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatalf("unshare is missing (util-linux; scripts/deps.sh installs it): %v", err)
	}
	bin := rdmafsBin(t)
	dir := mountDir(t)
	start := time.Now()
	cmd := exec.Command("unshare", "-m", "/bin/sh", "-c", `mount -t tmpfs none /dev && exec "$0" mount -o timeo=20,retrans=1 127.0.0.1:/export "$1" 2>&1`, bin, dir)
	out, err := cmd.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	checkFailure(t, string(out), code, exitFUSE, "no /dev/fuse", time.Since(start), quickLimit)
}
