package fuse

import (
	"fmt"
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/nfsclient"
)

// TestNoteErrnoEIO: an error that reaches the application as EIO is
// counted with what it was; other errnos are not.
func TestNoteErrnoEIO(t *testing.T) {
	var c Counters
	c.noteErrno("GETATTR", nfsclient.ErrNoEnt, syscall.ENOENT)
	if c.EIOs.Load() != 0 || c.LastEIO.Load() != nil {
		t.Fatalf("ENOENT counted as EIO")
	}
	err := fmt.Errorf("decode GETATTR: %w", nfsclient.ErrProtocol)
	c.noteErrno("GETATTR", err, nfsclient.Errno(err))
	r := c.LastEIO.Load()
	if c.EIOs.Load() != 1 || r == nil || r.Op != "GETATTR" || r.Err != err.Error() {
		t.Fatalf("after an EIO: count %d, last %+v", c.EIOs.Load(), r)
	}
}
