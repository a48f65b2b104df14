package nfs_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/nfs"
	"github.com/rdmafs/rdmafs/test/testpeer"
)

// peer is a server of test/testpeer's matrix to run a test against, and
// the options to dial it with.
type peer struct {
	name string // the subtest's name; the way's if empty
	way  testpeer.Way
	opts nfs.Options
}

// peers are the servers every file-system test runs against: ganesha
// over TCP (also with nconnect), knfsd over TCP, and knfsd over
// RPC-over-RDMA on its soft-iWARP listener with the pure-Go provider.
var peers = []peer{
	{way: testpeer.GaneshaTCP},
	{name: "ganesha-nconnect", way: testpeer.GaneshaTCP, opts: nfs.Options{NConnect: 3}},
	{way: testpeer.KnfsdTCP},
	{way: testpeer.KnfsdRDMA, opts: nfs.Options{Transport: "rdma", RDMADevice: "iwarp-go"}},
}

// label returns the subtest's name.
func (p peer) label() string {
	if p.name != "" {
		return p.name
	}
	return p.way.Name
}

// target returns the "host:port:/export" to dial, starting the server
// if needed.
func (p peer) target(t *testing.T) string {
	s := p.way.Server(t)
	return s.Addr + ":" + s.Export
}

// forEachPeer runs f against each peer with a connected client and a
// fresh directory of the test's own in the export, removed afterwards.
func forEachPeer(t *testing.T, f func(t *testing.T, c *nfs.Client, dir string)) {
	for _, p := range peers {
		t.Run(p.label(), func(t *testing.T) {
			c := dialPeer(t, p, p.opts)
			dir := fmt.Sprintf("nfstest-%s-%d-%d", t.Name(), os.Getpid(), time.Now().UnixNano())
			dir = sanitize(dir)
			ctx := testCtx(t)
			if err := c.Mkdir(ctx, dir, 0o777); err != nil {
				t.Fatalf("Mkdir %s: %v", dir, err)
			}
			t.Cleanup(func() {
				if err := c.RemoveAll(context.Background(), dir); err != nil {
					t.Errorf("RemoveAll %s: %v", dir, err)
				}
			})
			f(t, c, dir)
		})
	}
}

// dialPeer connects to p with opts; the client is closed at the end of
// the test.
func dialPeer(t *testing.T, p peer, opts nfs.Options) *nfs.Client {
	t.Helper()
	target := p.target(t)
	c, err := nfs.Dial(testCtx(t), target, opts)
	if err != nil {
		t.Fatalf("Dial %s: %v", target, err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// testCtx ends with the test's deadline, if any.
func testCtx(t *testing.T) context.Context {
	ctx := context.Background()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d)
		t.Cleanup(cancel)
	}
	return ctx
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '/' || c == ' ' {
			b[i] = '_'
		}
	}
	return string(b)
}
