package oncrpc

import (
	"context"
	"net"
	"os"
	"testing"
	"time"
)

// TestTCPResvPort: a TCPTransport with ResvPort connects from a reserved
// port (the server's side of the connection sees it), and from a lower
// one while MaxResvPort is taken; without ResvPort it does not.
func TestTCPResvPort(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("binding a reserved port needs root; run the tests as root")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peerPort := func(opts TCPOptions) int {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		tr := NewTCPTransport(ln.Addr().String(), opts)
		defer tr.Close()
		if err := tr.Connect(ctx); err != nil {
			t.Fatalf("connect: %v", err)
		}
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.RemoteAddr().(*net.TCPAddr).Port
	}
	if p := peerPort(TCPOptions{ResvPort: true}); p < MinResvPort || p > MaxResvPort {
		t.Errorf("ResvPort: the server saw source port %d, want %d to %d", p, MinResvPort, MaxResvPort)
	}
	// Hold the highest reserved port: the dial moves down.
	if hold, err := net.Listen("tcp", ":1023"); err == nil {
		defer hold.Close()
		if p := peerPort(TCPOptions{ResvPort: true}); p < MinResvPort || p >= MaxResvPort {
			t.Errorf("ResvPort with port 1023 taken: source port %d, want %d to %d", p, MinResvPort, MaxResvPort-1)
		}
	}
	if p := peerPort(TCPOptions{}); p < 1024 {
		t.Errorf("without ResvPort: source port %d, want an ephemeral one", p)
	}
}
