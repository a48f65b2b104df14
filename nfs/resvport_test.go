package nfs_test

import (
	"context"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/nfs"
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
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports := make(chan int, 4)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				ports <- c.RemoteAddr().(*net.TCPAddr).Port
				defer c.Close()
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			if c, err := nfs.Dial(ctx, "127.0.0.1:"+strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)+":/", nfs.Options{NoResvPort: noResv, Timeout: time.Second, Retrans: 1, Soft: true}); err == nil {
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
