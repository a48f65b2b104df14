package fuse

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// maxAuthSysGroups is the AUTH_SYS limit on supplementary groups (RFC
// 5531 appendix A: gids<16>).
const maxAuthSysGroups = 16

// groupsTTL bounds how long a process's group list is reused.
const groupsTTL = 2 * time.Second

// credCache remembers the supplementary groups of recent callers, read
// from /proc/PID/status, so that each request does not read it again.
type credCache struct {
	mu      sync.Mutex
	entries map[uint32]groupsEntry
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

func (cc *credCache) groups(pid, uid, gid uint32) []uint32 {
	if pid == 0 {
		return nil
	}
	now := time.Now()
	cc.mu.Lock()
	if e, ok := cc.entries[pid]; ok && e.uid == uid && e.gid == gid && now.Sub(e.at) < groupsTTL {
		cc.mu.Unlock()
		return e.groups
	}
	cc.mu.Unlock()
	groups, err := procGroups(pid)
	if err != nil {
		groups = nil // the process is gone: its uid and gid are enough
	}
	// The primary gid already travels in the credential.
	out := groups[:0:0]
	for _, g := range groups {
		if g != gid && len(out) < maxAuthSysGroups {
			out = append(out, g)
		}
	}
	cc.mu.Lock()
	if cc.entries == nil || len(cc.entries) > 4096 {
		cc.entries = make(map[uint32]groupsEntry)
	}
	cc.entries[pid] = groupsEntry{uid: uid, gid: gid, groups: out, at: now}
	cc.mu.Unlock()
	return out
}

// procGroups reads the supplementary groups of pid from /proc.
func procGroups(pid uint32) ([]uint32, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	return parseGroups(b)
}

// parseGroups extracts the "Groups:" line of a /proc/PID/status file.
func parseGroups(status []byte) ([]uint32, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		line := sc.Bytes()
		rest, ok := bytes.CutPrefix(line, []byte("Groups:"))
		if !ok {
			continue
		}
		var gs []uint32
		for _, f := range bytes.Fields(rest) {
			v, err := strconv.ParseUint(string(f), 10, 32)
			if err != nil {
				return nil, fmt.Errorf("groups %q: %w", f, err)
			}
			gs = append(gs, uint32(v))
		}
		return gs, nil
	}
	return nil, fmt.Errorf("no Groups line")
}
