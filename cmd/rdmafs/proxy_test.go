package main

import (
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
