package oncrpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
)

// The reserved source ports a client binds, as the Linux client's
// defaults (net/sunrpc/xprtsock.c: RPC_DEF_MIN_RESVPORT 665,
// RPC_DEF_MAX_RESVPORT 1023, the sunrpc.min_resvport and max_resvport
// sysctls). A server's "secure" export option (exports(5)) accepts calls
// only from a port below 1024, which only root can bind.
const (
	MinResvPort = 665
	MaxResvPort = 1023
)

// ErrNoResvPort is returned by DialResvPort when every reserved port is
// in use.
var ErrNoResvPort = errors.New("rpc: no reserved port free")

// DialResvPort connects to addr over TCP from a reserved source port,
// trying MaxResvPort first and each lower one down to MinResvPort when a
// port is in use, as xprt_bindresvport and xs_next_srcport do. Binding a
// port below 1024 needs root (CAP_NET_BIND_SERVICE): otherwise it fails
// at the first port, with an error wrapping syscall.EACCES.
func DialResvPort(ctx context.Context, network, addr string) (net.Conn, error) {
	for port := MaxResvPort; port >= MinResvPort; port-- {
		d := net.Dialer{LocalAddr: &net.TCPAddr{Port: port}, Control: reuseAddr}
		nc, err := d.DialContext(ctx, network, addr)
		if err == nil {
			return nc, nil
		}
		// EADDRINUSE: bound by another socket; EADDRNOTAVAIL: this
		// port's connection to addr is still in TIME_WAIT.
		if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EADDRNOTAVAIL) {
			continue
		}
		if errors.Is(err, syscall.EACCES) {
			return nil, fmt.Errorf("rpc: bind reserved port %d (needs root; noresvport uses any port): %w", port, err)
		}
		return nil, err
	}
	return nil, fmt.Errorf("%w: ports %d to %d", ErrNoResvPort, MinResvPort, MaxResvPort)
}

// reuseAddr sets SO_REUSEADDR, as the Linux client's transport sockets
// have it (sk_reuse): a port whose last connection is in TIME_WAIT can be
// bound again, for another server; connecting it to the same one fails
// with EADDRNOTAVAIL, and DialResvPort moves on.
func reuseAddr(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	}); err != nil {
		return err
	}
	return serr
}
