package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/rpcrdma"
	"github.com/rdmafs/rdmafs/test/testpeer"
	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// dialRelayFrom connects an RPC-over-RDMA requester that sends nothing
// to the relay at addr from the local address src.
func dialRelayFrom(ctx context.Context, src, addr string) (verbs.QueuePair, error) {
	pv := &iwarp.Provider{DialConn: func(ctx context.Context, addr string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		return d.DialContext(ctx, "tcp", addr)
	}}
	// RFC 8797 private data, version 1.
	priv := rpcrdma.PrivateData{Version: 1, InlineSend: 4096, InlineRecv: 4096}.Marshal()
	return pv.Dial(ctx, addr, &verbs.ConnParams{PD: iwarp.NewProtectionDomain(), PrivateData: priv})
}

// TestRelayAllow: a relay that allows 127.0.0.2 alone refuses a client
// connecting from 127.0.0.1 (the loopback is all of 127/8), counts and
// logs the refusal, and serves 127.0.0.2.
func TestRelayAllow(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	r := startRelayBin(t, g.Addr, "--allow", "127.0.0.2/32")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if qp, err := dialRelayFrom(ctx, "127.0.0.1", r.addr); err == nil {
		qp.Close()
		t.Fatal("a client from 127.0.0.1 connected to a relay that allows 127.0.0.2/32 alone")
	}
	qp, err := dialRelayFrom(ctx, "127.0.0.2", r.addr)
	if err != nil {
		t.Fatalf("a client from 127.0.0.2, allowed: %v", err)
	}
	defer qp.Close()
	st := r.stats(t)
	t.Logf("relay stats:\n%s", st)
	if n := statField(t, st, "connections:", "not_allowed"); n != 1 {
		t.Errorf("%d connections refused as not allowed, want 127.0.0.1's 1", n)
	}
	if !strings.Contains(r.stderr.String(), "refused 127.0.0.1:") {
		t.Errorf("the refusal is not in the relay's log:\n%s", r.stderr)
	}
}

// TestRelaySquashGanesha: files created through the relay by root, with
// the default root squash, and by uid 1000, with --all-squash, are owned
// by the anonymous ids in ganesha's export directory on disk, as the
// server recorded them.
func TestRelaySquashGanesha(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	if g.Dir == "" {
		t.Fatal("the ganesha under test has no export directory on this host (RDMAFS_GANESHA_DIR)")
	}
	name := fmt.Sprintf("squash-%d", time.Now().UnixNano())
	disk := filepath.Join(g.Dir, name)
	if err := os.Mkdir(disk, 0o777); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(disk)
	if err := os.Chmod(disk, 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	owner := func(file string) (uint32, uint32) {
		t.Helper()
		fi, err := os.Stat(filepath.Join(disk, file))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		return st.Uid, st.Gid
	}
	for _, c := range []struct {
		name     string
		flags    []string
		as       string // a command prefix running it as another user
		uid, gid uint32
	}{
		{"root-squash", []string{"--root-squash"}, "", 65534, 65534},
		{"all-squash", []string{"--all-squash", "--anonuid", "4242", "--anongid", "4343"}, "setpriv --reuid=1000 --regid=1000 --clear-groups ", 4242, 4343},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := startRelayBin(t, g.Addr, c.flags...)
			mnt := mount(t, peer{name: "relay-ganesha", host: "127.0.0.1", port: r.port, export: g.Export, opts: []string{"proto=rdma", "rdmadev=iwarp-go", "allow_other"}})
			// The test's directories are root's, 0700: uid 1000 must
			// reach the mount point.
			for p := filepath.Dir(mnt); p != os.TempDir() && p != "/"; p = filepath.Dir(p) {
				os.Chmod(p, 0o755)
			}
			// Created with open(2) alone: touch's utimensat would be
			// checked by the kernel (default_permissions) against
			// the squashed owner.
			sh(t, time.Minute, c.as+"sh -c ': > "+filepath.Join(mnt, name, c.name)+"'")
			if uid, gid := owner(c.name); uid != c.uid || gid != c.gid {
				t.Errorf("%s created a file the server gave to %d:%d, want %d:%d", c.name, uid, gid, c.uid, c.gid)
			}
		})
	}
}

