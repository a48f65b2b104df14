package main

import (
	"bytes"
	"context"
	"log"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/oncrpc/oncrpctest"
)

// TestMain makes the test binary a relay process when startRelayProcess
// runs it, as main does for the benchmount binary.
func TestMain(m *testing.M) {
	if os.Getenv(relayEnv) != "" {
		if err := runRelayChild(os.Stdin, os.Stdout); err != nil {
			log.Fatalf("relay: %v", err)
		}
		return
	}
	os.Exit(m.Run())
}

// echoServer answers each call with its XID, the REPLY message type
// (RFC 5531 s9) and "pong".
type echoServer struct{}

func (echoServer) HandleCall(msg []byte) []byte {
	if len(msg) < 4 {
		return nil
	}
	return append(append([]byte(nil), msg[:4]...), 0, 0, 0, 1, 'p', 'o', 'n', 'g')
}

// TestRelayProcess relays a call through a tcp relay process to a server
// in this process, reads the relay's CPU time, and stops it.
func TestRelayProcess(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- oncrpctest.Serve(ln, echoServer{}) }()
	defer func() {
		ln.Close()
		<-served
	}()

	p, err := startRelayProcess("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			p.stop()
		}
	}()
	if p.pid == os.Getpid() || p.pid <= 0 {
		t.Fatalf("relay pid %d: not a child", p.pid)
	}
	tr := oncrpc.NewTCPTransport(p.addr, oncrpc.TCPOptions{})
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	call := []byte{0, 0, 0, 7, 0, 0, 0, 0, 1, 2, 3, 4} // XID 7, CALL

	rep, err := tr.RoundTrip(ctx, &oncrpc.Call{XID: 7, Head: call})
	if err != nil {
		t.Fatalf("call through the relay: %v", err)
	}
	if want := []byte{0, 0, 0, 7, 0, 0, 0, 1, 'p', 'o', 'n', 'g'}; !bytes.Equal(rep.Msg, want) {
		t.Errorf("reply through the relay = %q, want %q", rep.Msg, want)
	}
	rep.Release()
	if d, err := cpuTime(p.pid); err != nil || d <= 0 {
		t.Errorf("relay process CPU time = %v, %v; want > 0", d, err)
	}
	p.stop()
	stopped = true
	if err := syscall.Kill(p.pid, 0); err == nil {
		t.Errorf("relay process %d still there after stop", p.pid)
	}
}

// TestRelayProcessRDMA starts an rdma relay process: it serves on an
// address of its own.
func TestRelayProcessRDMA(t *testing.T) {
	p, err := startRelayProcess("rdma", "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	defer p.stop()
	if _, _, err := net.SplitHostPort(p.addr); err != nil {
		t.Errorf("rdma relay address %q: %v", p.addr, err)
	}
}

func TestRelayProcessBadKind(t *testing.T) {
	if p, err := startRelayProcess("udp", "127.0.0.1:1"); err == nil {
		p.stop()
		t.Error("a udp relay started, want an error")
	}
}
