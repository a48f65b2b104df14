package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// mtabProcs and mtabRounds size the lock-file race. Before the fix, 3
// processes did not fail reliably in a few hundred rounds here; 8
// processes of 500 rounds failed 1 or 2 times in 2 runs of 3 on ganesha
// (EIO from open and from fcntl: NFS4ERR_BAD_STATEID).
const mtabProcs, mtabRounds = 8, 300

// TestMtabLockRace runs testdata/mtablock.c, the way mount(8)'s old mtab
// lock took turns at a lock file (xfstests generic/089), in several
// processes at once on one mount: no open or fcntl may fail with EIO or
// ESTALE, where the Linux client answers ENOENT (the name is gone, which
// the program retries) or succeeds. The races: a REMOVE between the
// kernel's LOOKUP and rdmafs's OPEN by handle (NFS4ERR_STALE), and a
// REMOVE just after the OPEN, before the open counted for silly rename
// (the LOCK then got NFS4ERR_BAD_STATEID). knfsd runs last.
func TestMtabLockRace(t *testing.T) {
	bin := buildC(t, "mtablock")
	eachWay(t, []testpeer.Way{testpeer.GaneshaTCP, testpeer.KnfsdTCP}, func(t *testing.T, p peer) { mtabRace(t, bin, p) })
}

func mtabRace(t *testing.T, bin string, p peer) {
	mnt := mount(t, p)
	d := testDir(t, mnt)
	defer os.RemoveAll(d)
	var wg sync.WaitGroup
	outs := make([]string, mtabProcs)
	errs := make([]error, mtabProcs)
	for i := range mtabProcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(bin, d, strconv.Itoa(mtabRounds))
			// Not a timing limit: a few hundred rounds take seconds.
			timer := time.AfterFunc(5*time.Minute, func() { cmd.Process.Kill() })
			defer timer.Stop()
			out, err := cmd.CombinedOutput()
			outs[i], errs[i] = string(out), err
		}()
	}
	wg.Wait()
	failed := 0
	for i := range mtabProcs {
		if errs[i] != nil || !strings.Contains(outs[i], "done ") {
			t.Errorf("%s: process %d: %v\n%s", p.name, i, errs[i], outs[i])
			continue
		}
		for _, l := range strings.Split(outs[i], "\n") {
			if strings.HasPrefix(l, "error ") {
				failed++
				if failed <= 20 {
					t.Errorf("%s: process %d: %s", p.name, i, l)
				}
			}
		}
	}
	if failed > 0 {
		t.Errorf("%s: %d errors in %d rounds of %d processes", p.name, failed, mtabRounds, mtabProcs)
		out, _ := runBin(t, time.Minute, "stats", mnt)
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "eio:") {
				t.Logf("rdmafs stats: %s", l)
			}
		}
	}
	// The kernel sends a file's RELEASE after close(2) (and the exit
	// that closed it) has returned, so the last processes' silly-renamed
	// names may still be on their way out: a name still there 10 s later
	// is left for good.
	var left []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left, _ = filepath.Glob(filepath.Join(d, ".nfs*"))
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("%s: silly-renamed names left 10 s after the last process ended: %v", p.name, left)
	}
}
