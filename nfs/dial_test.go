package nfs_test

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/nfs"
	"github.com/rdmafs/rdmafs/test/testpeer"
)

// TestDialBadTarget checks that malformed targets and options fail
// before any connection.
func TestDialBadTarget(t *testing.T) {
	for _, target := range []string{"", "server", "server:export", "server:0:/export", "server:99999:/x", ":/export", "[::1/export", "server:2049:export"} {
		if c, err := nfs.Dial(context.Background(), target, nfs.Options{}); err == nil || !strings.Contains(err.Error(), "server[:port]:/export") {
			t.Errorf("Dial(%q): %v, want a target error", target, err)
			if c != nil {
				c.Close()
			}
		}
	}
	for _, opts := range []nfs.Options{{Transport: "udp"}, {RDMAVersion: 3}, {MinorVersion: 3}, {Trace: new(strings.Builder), TraceCategories: "colour"}} {
		if _, err := nfs.Dial(context.Background(), "127.0.0.1:1:/", opts); err == nil {
			t.Errorf("Dial with %+v succeeded", opts)
		}
	}
}

// TestDialErrors checks the errors of a server that is not there and of
// an export the server does not have.
func TestDialErrors(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	_, err = nfs.Dial(testCtx(t), closed+":/export", nfs.Options{Timeout: time.Second, Retrans: 1})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Dial of a closed port: %v, want ECONNREFUSED", err)
	}
	_, err = nfs.Dial(testCtx(t), g.Addr+":/no-such-export", nfs.Options{})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Dial of a missing export: %v, want fs.ErrNotExist", err)
	}
	var trace strings.Builder
	c, err := nfs.Dial(testCtx(t), g.Addr+":"+g.Export, nfs.Options{Trace: &trace, TraceCategories: "nfs"})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if !strings.Contains(trace.String(), "EXCHANGE_ID") {
		t.Errorf("trace of a Dial lacks EXCHANGE_ID:\n%s", trace.String())
	}
}
