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

// makeRunDir creates the directory of this process's stats sockets and
// handle caches (0700) or checks the one there. Whoever's it is, it must
// be private to this process's user: a real directory (not a symbolic
// link) owned by the effective uid that no one else may write to, in a
// parent no one else may rename it out of (one owned by the user or root,
// writable by others only when sticky, as /tmp). Another user could
// otherwise have made it first and put their own socket in place of ours,
// or a link where we write a handle cache.
func makeRunDir() (string, error) {
	d := runDir()
	if err := ensureRunDir(d, os.Geteuid()); err != nil {
		return "", err
	}
	return d, nil
}

// ensureRunDir makes d (0700) if it is missing, and checks it and its
// parent as makeRunDir says.
func ensureRunDir(d string, uid int) error {
	parent := filepath.Dir(d)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("run directory: %w", err)
	}
	if err := checkRunDirParent(parent, uid); err != nil {
		return err
	}
	if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("run directory: %w", err)
	}
	return checkPrivateDir(d, uid)
}

// checkPrivateDir checks that d is a directory (not a symbolic link)
// owned by uid that neither group nor others may write to.
func checkPrivateDir(d string, uid int) error {
	fi, err := os.Lstat(d)
	if err != nil {
		return fmt.Errorf("run directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("run directory %s is a symbolic link (refused: remove it, or set %s)", d, runDirEnv)
	case !fi.IsDir() || !ok:
		return fmt.Errorf("run directory %s is not a directory (remove it, or set %s)", d, runDirEnv)
	case int(st.Uid) != uid:
		return fmt.Errorf("run directory %s belongs to uid %d, not to uid %d (refused: remove it, or set %s)", d, st.Uid, uid, runDirEnv)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("run directory %s has mode %04o: others may write to it (refused: chmod go-w it)", d, fi.Mode().Perm())
	}
	return nil
}

// checkRunDirParent checks that no one but uid and root can replace the
// run directory in parent: parent is theirs, and others may write to it
// only when it is sticky (where only the owner of a name can remove or
// rename it).
func checkRunDirParent(parent string, uid int) error {
	fi, err := os.Stat(parent)
	if err != nil {
		return fmt.Errorf("run directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || (int(st.Uid) != uid && st.Uid != 0) {
		return fmt.Errorf("run directory's parent %s belongs to another user (refused: set %s)", parent, runDirEnv)
	}
	if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
		return fmt.Errorf("run directory's parent %s has mode %04o: others may replace the run directory (refused: chmod +t or go-w it)", parent, fi.Mode().Perm())
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
	// The new file a Shutdown renames over its cache (fuse's
	// saveHandleCache), left by a process that died before the rename.
	temps, _ := filepath.Glob(filepath.Join(dir, ".*.handles.*"))
	for _, name := range append(names, temps...) {
		if st, err := os.Lstat(name); name == keep || err != nil || !st.Mode().IsRegular() || !st.ModTime().Before(cutoff) {
			continue
		}
		f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			os.Remove(name)
		}
		f.Close()
	}
}
