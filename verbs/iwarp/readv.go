package iwarp

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// vecReader reads the socket into up to three buffers with one readv(2)
// per wake-up: a direct reader takes the rest of a large payload, the
// FPDU's trailer and the start of the next FPDU's header together,
// instead of one read system call for each (see placeData).
type vecReader struct {
	raw  syscall.RawConn // nil: the connection is not a socket
	iov  [3]unix.Iovec
	bufs [3][]byte
	n    int
	err  error
	fn   func(fd uintptr) bool // v.read, bound once: no closure per call
}

// readvCalls counts the receive side's readv system calls, for tests
// and benchmarks (readv per MiB).
var readvCalls atomic.Uint64

// newVecReader returns a reader over conn's socket, or one that falls
// back to io.ReadFull when conn exposes no file descriptor.
func newVecReader(conn net.Conn) *vecReader {
	v := &vecReader{}
	v.fn = v.read
	if sc, ok := conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			v.raw = raw
		}
	}
	return v
}

// fill reads exactly len(a)+len(b) bytes, a first, and with them, in the
// same system calls, up to len(opt) more bytes that have arrived already
// (it does not wait for those). It returns how many went into opt. conn is
// used when there is no raw socket.
func (v *vecReader) fill(conn net.Conn, a, b, opt []byte) (int, error) {
	if v.raw == nil {
		if _, err := io.ReadFull(conn, a); err != nil {
			return 0, err
		}
		_, err := io.ReadFull(conn, b)
		return 0, err
	}
	v.bufs = [3][]byte{a, b, opt}
	defer func() { v.bufs = [3][]byte{} }()
	got := 0
	for len(v.bufs[0])+len(v.bufs[1]) > 0 {
		v.n, v.err = 0, nil
		if err := v.raw.Read(v.fn); err != nil {
			return got, err
		}
		if v.err != nil {
			return got, v.err
		}
		if v.n == 0 {
			return got, io.ErrUnexpectedEOF
		}
		n := v.n
		for i := range v.bufs {
			k := min(n, len(v.bufs[i]))
			v.bufs[i] = v.bufs[i][k:]
			n -= k
			if i == 2 {
				got += k
			}
		}
	}
	return got, nil
}

// read is the RawConn callback: one readv, false to wait for data; a
// raw call (see rawReader).
func (v *vecReader) read(fd uintptr) bool {
	cnt := 0
	for _, b := range v.bufs {
		if len(b) > 0 {
			v.iov[cnt].Base = &b[0]
			v.iov[cnt].SetLen(len(b))
			cnt++
		}
	}
	readvCalls.Add(1)
	n, e := rawIO(unix.SYS_READV, fd, unsafe.Pointer(&v.iov[0]), cnt)
	switch {
	case e == unix.EAGAIN:
		return false
	case e != 0:
		v.err = errors.Join(io.ErrUnexpectedEOF, e)
	default:
		v.n = n
	}
	v.iov = [3]unix.Iovec{}
	return true
}

// rawIO makes one non-blocking socket call (read, readv or writev: trap)
// on fd with a buffer or iovec array p of n bytes or entries, as a raw
// system call (see rawReader), again if a signal interrupts it. It
// returns the bytes moved, or the error: EAGAIN when the socket has no
// data or no room (the caller's RawConn callback then returns false and
// the runtime's poller waits).
func rawIO(trap, fd uintptr, p unsafe.Pointer, n int) (int, unix.Errno) {
	for {
		r, _, e := unix.RawSyscall(trap, fd, uintptr(p), uintptr(n))
		if e != unix.EINTR {
			return int(r), e
		}
	}
}

// rawReader reads conn's socket with read(2) calls made without the
// runtime's system call bookkeeping (unix.RawSyscall, as the non-blocking
// writes and readv of writer.go and vecReader). The socket is
// non-blocking, so no such call blocks (EAGAIN: the runtime's poller
// waits, as for conn.Read). A call made the ordinary way after an idle
// spell wakes the runtime's monitor thread (sysmon), which then sleeps
// in short steps (20 us at first) until the process is idle again; a
// requester that receives one message at a time (an RPC-over-RDMA
// WRITE's: a Read Request, then the reply) paid that twice per call.
// Raw calls took rpcrdma's BenchmarkWrite1MiB/rdma client
// (RPCRDMA_BENCH_PEER=process, perf stat) from 3.5 futex calls, 2.8
// nanosleeps and 8.4 context switches per call to 1.8, 0.3 and 4.6.
type rawReader struct {
	raw syscall.RawConn
	buf []byte
	n   int
	err error
	fn  func(fd uintptr) bool
}

// newRawReader returns a rawReader over conn, or conn itself when it
// exposes no socket.
func newRawReader(conn net.Conn) io.Reader {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return conn
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return conn
	}
	r := &rawReader{raw: raw}
	r.fn = r.read
	return r
}

func (r *rawReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.buf, r.n, r.err = p, 0, nil
	err := r.raw.Read(r.fn)
	r.buf = nil
	if err != nil {
		return 0, err
	}
	if r.err != nil {
		return 0, r.err
	}
	if r.n == 0 {
		return 0, io.EOF
	}
	return r.n, nil
}

// read is the RawConn callback: one read, false to wait for data.
func (r *rawReader) read(fd uintptr) bool {
	n, e := rawIO(unix.SYS_READ, fd, unsafe.Pointer(&r.buf[0]), len(r.buf))
	switch {
	case e == unix.EAGAIN:
		return false
	case e != 0:
		r.err = os.NewSyscallError("read", e)
	default:
		r.n = n
	}
	return true
}