// TestRelayConnectionFlood: 80 connections that send nothing from
// 127.0.0.3 (enough to take a 16 MiB relay's registered memory before
// the per-source bound) get the per-source share alone, and a mount from
// 127.0.0.1 works beside them.
func TestRelayConnectionFlood(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	r := startRelayBin(t, g.Addr, "--memory", "16", "--max-connections-per-source", "16")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	held := 0
	for range 80 {
		qp, err := dialRelayFrom(ctx, "127.0.0.3", r.addr)
		if err == nil {
			held++
			defer qp.Close()
		}
	}
	if held > 16 {
		t.Errorf("127.0.0.3 holds %d connections, more than its 16", held)
	}
	mnt := mount(t, peer{name: "relay-ganesha", host: "127.0.0.1", port: r.port, export: g.Export, opts: []string{"proto=rdma", "rdmadev=iwarp-go"}})
	d := testDir(t, mnt)
	defer os.RemoveAll(d)
	out := sh(t, 2*time.Minute, "head -c 300000 /dev/urandom > "+d+"/f && cmp "+d+"/f "+d+"/f && echo flood ok")
	if !strings.Contains(out, "flood ok") {
		t.Fatalf("mount beside the flood: %s", out)
	}
	st := r.stats(t)
	t.Logf("relay stats:\n%s", st)
	if n := statField(t, st, "connections:", "over_limit"); n < 80-16 {
		t.Errorf("%d connections refused over the limit, want at least %d", n, 80-16)
	}
}

// TestRelayIdleTimeout: the relay closes a connection that sends
// nothing after --idle-timeout and counts it.
func TestRelayIdleTimeout(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	r := startRelayBin(t, g.Addr, "--idle-timeout", "1s")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	qp, err := dialRelayFrom(ctx, "127.0.0.1", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	select {
	case <-qp.Done():
	case <-ctx.Done():
		t.Fatalf("a connection that sent nothing is still open:\n%s", r.stats(t))
	}
	if n := statField(t, r.stats(t), "connections:", "idle_closed"); n != 1 {
		t.Errorf("%d connections closed as idle, want 1", n)
	}
}

// TestRelayResvPort: the relay, as root, connects to the server from a
// reserved port, and from any port with --noresvport. The "server" is a
// listener that records its peers' ports: the claim is about the
// relay's dialing.
func TestRelayResvPort(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the relay binds a reserved port as root only; run the tests as root")
	}
	for _, c := range []struct {
		flags    []string
		reserved bool
	}{{nil, true}, {[]string{"--noresvport"}, false}} {
		server, ports := testpeer.ListenPorts(t)
		r := startRelayBin(t, server, c.flags...)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		select {
		case <-ports: // the relay's check that the server answers, before it serves
		case <-ctx.Done():
			t.Fatal("the relay did not check the server before serving")
		}
		qp, err := dialRelayFrom(ctx, "127.0.0.1", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer qp.Close()
		select {
		case p := <-ports:
			if (p < 1024) != c.reserved {
				t.Errorf("relay %v: the server saw its connection from port %d; want reserved %v", c.flags, p, c.reserved)
			}
		case <-ctx.Done():
			t.Fatalf("relay %v: no connection to the server", c.flags)
		}
	}
}

// TestRelayTCPFlood: 100 TCP connections from 127.0.0.3 that never begin
// the MPA exchange (each would hold one of the iWARP listener's 64
// handshake places for 30 s) are held to the per-source share as they
// are accepted, and a mount from 127.0.0.1 works beside them.
func TestRelayTCPFlood(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	r := startRelayBin(t, g.Addr)
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}, Timeout: time.Minute}
	for range 100 {
		c, err := d.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	mnt := mount(t, peer{name: "relay-ganesha", host: "127.0.0.1", port: r.port, export: g.Export, opts: []string{"proto=rdma", "rdmadev=iwarp-go"}})
	dir := testDir(t, mnt)
	defer os.RemoveAll(dir)
	if out := sh(t, 2*time.Minute, "echo hello > "+dir+"/f && cat "+dir+"/f"); !strings.Contains(out, "hello") {
		t.Fatalf("mount beside the flood: %s", out)
	}
	st := r.stats(t)
	t.Logf("relay stats:\n%s", st)
	if n := statField(t, st, "connections:", "over_limit"); n < 100-defaultPerSource {
		t.Errorf("%d connections refused over the limit, want at least %d", n, 100-defaultPerSource)
	}
}
