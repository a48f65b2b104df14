package iwarp

import (
	"errors"
	"io"
	"net"
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

// read is the RawConn callback: one readv, false to wait for data.
func (v *vecReader) read(fd uintptr) bool {
	cnt := 0
	for _, b := range v.bufs {
		if len(b) > 0 {
			v.iov[cnt].Base = &b[0]
			v.iov[cnt].SetLen(len(b))
			cnt++
		}
	}
	for {
		r, _, e := unix.Syscall(unix.SYS_READV, fd, uintptr(unsafe.Pointer(&v.iov[0])), uintptr(cnt))
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN:
			return false
		case e != 0:
			v.err = errors.Join(io.ErrUnexpectedEOF, e)
		default:
			v.n = int(r)
		}
		v.iov = [3]unix.Iovec{}
		return true
	}
}
