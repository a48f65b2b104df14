package testpeer

import (
	"net"
	"testing"
)

// ListenPorts is a TCP "server" on the loopback that records the source
// port of each connection made to it and answers nothing, for tests of
// which port a client dials from (nfs(5) resvport). The listener closes
// when the test ends; each port arrives on the channel in the order the
// connections were accepted (at most 16 wait to be read).
func ListenPorts(t testing.TB) (addr string, ports <-chan int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan int, 16)
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				for _, c := range conns {
					c.Close()
				}
				return
			}
			conns = append(conns, c)
			select {
			case ch <- c.RemoteAddr().(*net.TCPAddr).Port:
			default: // nobody reads: the port is not wanted
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	return ln.Addr().String(), ch
}
