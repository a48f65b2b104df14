package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// testUID is the ordinary user the non-root tests run as.
const testUID = "1000"

// userSandbox is what a test running rdmafs as an ordinary user needs:
// a directory every user can reach, with a copy of the binary in it.
type userSandbox struct {
	dir string // 0755, removed when the test ends
	bin string
}

func newUserSandbox(t *testing.T) userSandbox {
	t.Helper()
	for _, tool := range []string{"setpriv", "unshare", "mount", "mknod", "cut", "fusermount3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing (scripts/deps.sh installs util-linux, mount, coreutils, fuse3): %v", tool, err)
		}
	}
	// fusermount3 looks the user up by uid.
	if _, err := user.LookupId(testUID); err != nil {
		t.Fatalf("uid %s has no passwd entry, which fusermount3 needs (scripts/deps.sh adds the user rdmafs-test): %v", testUID, err)
	}
	// t.TempDir's parents are 0700: the user could not reach them.
	dir, err := os.MkdirTemp("", "rdmafs-user-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "rdmafs")
	b, err := os.ReadFile(rdmafsBin(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return userSandbox{dir: dir, bin: bin}
}

// mkdir makes a directory in the sandbox owned by uid 1000 when user.
func (s userSandbox) mkdir(t *testing.T, name string, user bool) string {
	t.Helper()
	d := filepath.Join(s.dir, name)
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if user {
		if err := os.Chown(d, 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// inUserNamespace runs script with /bin/sh as root in a private mount
// namespace, where /dev/fuse is a fresh device node with mode devMode
// (so the test does not depend on, or change, the host's /dev/fuse) and
// /run/user is an empty tmpfs with a private /run/user/1000. In script,
// "user CMD..." runs CMD as uid and gid 1000 with a minimal environment
// plus userEnv, and $RDMAFS is the binary. Mounts made in the namespace
// are not seen outside it and go away with its last process.
func inUserNamespace(t *testing.T, s userSandbox, devMode string, userEnv []string, script string) (string, error) {
	t.Helper()
	setup := `set -e
dev=$(mktemp -d "$SANDBOX/dev.XXXXXX")
mount -t tmpfs -o mode=755 rdmafs-test-dev "$dev"
mknod "$dev/fuse" c 10 229
chmod "$DEVMODE" "$dev/fuse"
mount --bind "$dev/fuse" /dev/fuse
mount -t tmpfs -o mode=755 rdmafs-test-run /run/user
mkdir -m 700 /run/user/1000 && chown 1000:1000 /run/user/1000
user() { setpriv --reuid=` + testUID + ` --regid=` + testUID + ` --clear-groups env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/ $USERENV "$@"; }
`
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "-m", "--propagation", "private", "/bin/sh", "-c", setup+script)
	cmd.Env = append(os.Environ(), "SANDBOX="+s.dir, "DEVMODE="+devMode, "RDMAFS="+s.bin, "USERENV="+strings.Join(userEnv, " "))
	cmd.Env = dropEnv(cmd.Env, "RDMAFS_RUN_DIR", "XDG_RUNTIME_DIR")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("namespace script did not finish in time: %s", out)
	}
	return string(out), err
}

// dropEnv removes the named variables from env.
func dropEnv(env []string, names ...string) []string {
	var out []string
	for _, kv := range env {
		keep := true
		for _, n := range names {
			if strings.HasPrefix(kv, n+"=") {
				keep = false
			}
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}

// TestUserMountStats mounts ganesha as an ordinary user (with a
// /dev/fuse that user may open) and checks that "rdmafs stats" finds the
// mount, as that user and as root, with the socket in the user's
// runtime directory ($XDG_RUNTIME_DIR/rdmafs) or, without one, in the
// private /tmp/rdmafs-UID; and that "rdmafs umount" as the user ends the
// serving process and removes the socket.
func TestUserMountStats(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	host, port := splitAddr(t, g.Addr)
	for _, tc := range []struct {
		name    string
		env     []string
		sockDir string
	}{
		{"xdg", []string{"XDG_RUNTIME_DIR=/run/user/1000"}, "/run/user/1000/rdmafs"},
		{"tmp", nil, "/tmp/rdmafs-" + testUID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newUserSandbox(t)
			mnt := s.mkdir(t, "mnt", true)
			sock := filepath.Join(tc.sockDir, socketName(mnt))
			script := `
MNT=` + mnt + `
trap 'user fusermount3 -u -z "$MNT" 2>/dev/null || true' EXIT
user "$RDMAFS" mount -o port=` + port + ` ` + host + `:` + g.Export + ` "$MNT"
echo "== socket"; stat -c '%u %F' ` + sock + `; stat -c '%u %a' ` + tc.sockDir + `
echo "== user stats"; user "$RDMAFS" stats "$MNT"
echo "== root stats"; "$RDMAFS" stats "$MNT"
echo "== ls"; user ls -d "$MNT/."
pid=$(user "$RDMAFS" stats "$MNT" | sed -n 's/^pid: //p')
echo "== umount"; user "$RDMAFS" umount "$MNT"
echo "== after"; grep -c " $MNT " /proc/self/mounts || true
[ -e ` + sock + ` ] && echo "socket left" || echo "socket gone"
state=$(cut -d' ' -f3 /proc/$pid/stat 2>/dev/null || true)
case "$state" in ""|Z|X) echo "process gone";; *) echo "process left: $state";; esac
`
			out, err := inUserNamespace(t, s, "0666", tc.env, script)
			if err != nil {
				t.Fatalf("as uid %s: %v\n%s", testUID, err, out)
			}
			sec := sections(out)
			if want := testUID + " socket\n" + testUID + " 700\n"; sec["socket"] != want {
				t.Errorf("socket and its directory: got %q, want %q (owner, type; owner, mode)", sec["socket"], want)
			}
			dev := "device " + host + ":" + g.Export + " mounted on " + mnt
			for _, who := range []string{"user stats", "root stats"} {
				if !strings.HasPrefix(sec[who], "pid: ") || !strings.Contains(sec[who], dev) || !strings.Contains(sec[who], "per-op statistics:") {
					t.Errorf("%s: got %q, want a report on %q", who, sec[who], dev)
				}
			}
			if sec["umount"] != "" {
				t.Errorf("rdmafs umount printed %q", sec["umount"])
			}
			if sec["after"] != "0\nsocket gone\nprocess gone\n" {
				t.Errorf("after umount: got %q, want not mounted, socket and process gone", sec["after"])
			}
			if t.Failed() {
				t.Logf("output:\n%s", out)
			}
		})
	}
}

// sections splits output at "== NAME" lines.
func sections(out string) map[string]string {
	sec := map[string]string{}
	cur := ""
	for _, line := range strings.SplitAfter(out, "\n") {
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "== "); ok {
			cur = name
			sec[cur] = ""
			continue
		}
		sec[cur] += line
	}
	return sec
}

// TestMountFusermountReason mounts as an ordinary user where fusermount3
// refuses, and checks that the one-line error carries fusermount3's own
// reason, not just its exit status.
func TestMountFusermountReason(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	host, port := splitAddr(t, g.Addr)
	for _, tc := range []struct {
		name      string
		devMode   string
		userOwned bool
		want      string
	}{
		{"dev-fuse-denied", "0600", true, "FUSE mount on MNT failed: fusermount3: failed to open /dev/fuse: Permission denied"},
		{"mountpoint-not-writable", "0666", false, "FUSE mount on MNT failed: fusermount3: user has no write access to mountpoint MNT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newUserSandbox(t)
			mnt := s.mkdir(t, "mnt", tc.userOwned)
			for _, fg := range []string{"background", "foreground"} {
				flag := ""
				if fg == "foreground" {
					flag = "-f "
				}
				script := `user "$RDMAFS" mount ` + flag + `-o port=` + port + `,timeo=50,retrans=1 ` + host + `:` + g.Export + ` ` + mnt + ` || code=$?; echo "exit ${code:-0}"`
				out, err := inUserNamespace(t, s, tc.devMode, nil, script)
				if err != nil {
					t.Fatalf("%s: %v: %s", fg, err, out)
				}
				msg, code, _ := strings.Cut(out, "exit ")
				if strings.TrimSpace(code) != "3" {
					t.Errorf("%s: exit %q, want 3", fg, strings.TrimSpace(code))
				}
				want := strings.ReplaceAll(tc.want, "MNT", mnt)
				if strings.Count(msg, "\n") != 1 || !strings.HasPrefix(msg, "rdmafs: "+want) {
					t.Errorf("%s: got %q, want one line starting with %q", fg, msg, "rdmafs: "+want)
				}
				if !regexp.MustCompile(`\(fuse mount on \S+: fusermount exited with code \d+\)\n$`).MatchString(msg) {
					t.Errorf("%s: %q does not end with go-fuse's exit status", fg, msg)
				}
				t.Logf("%s: %s", fg, strings.TrimSpace(msg))
			}
		})
	}
}

// TestCheckPrivateDir checks what makes a run directory acceptable: a
// real directory (not a symbolic link), owned by the user, that neither
// group nor others may write to.
func TestCheckPrivateDir(t *testing.T) {
	base := t.TempDir()
	uid := os.Geteuid()
	ok := filepath.Join(base, "ok")
	if err := os.Mkdir(ok, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := checkPrivateDir(ok, uid); err != nil {
		t.Errorf("0700 directory of uid %d: %v", uid, err)
	}
	if err := checkPrivateDir(ok, uid+1); err == nil || !strings.Contains(err.Error(), "belongs to uid") {
		t.Errorf("directory of another uid: %v, want refused as another's", err)
	}
	for _, c := range []struct {
		mode fs.FileMode
		ok   bool
	}{{0o755, true}, {0o775, false}, {0o757, false}, {0o777, false}} {
		d := filepath.Join(base, fmt.Sprintf("mode%o", c.mode))
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, c.mode); err != nil {
			t.Fatal(err)
		}
		err := checkPrivateDir(d, uid)
		if c.ok && err != nil {
			t.Errorf("%04o directory: %v, want accepted (no one else may write to it)", c.mode, err)
		}
		if !c.ok && (err == nil || !strings.Contains(err.Error(), fmt.Sprintf("mode %04o", c.mode))) {
			t.Errorf("%04o directory: %v, want refused for its mode", c.mode, err)
		}
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(ok, link); err != nil {
		t.Fatal(err)
	}
	if err := checkPrivateDir(link, uid); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("symbolic link to a private directory: %v, want refused as a link", err)
	}
	if got := userRunDirs(1000, ""); len(got) != 1 || got[0] != "/tmp/rdmafs-1000" {
		t.Errorf("userRunDirs without XDG_RUNTIME_DIR: %q", got)
	}
	if got := userRunDirs(1000, "/run/user/1000"); len(got) != 2 || got[0] != "/run/user/1000/rdmafs" {
		t.Errorf("userRunDirs with XDG_RUNTIME_DIR: %q", got)
	}
}

// TestUserMountFlags checks an ordinary user's mount: nosuid,nodev
// whatever it asks (fusermount3), suid or dev refused with the reason,
// and the flags fusermount3 sets (noatime, noexec) passed on to it.
func TestUserMountFlags(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	host, port := splitAddr(t, g.Addr)
	s := newUserSandbox(t)
	mnt := s.mkdir(t, "mnt", true)
	script := `
MNT=` + mnt + `
trap 'user fusermount3 -u -z "$MNT" 2>/dev/null || true' EXIT
echo "== suid"; user "$RDMAFS" mount -o port=` + port + `,suid ` + host + `:` + g.Export + ` "$MNT" 2>&1 || echo "exit $?"
user "$RDMAFS" mount -o port=` + port + `,noatime,noexec ` + host + `:` + g.Export + ` "$MNT"
echo "== flags"; grep " $MNT " /proc/self/mountinfo | cut -d' ' -f6
user "$RDMAFS" umount "$MNT"
`
	out, err := inUserNamespace(t, s, "0666", nil, script)
	if err != nil {
		t.Fatalf("as uid %s: %v\n%s", testUID, err, out)
	}
	sec := sections(out)
	if !strings.Contains(sec["suid"], "option suid: only root mounts with suid") || !strings.Contains(sec["suid"], "exit 1") {
		t.Errorf("mount -o suid as a user: got %q, want the reason and exit 1", sec["suid"])
	}
	flags := strings.Split(strings.TrimSpace(sec["flags"]), ",")
	for _, f := range []string{"nosuid", "nodev", "noexec", "noatime"} {
		if !has(flags, f) {
			t.Errorf("user mount's flags %v lack %s", flags, f)
		}
	}
}
