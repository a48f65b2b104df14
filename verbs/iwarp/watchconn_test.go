package iwarp

import (
	"context"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// starveConn is the queue pair's end of a TCP connection, wrapped so that
// a test learns when the queue pair has read everything the peer sent and
// waits for more: a placement whose peer stalls in the middle of a
// segment is then under way (the region looked up and busy), for the
// receive side asks for payload bytes only inside the placement. Every
// read, the queue pair's raw ones (readv.go) and its buffered ones, goes
// through the socket's RawConn, whose wait for data the wrapper sees.
type starveConn struct {
	*net.TCPConn
	raw syscall.RawConn

	mu      sync.Mutex
	waiting bool // the reader found no data and waits for some
	armed   bool // everything the peer sent has arrived
	starved chan struct{}
}

func newStarveConn(c net.Conn) (*starveConn, error) {
	tc := c.(*net.TCPConn)
	raw, err := tc.SyscallConn()
	if err != nil {
		return nil, err
	}
	return &starveConn{TCPConn: tc, raw: raw, starved: make(chan struct{}, 1)}, nil
}

// SyscallConn hands the queue pair the watched RawConn.
func (c *starveConn) SyscallConn() (syscall.RawConn, error) {
	return starveRaw{c.raw, c}, nil
}

// Read reads through the watched RawConn (the buffered reader's reads).
func (c *starveConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var rerr error
	err := starveRaw{c.raw, c}.Read(func(fd uintptr) bool {
		n, rerr = unix.Read(int(fd), p)
		return rerr != unix.EAGAIN
	})
	switch {
	case err != nil:
		return 0, err
	case rerr != nil:
		return 0, rerr
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// checkLocked, with mu held, reports starvation: armed, the reader
// waiting, and nothing left unread in the socket.
func (c *starveConn) checkLocked(fd uintptr) {
	if !c.armed || !c.waiting {
		return
	}
	if n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ); err != nil || n != 0 {
		return
	}
	select {
	case c.starved <- struct{}{}:
	default:
	}
}

// waitStarved waits until everything peer has written has reached the
// queue pair's socket (the peer's send queue is empty: all of it
// acknowledged) and the queue pair has read it all and waits for more.
func (c *starveConn) waitStarved(ctx context.Context, t testing.TB, peer net.Conn) {
	t.Helper()
	praw, err := peer.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for {
		var unsent int
		var ierr error
		if err := praw.Control(func(fd uintptr) { unsent, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil || ierr != nil {
			t.Fatalf("peer send queue: %v %v", err, ierr)
		}
		if unsent == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the peer's bytes did not arrive: %v", ctx.Err())
		}
		time.Sleep(time.Millisecond)
	}
	c.mu.Lock()
	c.armed = true
	_ = c.raw.Control(c.checkLocked)
	c.mu.Unlock()
	wait(ctx, t, c.starved, "the queue pair did not read all the peer sent")
}

// starveRaw is the watched RawConn: a read callback that finds no data
// marks the reader waiting until it is called again.
type starveRaw struct {
	syscall.RawConn
	c *starveConn
}

func (r starveRaw) Read(f func(fd uintptr) bool) error {
	return r.RawConn.Read(func(fd uintptr) bool {
		r.c.mu.Lock()
		r.c.waiting = false
		r.c.mu.Unlock()
		if f(fd) {
			return true
		}
		r.c.mu.Lock()
		r.c.waiting = true
		r.c.checkLocked(fd)
		r.c.mu.Unlock()
		return false
	})
}

// plainConn hides the socket of the connection it wraps: the queue pair
// finds no file descriptor and uses the connection's blocking Read and
// Write, and answers every RDMA Read Request from its responder goroutine
// (respondInline needs non-blocking writes).
type plainConn struct{ net.Conn }
