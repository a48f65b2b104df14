package oncrpc

import (
	"bufio"
	"context"
	"errors"
	"net"
	"sync"
	"time"
)

// serveTCP answers RPC calls arriving on ln with h, over TCP record marking,
// until ln is closed. Calls on one connection are served concurrently and
// their replies written whole. It is the TCP counterpart of the
// RPC-over-RDMA responder, for this package's tests (others use
// oncrpctest.Serve, which cannot be imported here).
func serveTCP(ln net.Listener, h CallHandler) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			serveConn(nc, h)
		}()
	}
}

func serveConn(nc net.Conn, h CallHandler) {
	defer nc.Close()
	c := &tcpConn{t: &TCPTransport{opts: TCPOptions{MaxFragment: maxFragmentLen}}, nc: nc, dead: make(chan struct{})}
	br := bufio.NewReaderSize(nc, 64<<10)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		msg, _, err := readRecord(br, 64<<20, 64<<20)
		if err != nil {
			return
		}
		if mt, ok := MessageType(msg.buf); !ok || mt != MsgCall {
			putBuffer(msg)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer putBuffer(msg)
			if reply := h.HandleCall(msg.buf); reply != nil {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				c.writeRecord(ctx, [][]byte{reply})
				cancel()
				if r, ok := h.(ReplyReleaser); ok {
					r.ReleaseReply(reply)
				}
			}
		}()
	}
}
