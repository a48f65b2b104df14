package fuse

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/rdmafs/rdmafs/internal/lru"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// maxAuthSysGroups is the AUTH_SYS limit on supplementary groups (RFC
// 5531 appendix A: gids<16>).
const maxAuthSysGroups = 16

// groupsTTL bounds how long a process's group list is reused.
const groupsTTL = 2 * time.Second

// maxCachedCallers bounds the callers whose groups are remembered; the
// least recently used goes first.
const maxCachedCallers = 1024

// credCache remembers the supplementary groups of recent callers, read
// from /proc/PID/status, so that each request does not read it again.
// An entry is for one thread id with one uid and gid: a thread id
// reused, or a thread that changed its credentials, is read again.
type credCache struct {
	callers lru.Cache[uint32, groupsEntry] // by thread id; Max: newCredCache
}

// newCredCache returns an empty cache of at most maxCachedCallers.
func newCredCache() *credCache {
	cc := &credCache{}
	cc.callers.Max = maxCachedCallers
	return cc
}

type groupsEntry struct {
	uid, gid uint32
	groups   []uint32
	at       time.Time
}

// cred returns the AUTH_SYS credential of the process that made the FUSE
// request in ctx: its uid, gid and supplementary groups. Requests the
// kernel makes on its own (no caller) use root.
func (f *FS) cred(ctx context.Context) oncrpc.Credential {
	caller, ok := gofuse.FromContext(ctx)
	if !ok || caller == nil {
		return f.c.Cred(0, 0, nil)
	}
	groups := f.creds.groups(caller.Pid, caller.Uid, caller.Gid)
	return f.c.Cred(caller.Uid, caller.Gid, groups)
}

// groups returns the supplementary groups for a request of thread pid
// with fsuid uid and fsgid gid (what the kernel puts in the FUSE
// request: fs/fuse/dev.c, current_fsuid()).
func (cc *credCache) groups(pid, uid, gid uint32) []uint32 {
	if pid == 0 {
		return nil
	}
	now := time.Now()
	if e, ok := cc.callers.Get(pid); ok && e.uid == uid && e.gid == gid && now.Sub(e.at) < groupsTTL {
		return e.groups
	}
	st, err := procCred(pid)
	// The groups are lent only by the thread whose status says it has
	// the request's credentials: a thread id reused by another user's
	// process, or a thread that changed its credentials (setuid) since
	// the request was made, keeps its groups. The process gone, its uid
	// and gid are enough.
	var groups []uint32
	if err == nil && st.fsuid == uid && st.fsgid == gid {
		groups = st.groups
	}
	// The primary gid already travels in the credential.
	out := groups[:0:0]
	for _, g := range groups {
		if g != gid && len(out) < maxAuthSysGroups {
			out = append(out, g)
		}
	}
	cc.callers.Put(pid, groupsEntry{uid: uid, gid: gid, groups: out, at: now})
	return out
}

// len returns the number of callers remembered.
func (cc *credCache) len() int { return cc.callers.Len() }

// statusCred is what /proc/PID/status says of a thread's credentials.
type statusCred struct {
	fsuid, fsgid uint32
	groups       []uint32
}

// procCred reads the credentials of thread pid from /proc.
func procCred(pid uint32) (statusCred, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return statusCred{}, err
	}
	return parseStatusCred(b)
}

// parseStatusCred extracts the file-system uid and gid (the fourth
// field of the "Uid:" and "Gid:" lines: real, effective, saved set,
// file system; proc(5)) and the "Groups:" line of a /proc/PID/status
// file.
func parseStatusCred(status []byte) (statusCred, error) {
	var c statusCred
	var haveUID, haveGID, haveGroups bool
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		key, rest, ok := bytes.Cut(sc.Bytes(), []byte(":"))
		if !ok {
			continue
		}
		var err error
		switch string(key) {
		case "Uid":
			c.fsuid, err = fsID(rest)
			haveUID = true
		case "Gid":
			c.fsgid, err = fsID(rest)
			haveGID = true
		case "Groups":
			c.groups, err = parseIDs(rest)
			haveGroups = true
		}
		if err != nil {
			return statusCred{}, fmt.Errorf("%s: %w", key, err)
		}
	}
	if err := sc.Err(); err != nil {
		return statusCred{}, err
	}
	if !haveUID || !haveGID || !haveGroups {
		return statusCred{}, fmt.Errorf("no Uid, Gid or Groups line")
	}
	return c, nil
}

// fsID returns the fourth of a Uid or Gid line's four ids.
func fsID(rest []byte) (uint32, error) {
	ids, err := parseIDs(rest)
	if err != nil {
		return 0, err
	}
	if len(ids) != 4 {
		return 0, fmt.Errorf("%d ids, want 4", len(ids))
	}
	return ids[3], nil
}

func parseIDs(rest []byte) ([]uint32, error) {
	var ids []uint32
	for _, f := range bytes.Fields(rest) {
		v, err := strconv.ParseUint(string(f), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("id %q: %w", f, err)
		}
		ids = append(ids, uint32(v))
	}
	return ids, nil
}
