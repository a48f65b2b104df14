package main

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// tcpProxy forwards TCP connections to an NFS server (or a relay's
// server) and plays the network failures tests need: dropped set, it
// swallows what it carries, as a server that stops answering; cut
// closes every connection it carries, as a broken network.
type tcpProxy struct {
	ln      net.Listener
	dropped atomic.Bool

	mu    sync.Mutex
	conns []net.Conn
	// wire, when not nil, receives a copy of what the proxy carries
	// both ways, up to maxWire bytes (a capture for tests of what an
	// observer on the path sees).
	wire *bytes.Buffer
}

// maxWire bounds a proxy's capture.
const maxWire = 64 << 20

// capture starts recording what the proxy carries.
func (p *tcpProxy) capture() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.wire = new(bytes.Buffer)
}

// captured returns a copy of what was recorded since capture.
func (p *tcpProxy) captured() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.wire == nil {
		return nil
	}
	return bytes.Clone(p.wire.Bytes())
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go p.pipe(s, c)
			go p.pipe(c, s)
		}
	}()
	return p
}

// pipe copies src to dst until either fails, swallowing what it reads
// while p.dropped is set (no reply, no error).
func (p *tcpProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			dst.Close()
			return
		}
		if p.dropped.Load() {
			continue
		}
		p.mu.Lock()
		if p.wire != nil && p.wire.Len()+n <= maxWire {
			p.wire.Write(buf[:n])
		}
		p.mu.Unlock()
		if _, err := dst.Write(buf[:n]); err != nil {
			src.Close()
			return
		}
	}
}

// cut closes every connection carried so far and returns how many pairs.
func (p *tcpProxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	n := len(p.conns) / 2
	p.conns = nil
	return n
}
