package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Where the serving process of a mount keeps its stats socket:
//
//   - root: /run/rdmafs;
//   - any other user: $XDG_RUNTIME_DIR/rdmafs when XDG_RUNTIME_DIR is set,
//     else /tmp/rdmafs-UID, a private (0700) directory the user owns;
//   - anyone: $RDMAFS_RUN_DIR when set.
//
// "rdmafs stats" and "rdmafs umount" look in root's place, in their own
// user's places and in those of the user who made the mount (the FUSE
// mount's user_id), so that root finds a user's mount and a user finds
// one root made.
const (
	runDirEnv  = "RDMAFS_RUN_DIR"
	rootRunDir = "/run/rdmafs"
)

// runDir returns the directory this process makes its stats socket in.
func runDir() string {
	if d := os.Getenv(runDirEnv); d != "" {
		return d
	}
	uid := os.Geteuid()
	if uid == 0 {
		return rootRunDir
	}
	return userRunDirs(uid, os.Getenv("XDG_RUNTIME_DIR"))[0]
}

// userRunDirs returns uid's places for stats sockets, preferred first:
// xdg/rdmafs when xdg (the user's XDG_RUNTIME_DIR) is set, and
// /tmp/rdmafs-UID.
func userRunDirs(uid int, xdg string) []string {
	tmp := "/tmp/rdmafs-" + strconv.Itoa(uid)
	if xdg == "" {
		return []string{tmp}
	}
	return []string{filepath.Join(xdg, "rdmafs"), tmp}
}

// socketName is the file name of the stats socket of the mount on dir: a
// hash of the absolute mountpoint, so any path to it finds the same one.
func socketName(dir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(dir)))
	return hex.EncodeToString(sum[:8]) + ".sock"
}

// statsSocket is the path of the stats socket this process makes for
// the mount on dir.
func statsSocket(dir string) string {
	return filepath.Join(runDir(), socketName(dir))
}

// makeRunDir creates the directory of this process's stats sockets. A
// non-root user's directory must be private: owned by the user and not
// accessible to others, since another user could otherwise have made it
// first and put their own socket in place of ours.
func makeRunDir() (string, error) {
	d := runDir()
	uid := os.Geteuid()
	if os.Getenv(runDirEnv) != "" || uid == 0 {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", fmt.Errorf("create %s: %w", d, err)
		}
		return d, nil
	}
	if err := os.MkdirAll(filepath.Dir(d), 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", filepath.Dir(d), err)
	}
	if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("create %s: %w", d, err)
	}
	if err := checkPrivateDir(d, uid); err != nil {
		return "", err
	}
	return d, nil
}

// checkPrivateDir checks that d is a directory (not a symbolic link)
// owned by uid with no permissions for group or others.
func checkPrivateDir(d string, uid int) error {
	fi, err := os.Lstat(d)
	if err != nil {
		return fmt.Errorf("stats directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok {
		return fmt.Errorf("stats directory %s is not a directory (remove it)", d)
	}
	if int(st.Uid) != uid || fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("stats directory %s is not private to uid %d: owner %d, mode %04o (remove it)", d, uid, st.Uid, fi.Mode().Perm())
	}
	return nil
}

