// Package fusetest holds what the tests of more than one package do with
// an rdmafs FUSE mount served in the test's own process: unmount it when
// the test ends, and wait for the server to hand it a delegation.
package fusetest

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/nfsclient"
)

// UnmountAtCleanup unmounts m (at dir), waits for it to be served no
// more and shuts its session down when the test ends; a failed unmount
// is an error, and a lazy one then leaves no mount behind.
func UnmountAtCleanup(t testing.TB, m *fuse.Mount, dir string) {
	t.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
			exec.Command("fusermount3", "-u", "-z", dir).Run()
		}
		m.Wait()
		sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
		defer scancel()
		if err := m.Shutdown(sctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
}

// delegationCounter is the client whose delegations OpenDelegated counts.
type delegationCounter interface {
	DelegationStats() nfsclient.DelegationStats
}

// OpenDelegated opens path for reading, again and again, until c holds a
// delegation, for at most wait, and returns the file left open; it
// reports false if none came. knfsd grants a read delegation only once
// it has probed the client's callback path (RFC 8881 s10.2.1: a server
// may withhold delegations until then).
func OpenDelegated(t testing.TB, c delegationCounter, path string, wait time.Duration) (*os.File, bool) {
	t.Helper()
	var f *os.File
	for deadline := time.Now().Add(wait); ; {
		if f != nil {
			f.Close()
		}
		var err error
		if f, err = os.Open(path); err != nil {
			t.Fatal(err)
		}
		if c.DelegationStats().Held > 0 {
			return f, true
		}
		if time.Now().After(deadline) {
			return f, false
		}
		time.Sleep(50 * time.Millisecond) // polling interval, not synchronisation
	}
}
