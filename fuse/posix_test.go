package fuse_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/posixtest"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/internal/testpeer"
	"github.com/rdmafs/rdmafs/internal/testpeer/v2relay"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/rpcrdma"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

func TestMain(m *testing.M) { testpeer.Main(m) }

// peer is a real NFSv4.1 server.
type peer struct {
	name, addr, export string
	rdma, v2           bool // RPC-over-RDMA (version 2 only when v2)
	limitsOf           string
}

func forEachPeer(t *testing.T, f func(t *testing.T, p peer)) {
	t.Run("knfsd", func(t *testing.T) {
		k := testpeer.RequireKnfsd(t)
		f(t, peer{name: "knfsd", addr: k.TCPAddr, export: "/", limitsOf: "knfsd"})
	})
	t.Run("ganesha", func(t *testing.T) {
		g := testpeer.RequireGanesha(t)
		f(t, peer{name: "ganesha", addr: g.Addr, export: g.Export, limitsOf: "ganesha"})
	})
	// The same over RPC-over-RDMA: knfsd's RDMA listener (negotiation
	// falls back to version 1), and version 2 through our responder
	// relaying to ganesha.
	t.Run("knfsd-rdma", func(t *testing.T) {
		k := testpeer.RequireKnfsd(t)
		f(t, peer{name: "knfsd-rdma", addr: k.RDMAAddr, export: "/", rdma: true, limitsOf: "knfsd"})
	})
	t.Run("ganesha-rdma-v2", func(t *testing.T) {
		g := testpeer.RequireGanesha(t)
		f(t, peer{name: "ganesha-rdma-v2", addr: v2relay.Require(t), export: g.Export, rdma: true, v2: true, limitsOf: "ganesha"})
	})
}

// transport makes p's RPC transport.
func (p peer) transport() oncrpc.Transport {
	if !p.rdma {
		return oncrpc.NewTCPTransport(p.addr, oncrpc.TCPOptions{})
	}
	cfg := rpcrdma.Config{Provider: &iwarp.Provider{}, AcceptInvalidate: true}
	if p.v2 {
		cfg.Version, cfg.XChars = rpcrdma.Version2, true
	}
	return rpcrdma.NewTransport(p.addr, cfg)
}

// mountPeer mounts p's export in this process and unmounts it when the
// test ends, also when it fails.
func mountPeer(t *testing.T, p peer, opts fuse.Options) (string, *fuse.Mount) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := nfsclient.Dial(ctx, nfsclient.Config{
		Transport: p.transport(),
		Export:    p.export,
		RPC:       oncrpc.ClientOptions{Timeout: 30 * time.Second, Retrans: 3},
		Tracer:    opts.Tracer,
	})
	if err != nil {
		t.Fatalf("%s: dial: %v", p.name, err)
	}
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	opts.FSName = p.addr + ":" + p.export
	m, err := fuse.Serve(ctx, c, dir, opts)
	if err != nil {
		c.Close(ctx)
		t.Fatalf("%s: mount: %v", p.name, err)
	}
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
	return dir, m
}

func freshDir(t *testing.T, parent string) string {
	t.Helper()
	d := filepath.Join(parent, fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), rand.Uint32()))
	if err := os.Mkdir(d, 0o777); err != nil {
		t.Fatal(err)
	}
	return d
}

// failLocally are the posixtest cases that fail on a local tmpfs or ext4
// directory as well (TestPosixLocal shows it): they test FUSE-specific
// behaviour of go-fuse's own file systems.
var failLocally = map[string]string{
	// POSIX locks belong to the process: a second lock by the same
	// process succeeds on ext4 and tmpfs too.
	"FcntlFlockLocksFile": "fails on ext4 and tmpfs: fcntl locks of one process do not conflict",
	// Races a symlink swap against open; the kernel's local file
	// systems lose the race on ext4 as well.
	"OpenSymlinkRace": "fails on ext4 (a symlink swap race go-fuse tests for its loopback)",
}

// unsupported are cases that need what NFSv4.1 or this client does not
// have.
var unsupported = map[string]string{
	// ALLOCATE is NFSv4.2 (RFC 7862 s15.1); Linux's NFSv4.1 client
	// fails fallocate with EOPNOTSUPP too.
	"Fallocate":         "NFSv4.1 has no ALLOCATE",
	"FallocateKeepSize": "NFSv4.1 has no ALLOCATE",
}

// serverLimits are cases a server gets wrong whatever the client does.
var serverLimits = map[string]map[string]string{
	"ganesha": {
		// SETATTR of time_modify on a symlink returns NFS4_OK and
		// leaves the time unchanged (VFS FSAL).
		"SetattrSymlink": "ganesha's VFS FSAL ignores times set on symlinks",
	},
}

func posixCases() []string {
	var names []string
	for n := range posixtest.All {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// TestPosixLocal runs go-fuse's POSIX tests on a local directory, to tell
// which failures are not ours.
func TestPosixLocal(t *testing.T) {
	base := t.TempDir()
	for _, name := range posixCases() {
		t.Run(name, func(t *testing.T) {
			if why, ok := failLocally[name]; ok {
				t.Skip(why)
			}
			posixtest.All[name](t, freshDir(t, base))
		})
	}
}

// TestPosix runs go-fuse's POSIX tests through the mount.
func TestPosix(t *testing.T) {
	forEachPeer(t, func(t *testing.T, p peer) {
		mnt, _ := mountPeer(t, p, fuse.Options{})
		for _, name := range posixCases() {
			t.Run(name, func(t *testing.T) {
				if why, ok := failLocally[name]; ok {
					t.Skip(why)
				}
				if why, ok := unsupported[name]; ok {
					t.Skip(why)
				}
				if why, ok := serverLimits[p.limitsOf][name]; ok {
					t.Skip(why)
				}
				d := freshDir(t, mnt)
				defer os.RemoveAll(d)
				posixtest.All[name](t, d)
			})
		}
	})
}
