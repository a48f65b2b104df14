package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// Local hardening: what another local user could plant or reach (run
// directories, links where rdmafs writes, stats sockets) and what a
// hostile server could send to a terminal.

// TestRunDirRefused points RDMAFS_RUN_DIR at run directories another
// user could control (a symbolic link, a directory owned by another
// user, one others may write to, one in a parent others may write to)
// and checks that the mount is refused with a one-line error naming the
// directory and the reason, before it reaches the server.
func TestRunDirRefused(t *testing.T) {
	base := t.TempDir()
	mk := func(name string, mode os.FileMode, uid int) string {
		d := filepath.Join(base, name)
		if err := os.Mkdir(d, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		if err := os.Chown(d, uid, uid); err != nil {
			t.Fatal(err)
		}
		return d
	}
	target := mk("target", 0o700, 0)
	link := filepath.Join(base, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	open := mk("open", 0o777, 0)
	for _, tc := range []struct {
		name, dir, want string
	}{
		{"symlink", link, "run directory " + link + " is a symbolic link"},
		{"foreign", mk("foreign", 0o700, 1000), "belongs to uid 1000, not to uid 0"},
		{"writable", mk("writable", 0o777, 0), "has mode 0777: others may write to it"},
		{"group-writable", mk("group", 0o770, 0), "has mode 0770: others may write to it"},
		{"parent", filepath.Join(open, "run"), "parent " + open + " has mode 0777"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(runDirEnv, tc.dir)
			// Port 1: a mount that got past the check would fail to
			// connect, with another message.
			out, code := runBin(t, time.Minute, "mount", "-o", "port=1,"+quickOpts, "127.0.0.1:/", mountDir(t))
			if code != exitUsage || !strings.Contains(out, tc.want) || strings.Count(out, "\n") != 1 {
				t.Errorf("mount with %s=%s: exit %d, %q; want exit %d and one line with %q", runDirEnv, tc.dir, code, out, exitUsage, tc.want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(open, "run")); err == nil {
		t.Errorf("the run directory was made in a parent others may write to")
	}
	if names, _ := os.ReadDir(target); len(names) != 0 {
		t.Errorf("the symbolic link's target got %v", names)
	}
}

// TestEnsureRunDir: a missing run directory is made 0700; an existing
// one of root's that others cannot write to (an older rdmafs made
// /run/rdmafs 0755) and one in sticky /tmp are used.
func TestEnsureRunDir(t *testing.T) {
	base := t.TempDir()
	d := filepath.Join(base, "a", "run")
	if err := ensureRunDir(d, 0); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(d); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("made run directory: %v, %v; want mode 0700", fi.Mode(), err)
	}
	old := filepath.Join(base, "old")
	if err := os.Mkdir(old, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := ensureRunDir(old, 0); err != nil {
		t.Errorf("0755 run directory: %v", err)
	}
	tmp, err := os.MkdirTemp("/tmp", "rdmafs-rundir-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	if err := ensureRunDir(tmp, 0); err != nil {
		t.Errorf("run directory in /tmp: %v", err)
	}
}

// TestLogAndProfileSymlink plants a symbolic link to a victim file where
// --log and $RDMAFS_CPUPROFILE are to be written, and checks that the
// mount refuses it and leaves the victim as it was.
func TestLogAndProfileSymlink(t *testing.T) {
	for _, tc := range []struct {
		name string
		args func(link string) []string
		env  func(link string) []string
		want string
	}{
		// -v rpc: a mount that took the link would write its trace there.
		{"log", func(link string) []string { return []string{"-v", "rpc", "--log", link} }, nil, "--log: "},
		{"profile", nil, func(link string) []string { return []string{cpuProfileEnv + "=" + link} }, cpuProfileEnv + ": "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			victim := filepath.Join(dir, "victim")
			precious := []byte("precious contents\n")
			if err := os.WriteFile(victim, precious, 0o644); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(dir, "link")
			if err := os.Symlink(victim, link); err != nil {
				t.Fatal(err)
			}
			args := []string{"mount", "-f"}
			if tc.args != nil {
				args = append(args, tc.args(link)...)
			}
			args = append(args, "-o", "port=1,"+quickOpts, "127.0.0.1:/", mountDir(t))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, rdmafsBin(t), args...)
			if tc.env != nil {
				cmd.Env = append(os.Environ(), tc.env(link)...)
			}
			out, err := cmd.CombinedOutput()
			want := tc.want + link + " is a symbolic link"
			if err == nil || !strings.Contains(string(out), want) {
				t.Errorf("rdmafs %s: %v, %q; want a failure with %q", strings.Join(args, " "), err, out, want)
			}
			if got, err := os.ReadFile(victim); err != nil || !bytes.Equal(got, precious) {
				t.Errorf("victim: %q, %v; want %q unchanged", got, err, precious)
			}
		})
	}
}

// asUser runs the command as uid and gid 1000 with no supplementary
// groups, and returns its combined output.
func asUser(t *testing.T, env []string, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/"}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s as uid 1000 did not finish in time: %s", name, out)
	}
	return string(out), err
}

// TestStatsSocketOtherUser mounts ganesha from a process whose umask is
// 000 and checks that the stats socket is 0600 all the same, that
// another uid can neither have the statistics nor the goroutine stacks
// (not even once the socket's mode would let it connect: the serving
// process checks the peer's uid), and that root has both.
func TestStatsSocketOtherUser(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	host, port := splitAddr(t, g.Addr)
	p := peer{name: "ganesha", host: host, port: port, export: g.Export}
	s := newUserSandbox(t) // a run directory uid 1000 may search, and the binary
	t.Setenv(runDirEnv, s.dir)
	old := syscall.Umask(0)
	mnt := mount(t, p)
	syscall.Umask(old)
	sock := filepath.Join(s.dir, socketName(mnt))
	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("stats socket made under umask 000: mode %04o, want 0600", fi.Mode().Perm())
	}
	env := []string{runDirEnv + "=" + s.dir}
	check := func(when string) {
		for _, args := range [][]string{{"stats", mnt}, {"stats", "--stacks", mnt}} {
			out, err := asUser(t, env, s.bin, args...)
			if err == nil || strings.Contains(out, "pid: ") || strings.Contains(out, "goroutine") {
				t.Errorf("%s: rdmafs %s as uid 1000: %v, %q; want a failure and no answer", when, strings.Join(args, " "), err, out)
			}
		}
	}
	check("socket 0600")
	// Past the file's mode: the serving process closes the connection
	// of a peer that is neither its uid nor root, unanswered.
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	check("socket 0666")
	if out, code := runBin(t, time.Minute, "stats", "--stacks", mnt); code != 0 || !strings.Contains(out, "goroutine") {
		t.Errorf("rdmafs stats --stacks as root: exit %d, %q; want the stacks", code, out)
	}
}

