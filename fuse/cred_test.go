package fuse

import (
	"os/exec"
	"reflect"
	"syscall"
	"testing"
)

const statusBash = "Name:\tbash\nUid:\t1000\t1000\t1000\t1001\nGid:\t100\t100\t100\t101\nGroups:\t4 24 27 100 \nNgid:\t0\n"

func TestParseStatusCred(t *testing.T) {
	got, err := parseStatusCred([]byte(statusBash))
	want := statusCred{fsuid: 1001, fsgid: 101, groups: []uint32{4, 24, 27, 100}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, %v; want %+v", got, err, want)
	}
	got, err = parseStatusCred([]byte("Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\n"))
	if err != nil || len(got.groups) != 0 {
		t.Errorf("no groups: got %+v, %v", got, err)
	}
	for _, bad := range []string{
		"Groups:\t4\n", // no Uid, Gid
		"Uid:\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\n",     // three uids
		"Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\tx\n", // not a number
	} {
		if _, err := parseStatusCred([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// FuzzParseStatusCred: any bytes give credentials or an error, never a
// panic.
func FuzzParseStatusCred(f *testing.F) {
	f.Add([]byte(statusBash))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseStatusCred(b)
		if err == nil && len(c.groups) > len(b) {
			t.Fatalf("%d groups from %d bytes", len(c.groups), len(b))
		}
	})
}

// TestCredCacheChecksCredentials: a process with uid and gid 1000 and
// groups 4242 and 4343 lends them to a request with its uid and gid,
// and to none with other ids (its pid reused by another user, or a
// process that changed its credentials since).
func TestCredCacheChecksCredentials(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{4242, 4343}}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	pid := uint32(cmd.Process.Pid)
	cc := newCredCache()
	if got := cc.groups(pid, 0, 0); len(got) != 0 {
		t.Errorf("uid 0: lent the groups %v of uid 1000", got)
	}
	if got := cc.groups(pid, 1000, 0); len(got) != 0 {
		t.Errorf("gid 0: lent the groups %v of gid 1000", got)
	}
	if got := cc.groups(pid, 1000, 1000); !reflect.DeepEqual(got, []uint32{4242, 4343}) {
		t.Errorf("its own credentials: groups %v, want [4242 4343]", got)
	}
}

// TestCredCacheBound: the cache keeps at most maxCachedCallers callers,
// dropping the least recently used.
func TestCredCacheBound(t *testing.T) {
	cc := newCredCache()
	const first = 1 << 30 // thread ids no process has: nothing to read
	for i := range uint32(3 * maxCachedCallers) {
		cc.groups(first+i, 1000, 1000)
		if i == 0 {
			continue
		}
		cc.groups(first, 1000, 1000) // kept in use
	}
	if n := cc.len(); n != maxCachedCallers {
		t.Errorf("%d callers cached, want %d", n, maxCachedCallers)
	}
	_, kept := cc.callers.Get(first)
	_, dropped := cc.callers.Get(first + 1)
	if !kept || dropped {
		t.Errorf("the caller in use kept: %v; the oldest dropped: %v", kept, !dropped)
	}
}
