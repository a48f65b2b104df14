package iwarp

import (
	"errors"
	"io"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// vecReader reads the socket into up to two buffers with one readv(2)
// per wake-up: a direct reader takes the rest of a large payload, the
// FPDU's trailer and the start of the next FPDU's header together,
// instead of one read system call for each (see placeData).
type vecReader struct {
	raw  syscall.RawConn // nil: the connection is not a socket
	iov  [2]unix.Iovec
	bufs [2][]byte
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

// fill reads exactly len(a)+len(b) bytes, a first. conn is used when
// there is no raw socket.
func (v *vecReader) fill(conn net.Conn, a, b []byte) error {
	if v.raw == nil {
		if _, err := io.ReadFull(conn, a); err != nil {
			return err
		}
		_, err := io.ReadFull(conn, b)
		return err
	}
	v.bufs = [2][]byte{a, b}
	defer func() { v.bufs = [2][]byte{} }()
	for len(v.bufs[0])+len(v.bufs[1]) > 0 {
		v.n, v.err = 0, nil
		if err := v.raw.Read(v.fn); err != nil {
			return err
		}
		if v.err != nil {
			return v.err
		}
		if v.n == 0 {
			return io.ErrUnexpectedEOF
		}
		k := min(v.n, len(v.bufs[0]))
		v.bufs[0] = v.bufs[0][k:]
		v.bufs[1] = v.bufs[1][v.n-k:]
	}
	return nil
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
		v.iov = [2]unix.Iovec{}
		return true
	}
}
