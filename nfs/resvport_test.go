package nfs_test

import (
	"context"

	"os"

	"testing"
	"time"

	"github.com/rdmafs/rdmafs/nfs"
	"github.com/rdmafs/rdmafs/test/testpeer"
)

// TestDialResvPort: as root, the library connects from a reserved source
// port (nfs(5) resvport), as a server's secure export requires, and from
// an ephemeral one with NoResvPort. The "server" is a listener that
// records its peer's port and answers nothing: the claim is about the
// dialing.
func TestDialResvPort(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("a reserved port is bound as root only; run the tests as root")
	}
	for _, noResv := range []bool{false, true} {
		server, ports := testpeer.ListenPorts(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			if c, err := nfs.Dial(ctx, server+":/", nfs.Options{NoResvPort: noResv, Timeout: time.Second, Retrans: 1, Soft: true}); err == nil {
				c.Close()
			}
		}()
		select {
		case p := <-ports:
			if (p < 1024) == noResv {
				t.Errorf("NoResvPort=%v: the server saw source port %d", noResv, p)
			}
		case <-ctx.Done():
			t.Fatal("no connection reached the server")
		}
		cancel()
		<-done
	}
}