// TestListenUnixPrivate checks the socket helper the mount's and the
// relay's stats sockets share: under umask 000 the socket is 0600, a
// connection from another uid is closed unanswered even when the mode
// would let it in, root's is answered, and Close removes only its own
// socket.
func TestListenUnixPrivate(t *testing.T) {
	s := newUserSandbox(t)
	path := filepath.Join(s.dir, relaySocketName("7777"))
	if err := os.WriteFile(path, []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := syscall.Umask(0)
	ln, err := listenUnixPrivate(path)
	syscall.Umask(old)
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
			io.WriteString(c, "the-answer\n")
			c.Close()
		}
	}()
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket: %v, %v; want a socket, mode 0600", fi.Mode(), err)
	}
	if names, _ := filepath.Glob(filepath.Join(s.dir, ".sock-*")); len(names) != 0 {
		t.Errorf("left behind: %v", names)
	}
	env := []string{runDirEnv + "=" + s.dir}
	for _, mode := range []os.FileMode{0o600, 0o666} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if out, err := asUser(t, env, s.bin, "stats", "--relay", "7777"); err == nil || strings.Contains(out, "the-answer") {
			t.Errorf("socket %04o: rdmafs stats --relay as uid 1000: %v, %q; want no answer", mode, err, out)
		}
	}
	t.Setenv(runDirEnv, s.dir)
	c, err := dialRelayStats("7777", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(time.Minute))
	line, err := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if line != "the-answer\n" {
		t.Errorf("root's connection: %q, %v; want the answer", line, err)
	}
	ln.Close()
	if _, err := os.Lstat(path); err == nil {
		t.Errorf("socket left after Close")
	}
}

// TestTermSafe: strings a server chose (its implementation id, error
// texts) print as they are when harmless, and quoted, with no control
// character or invalid UTF-8 left, otherwise.
func TestTermSafe(t *testing.T) {
	for in, want := range map[string]string{
		"":                                 "",
		"Linux 6.12.0 x86_64 (kernel.org)": "Linux 6.12.0 x86_64 (kernel.org)",
		"NFS-Ganesha 6.5 — café":           "NFS-Ganesha 6.5 — café",
		"\x1b]0;pwned\x07\x1b[2J":          `"\x1b]0;pwned\a\x1b[2J"`,
		"evil\r\nserver: fake":             `"evil\r\nserver: fake"`,
		"\xff\xfe":                         `"\xff\xfe"`,
		"csi\u009b31m":                     `"csi\u009b31m"`,
		"bidi \u202etxt.exe":               `"bidi \u202etxt.exe"`,
		"tab\there":                        `"tab\there"`,
	} {
		got := termSafe(in)
		if got != want {
			t.Errorf("termSafe(%q) = %q, want %q", in, got, want)
		}
		for _, r := range got {
			if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
				t.Errorf("termSafe(%q) = %q keeps control character %U", in, got, r)
			}
		}
	}
}

// TestStatsBrokenPipe runs rdmafs stats (and --stacks) with its
// standard output a pipe whose reader has gone, as in "rdmafs stats /mnt
// | head -1": it stops with nothing on stderr, as cat does.
func TestStatsBrokenPipe(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	host, port := splitAddr(t, g.Addr)
	mnt := mount(t, peer{name: "ganesha", host: host, port: port, export: g.Export})
	for _, args := range [][]string{{"stats", mnt}, {"stats", "--stacks", mnt}} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		r.Close() // the reader has gone before the first write
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, rdmafsBin(t), args...)
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = w, &stderr
		err = cmd.Run()
		w.Close()
		cancel()
		if err == nil || stderr.Len() != 0 {
			t.Errorf("rdmafs %s | (reader gone): %v, stderr %q; want a failure with nothing on stderr", strings.Join(args, " "), err, stderr.String())
		}
	}
	// The pipeline itself: whether head has gone by the time of a write
	// varies, what reaches stderr does not.
	errf := filepath.Join(t.TempDir(), "stderr")
	sh(t, time.Minute, rdmafsBin(t)+" stats --stacks "+mnt+" 2>"+errf+" | head -1 >/dev/null")
	if b, err := os.ReadFile(errf); err != nil || len(b) != 0 {
		t.Errorf("rdmafs stats --stacks | head -1: stderr %q, %v; want nothing", b, err)
	}
}
