package iwarp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// castagnoli is the CRC32c table of MPA (RFC 5044 s4.4). Read-only.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var zeroPad [4]byte

// Batching. A batch is up to maxBatch FPDUs written with one vectored
// write (writev(2)): a multi-segment message, or several queued work
// requests, costs one system call instead of one per FPDU.
const (
	maxBatch = 32
	// fpduHdrCap holds an MPA length and the longest header a sender
	// puts in front of its payload (an untagged header and a Read
	// Request, or a Terminate).
	fpduHdrCap = 2 + untaggedHdrLen + 64
	// maxIovecs bounds the pieces of a batch: header, up to
	// verbs.MaxSGE payload pieces (at most 8) and trailer per FPDU.
	maxIovecs = maxBatch * (2 + 8)
)

// errSealed: the stream carried its Terminate, the last message on it
// (RFC 5040 s5.3); nothing more is written.
var errSealed = errors.New("iwarp: stream closed by a Terminate")

// errRestStopped: the pending rest of a Read Response segment cannot be
// written, an invalidation stopped the response (fpduWriter.pendStop).
var errRestStopped = errors.New("iwarp: Read Response stopped inside a segment: its region was invalidated")

// fpduWriter frames ULPDUs into MPA FPDUs (RFC 5044 s4.1: length, ULPDU,
// pad to 4 bytes, CRC) and writes batches of them with vectored writes.
// The mutex keeps FPDUs of different senders from interleaving.
//
// A non-blocking write (tryFlushLocked) may leave part of a batch
// unwritten: the stream then ends inside an FPDU, so every later write
// first writes that rest (pending), whoever makes it.
type fpduWriter struct {
	mu     sync.Mutex
	conn   net.Conn
	raw    syscall.RawConn // nil: no non-blocking writes
	crc    bool
	sealed bool

	nf   int // FPDUs in the batch
	hdrs [maxBatch][fpduHdrCap]byte
	trls [maxBatch][8]byte
	vec  [][]byte
	// bufs is what remains to be written of the batch; after a
	// partial non-blocking write it is the pending rest.
	bufs net.Buffers
	// pendStop, if not nil, is the stopper of the access whose memory
	// the pending rest reads (an inline Read Response, resp.go): it is
	// written as part of that access, or not at all once stopped.
	pendStop *stopper

	iov [maxIovecs]unix.Iovec
	wn  int                   // bytes the last writev wrote
	we  error                 // its error
	fn  func(fd uintptr) bool // w.writev, bound once: no closure per call
}

// init readies w for conn; non-blocking writes need a socket.
func (w *fpduWriter) init(conn net.Conn, crc bool) {
	w.conn, w.crc = conn, crc
	w.fn = w.writev
	if sc, ok := conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			w.raw = raw
		}
	}
}

// write sends one FPDU whose ULPDU is hdr followed by the payload pieces.
// The caller keeps the ULPDU within 65535 bytes.
func (w *fpduWriter) write(hdr []byte, pieces ...[]byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writeLocked(hdr, pieces)
}

// writeLocked writes what is pending and then one FPDU.
func (w *fpduWriter) writeLocked(hdr []byte, pieces [][]byte) error {
	if err := w.startLocked(); err != nil {
		return err
	}
	if err := w.addLocked(hdr, pieces); err != nil {
		return err
	}
	return w.flushLocked()
}

// pending reports whether part of a batch awaits writing.
func (w *fpduWriter) pending() bool { return len(w.bufs) > 0 }

// startLocked writes what is pending and starts an empty batch.
func (w *fpduWriter) startLocked() error {
	if w.sealed {
		return errSealed
	}
	if err := w.flushLocked(); err != nil {
		return err
	}
	w.nf = 0
	w.vec = w.vec[:0]
	return nil
}

// addLocked frames one FPDU into the batch, first writing the batch if
// it is full.
func (w *fpduWriter) addLocked(hdr []byte, pieces [][]byte) error {
	if w.nf == maxBatch {
		if err := w.flushLocked(); err != nil {
			return err
		}
		w.nf = 0
		w.vec = w.vec[:0]
	}
	h, t := &w.hdrs[w.nf], &w.trls[w.nf]
	w.nf++
	ulen := len(hdr)
	for _, p := range pieces {
		ulen += len(p)
	}
	binary.BigEndian.PutUint16(h[:], uint16(ulen))
	n := 2 + copy(h[2:], hdr)
	pad := -(2 + ulen) & 3
	w.vec = append(w.vec, h[:n])
	w.vec = append(w.vec, pieces...)
	// RFC 5044 s4.4: CRC32c over length, ULPDU and pad; the value goes
	// on the wire least significant byte first (as Linux siw does).
	// Without CRC the field is present and zero.
	var c uint32
	if w.crc {
		c = crc32.Update(0, castagnoli, h[:n])
		for _, p := range pieces {
			c = crc32.Update(c, castagnoli, p)
		}
		c = crc32.Update(c, castagnoli, zeroPad[:pad])
	}
	*t = [8]byte{}
	binary.LittleEndian.PutUint32(t[pad:], c)
	w.vec = append(w.vec, t[:pad+4])
	w.bufs = w.vec
	return nil
}

// flushLocked writes the batch (or the pending rest), blocking until it
// is out.
func (w *fpduWriter) flushLocked() error {
	if len(w.bufs) == 0 {
		return nil
	}
	s := w.pendStop
	w.pendStop = nil
	if s != nil && !s.ioStart() {
		w.bufs = nil
		return errRestStopped
	}
	_, err := w.bufs.WriteTo(w.conn)
	w.bufs = nil
	if s != nil && s.ioEnd() && err != nil {
		return fmt.Errorf("%w: %w", errRestStopped, err)
	}
	return err
}

// tryFlushLocked writes as much of the batch as the socket takes now,
// without waiting; the rest stays pending. Without a socket it blocks.
func (w *fpduWriter) tryFlushLocked() error {
	if w.raw == nil {
		return w.flushLocked()
	}
	w.wn, w.we = 0, nil
	if err := w.raw.Write(w.fn); err != nil {
		return err
	}
	if w.we != nil {
		return w.we
	}
	w.consume(w.wn)
	return nil
}

// consume drops the first n written bytes from bufs.
func (w *fpduWriter) consume(n int) {
	for n > 0 && len(w.bufs) > 0 {
		k := min(n, len(w.bufs[0]))
		w.bufs[0] = w.bufs[0][k:]
		n -= k
		if len(w.bufs[0]) == 0 {
			w.bufs = w.bufs[1:]
		}
	}
	for len(w.bufs) > 0 && len(w.bufs[0]) == 0 {
		w.bufs = w.bufs[1:]
	}
}

// writev is the RawConn callback: one writev(2) of bufs; it never asks
// to wait for the socket. The socket is non-blocking, so the call is a
// raw one (see rawReader).
func (w *fpduWriter) writev(fd uintptr) bool {
	cnt := 0
	for _, b := range w.bufs {
		if cnt == len(w.iov) {
			break
		}
		if len(b) > 0 {
			w.iov[cnt].Base = &b[0]
			w.iov[cnt].SetLen(len(b))
			cnt++
		}
	}
	if cnt == 0 {
		return true
	}
	n, e := rawIO(unix.SYS_WRITEV, fd, unsafe.Pointer(&w.iov[0]), cnt)
	switch {
	case e == unix.EAGAIN:
	case e != 0:
		w.we = e
	default:
		w.wn = n
	}
	clear(w.iov[:cnt])
	return true
}
