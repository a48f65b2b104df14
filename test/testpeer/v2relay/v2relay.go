// Package v2relay starts, once per test binary, an RPC-over-RDMA
// version-2 responder that relays to nfs-ganesha over TCP with the NFSv4
// upper-layer binding: no public server speaks version 2, so tests of the
// mount over version 2 talk to ganesha through it.
package v2relay

import (
	"sync"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/rpcrdma"
	"github.com/rdmafs/rdmafs/test/testpeer"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

var relay struct {
	once sync.Once
	addr string
	err  error
}

// Require returns the relay's RDMA address ("127.0.0.1:port"), starting
// it (and ganesha, through testpeer) on first use. It fails the test if
// it cannot.
func Require(t testing.TB) string {
	t.Helper()
	g := testpeer.RequireGanesha(t)
	relay.once.Do(func() {
		tcp := oncrpc.NewTCPTransport(g.Addr, oncrpc.TCPOptions{})
		resp, err := rpcrdma.Listen("127.0.0.1:0", rpcrdma.ResponderConfig{
			Provider: &iwarp.Provider{}, Handler: oncrpc.Relay(tcp, time.Minute), ReplyBulk: nfsclient.ReplyBulk,
			MaxVersion: rpcrdma.Version2, XChars: true, RemoteInvalidate: true, Credits: 64,
		})
		if err == nil {
			relay.addr = resp.Addr()
		}
		relay.err = err
	})
	if relay.err != nil {
		t.Fatalf("version-2 relay: %v", relay.err)
	}
	return relay.addr
}
