package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/oncrpc/oncrpctest"
	"github.com/rdmafs/rdmafs/rpcrdma"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// The relays: tcp-relay and rdma-relay are mounts through a server on
// this host that relays each call over TCP to the NFS server (knfsd in
// the guest, or ganesha). Each relay runs in a child process of its own
// (this binary, run with relayEnv set), so that its CPU time is the
// relay's alone: not the go-fuse floor's, not the other relay's, and
// perf -p records nothing else.

// knfsdCredits is the credit grant of the relay's responder: knfsd's
// (svcrdma_max_requests, RPCRDMA_MAX_REQUESTS in Linux 6.1), so the relay
// lets the client keep as many calls in flight as knfsd over siw does.
const knfsdCredits = 64

// startRelay serves RPC-over-RDMA on this host's loopback with the pure-Go
// iWARP provider and relays each call over TCP to tcpAddr: an RDMA server
// whose RDMA side runs on the host's CPU (not on the knfsd guest's
// emulated one). It returns the responder's address and the function
// that stops it.
func startRelay(tcpAddr string) (string, func(), error) {
	tcp := oncrpc.NewTCPTransport(tcpAddr, oncrpc.TCPOptions{})
	resp, err := rpcrdma.Listen("127.0.0.1:0", rpcrdma.ResponderConfig{
		Provider: &iwarp.Provider{}, Handler: oncrpc.Relay(tcp, time.Minute),
		ReplyBulk: nfsclient.ReplyBulk, RemoteInvalidate: true, Credits: knfsdCredits,
	})
	if err != nil {
		tcp.Close()
		return "", nil, fmt.Errorf("relay to %s: %w", tcpAddr, err)
	}
	return resp.Addr(), func() {
		resp.Close()
		tcp.Close()
	}, nil
}

// startTCPRelay serves ONC RPC over TCP on this host's loopback and relays
// each call over its own TCP connection to tcpAddr: the same extra hop as
// startRelay's, with TCP on both sides, so that rdma-relay has a like
// for like to be compared with.
func startTCPRelay(tcpAddr string) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("tcp relay: %w", err)
	}
	tcp := oncrpc.NewTCPTransport(tcpAddr, oncrpc.TCPOptions{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		oncrpctest.Serve(ln, oncrpc.Relay(tcp, time.Minute))
	}()
	return ln.Addr().String(), func() {
		ln.Close()
		tcp.Close()
		<-done
	}, nil
}

// relayEnv, set to "rdma" or "tcp" in a child's environment, makes this
// binary a relay process (runRelayChild) that relays to the address in
// relayToEnv.
const (
	relayEnv   = "BENCHMOUNT_RELAY"
	relayToEnv = "BENCHMOUNT_RELAY_TO"
)

// runRelayChild is the relay process: it starts the relay named by
// relayEnv, writes its address as one line to out, and serves until in
// reaches EOF (the parent closed the pipe, or exited). It returns without
// stopping the relay, which would wait for its clients to hang up: the
// process's exit closes every connection.
func runRelayChild(in io.Reader, out io.Writer) error {
	start := map[string]func(string) (string, func(), error){"rdma": startRelay, "tcp": startTCPRelay}[os.Getenv(relayEnv)]
	if start == nil {
		return fmt.Errorf("%s=%q: want rdma or tcp", relayEnv, os.Getenv(relayEnv))
	}
	addr, _, err := start(os.Getenv(relayToEnv))
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(out, addr); err != nil {
		return fmt.Errorf("relay address: %w", err)
	}
	io.Copy(io.Discard, in)
	return nil
}

// relayProcess is a running relay child.
type relayProcess struct {
	addr  string
	pid   int
	stdin io.Closer
	cmd   *exec.Cmd
}