// trustedDir reports whether the sockets in d can be believed to belong
// to uid's or root's mounts: d is owned by uid or root and no one else
// may write to it.
func trustedDir(d string, uid int) bool {
	fi, err := os.Lstat(d)
	if err != nil || !fi.IsDir() {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || (int(st.Uid) != uid && st.Uid != 0) {
		return false
	}
	return fi.Mode().Perm()&0o022 == 0
}

// socketCandidates returns where the socket name may be, in the order to
// try: $RDMAFS_RUN_DIR only, when set; else root's place, this user's
// places and, when dir is a mount's directory (not "": a relay's socket
// has no mount), the places of the user who made that mount.
func socketCandidates(name, dir string) []string {
	if d := os.Getenv(runDirEnv); d != "" {
		return []string{filepath.Join(d, name)}
	}
	type place struct {
		dir string
		uid int
	}
	places := []place{{rootRunDir, 0}}
	if uid := os.Geteuid(); uid != 0 {
		for _, d := range userRunDirs(uid, os.Getenv("XDG_RUNTIME_DIR")) {
			places = append(places, place{d, uid})
		}
	}
	if owner, ok := mountUserID(dir); dir != "" && ok && owner != 0 && owner != os.Geteuid() {
		// That user's XDG_RUNTIME_DIR is not known here; systemd's is
		// /run/user/UID.
		xdg := filepath.Join("/run/user", strconv.Itoa(owner))
		for _, d := range userRunDirs(owner, xdg) {
			places = append(places, place{d, owner})
		}
	}
	var out []string
	seen := map[string]bool{}
	for _, p := range places {
		if seen[p.dir] || !trustedDir(p.dir, p.uid) {
			continue
		}
		seen[p.dir] = true
		out = append(out, filepath.Join(p.dir, name))
	}
	return out
}

// dialStats connects to the stats socket of the mount on dir, wherever
// its serving process made it.
func dialStats(dir string, timeout time.Duration) (net.Conn, error) {
	return dialSocket(socketName(dir), dir, timeout)
}

// dialSocket connects to the socket name in the first place of
// socketCandidates(name, dir) that has it.
func dialSocket(name, dir string, timeout time.Duration) (net.Conn, error) {
	cands := socketCandidates(name, dir)
	var dirs []string
	var last error
	for _, p := range cands {
		c, err := net.DialTimeout("unix", p, timeout)
		if err == nil {
			return c, nil
		}
		dirs = append(dirs, filepath.Dir(p))
		if !errors.Is(err, fs.ErrNotExist) {
			last = err
		}
	}
	if last != nil {
		return nil, last
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("no stats directory (%s, or the user's %s)", rootRunDir, strings.Join(userRunDirs(os.Geteuid(), os.Getenv("XDG_RUNTIME_DIR")), " or "))
	}
	return nil, fmt.Errorf("no stats socket %s in %s", name, strings.Join(dirs, ", "))
}

// mountUserID returns the user_id option of the FUSE mount on dir: the
// user who made it.
func mountUserID(dir string) (int, bool) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return 0, false
	}
	uid, found := 0, false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || unescapeMount(f[1]) != dir || !strings.HasPrefix(f[2], "fuse") {
			continue
		}
		for _, o := range strings.Split(f[3], ",") {
			if v, ok := strings.CutPrefix(o, "user_id="); ok {
				if n, err := strconv.Atoi(v); err == nil {
					uid, found = n, true // the last mount on dir is the visible one
				}
			}
		}
	}
	return uid, found
}

// handleCache returns the file in which the mount of export on dir keeps
// the NFS file handles it saw across a remount (fuse.Options.HandleCache),
// in the run directory; "" (no cache) when that cannot be made.
func handleCache(server, export, dir string) string {
	d, err := makeRunDir()
	if err != nil {
		return ""
	}
	sum := sha256.Sum256([]byte(server + "\x00" + export + "\x00" + filepath.Clean(dir)))
	path := filepath.Join(d, hex.EncodeToString(sum[:8])+".handles")
	pruneHandleCaches(d, path, time.Now().Add(-handleCacheMaxAge))
	return path
}

// handleCacheMaxAge is how long the handle cache of a mount point not
// mounted since is kept. There is one per server, export and mount point
// ever used; a remount soon after an unmount is what it is for.
const handleCacheMaxAge = 14 * 24 * time.Hour

// pruneHandleCaches removes the handle caches in dir last saved before
// cutoff, except keep and those a live mount holds (locked from its start
// to its Shutdown, fuse.Options.HandleCache).
func pruneHandleCaches(dir, keep string, cutoff time.Time) {
	names, _ := filepath.Glob(filepath.Join(dir, "*.handles"))
	for _, name := range names {
		if st, err := os.Stat(name); name == keep || err != nil || !st.ModTime().Before(cutoff) {
			continue
		}
		f, err := os.Open(name)
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			os.Remove(name)
		}
		f.Close()
	}
}