// startRelayProcess runs this binary as a relay of kind ("rdma" or "tcp")
// to tcpAddr and waits for the address it serves on.
func startRelayProcess(kind, tcpAddr string) (*relayProcess, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("%s relay: %w", kind, err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), relayEnv+"="+kind, relayToEnv+"="+tcpAddr)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("%s relay: %w", kind, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("%s relay: %w", kind, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s relay: %w", kind, err)
	}
	p := &relayProcess{pid: cmd.Process.Pid, stdin: stdin, cmd: cmd}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	p.addr = strings.TrimSpace(line)
	if err != nil || p.addr == "" {
		p.stop()
		return nil, fmt.Errorf("%s relay to %s: no address (%v)", kind, tcpAddr, err)
	}
	return p, nil
}

// stop closes the relay's stdin, which ends it, and waits for it (killing
// it after 10 s).
func (p *relayProcess) stop() {
	p.stdin.Close()
	done := make(chan struct{})
	go func() {
		p.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
}

// mount is one way of mounting a server: its name in the table, the
// subdirectory of the export its files go in (the mounts share the
// export), its mount options and the relay process it goes through, if
// any.
type mount struct {
	name, sub string
	opts      []string
	relayPID  int
}

// relayMounts starts a tcp and an rdma relay process to tcpAddr and
// returns the mounts through them, tcp-relay then rdma-relay, and the
// function that stops both.
func relayMounts(tcpAddr string) ([]mount, func(), error) {
	var ps []*relayProcess
	stop := func() {
		for _, p := range ps {
			p.stop()
		}
	}
	var ms []mount
	for _, m := range []struct{ kind, name, sub, proto string }{
		{"tcp", "tcp-relay", "bench-tcp-relay", "proto=tcp"},
		{"rdma", "rdma-relay", "bench-relay", "proto=rdma"},
	} {
		p, err := startRelayProcess(m.kind, tcpAddr)
		if err != nil {
			stop()
			return nil, nil, err
		}
		ps = append(ps, p)
		ms = append(ms, mount{name: m.name, sub: m.sub, opts: []string{m.proto, "port=" + port(p.addr)}, relayPID: p.pid})
	}
	return ms, stop, nil
}

// port returns the port of a "host:port" address.
func port(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }

// mountVariants mounts source once for each of ms with rdmafs (abs) and
// returns the variants, each in its own subdirectory of the mount, and
// the function that unmounts them all.
func mountVariants(abs, source string, ms []mount) ([]variant, func(), error) {
	var umounts []func()
	umountAll := func() {
		for _, u := range umounts {
			u()
		}
	}
	var vs []variant
	for _, m := range ms {
		dir, umount, err := mountRdmafs(abs, source, m.opts...)
		if err != nil {
			umountAll()
			return nil, nil, err
		}
		umounts = append(umounts, umount)
		d := filepath.Join(dir, m.sub)
		pid, err := servingPID(abs, dir)
		if err == nil {
			err = os.MkdirAll(d, 0o755)
		}
		if err != nil {
			umountAll()
			return nil, nil, err
		}
		vs = append(vs, variant{name: m.name, side: side{d, pid}, relayPID: m.relayPID})
	}
	return vs, umountAll, nil
}

// benchGaneshaRelay compares rdma-relay with tcp-relay in front of
// ganesha (tcpAddr, source the mount source of its export): the client's
// RDMA stack against its TCP stack, through the same kind of hop to the
// same server, on this host's CPU alone.
func benchGaneshaRelay(abs, tcpAddr, source, exportOn string, size, rounds int, match *regexp.Regexp) error {
	ms, stop, err := relayMounts(tcpAddr)
	if err != nil {
		return err
	}
	defer stop()
	vs, umount, err := mountVariants(abs, source, ms)
	if err != nil {
		return err
	}
	defer umount()
	rows, err := compareN(vs, selectJobs(jobs(size), match), rounds)
	if err != nil {
		return err
	}
	printTableN(os.Stdout, fmt.Sprintf("ganesha on this machine (export on %s) through tcp-relay and rdma-relay (proto=tcp or proto=rdma to a relay process on this host, TCP on to ganesha), %d MiB, median of %d", exportOn, size, rounds),
		vs, []ratio{{1, 0}}, rows)
	return nil
}
