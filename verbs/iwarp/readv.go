package iwarp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/verbs"
)

// maxIov bounds the buffers of one readv: far below IOV_MAX (1024 on
// Linux), and enough for a speculative Read Response run (readResp).
const maxIov = 64

// vecReader reads the socket into several buffers with one readv(2) per
// wake-up: a direct reader takes the rest of a large payload, the FPDU's
// trailer and the start of the next FPDU's header together, instead of
// one read system call for each (see placeData), and a Read Response's
// run of FPDUs in one go (see readRespRun).
type vecReader struct {
	raw  syscall.RawConn // nil: the connection is not a socket
	iov  [maxIov]unix.Iovec
	arr  [maxIov][]byte
	bufs [][]byte // what is left to fill, in stream order
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
	need := len(a) + len(b)
	got, err := v.fillv(append(v.arr[:0], a, b, opt), need)
	return max(0, got-need), err
}

// fillv reads the socket into bufs in order until at least need bytes
// are in, and with them, in the same system calls, whatever more has
// arrived already, up to the buffers' end. It returns how many bytes it
// read. At most maxIov of bufs may be non-empty; v.raw must be set.
func (v *vecReader) fillv(bufs [][]byte, need int) (int, error) {
	v.bufs = bufs
	defer func() { v.bufs = nil; clear(v.arr[:]) }()
	total := 0
	for total < need {
		v.n, v.err = 0, nil
		if err := v.raw.Read(v.fn); err != nil {
			return total, err
		}
		if v.err != nil {
			return total, v.err
		}
		if v.n == 0 {
			return total, io.ErrUnexpectedEOF
		}
		total += v.n
		for n := v.n; len(v.bufs) > 0 && (n > 0 || len(v.bufs[0]) == 0); {
			k := min(n, len(v.bufs[0]))
			v.bufs[0] = v.bufs[0][k:]
			n -= k
			if len(v.bufs[0]) == 0 {
				v.bufs = v.bufs[1:]
			}
		}
	}
	return total, nil
}

// read is the RawConn callback: one readv, false to wait for data; a
// raw call (see rawReader).
func (v *vecReader) read(fd uintptr) bool {
	cnt := 0
	for _, b := range v.bufs {
		if len(b) > 0 && cnt < len(v.iov) {
			v.iov[cnt].Base = &b[0]
			v.iov[cnt].SetLen(len(b))
			cnt++
		}
	}
	for {
		readvCalls.Add(1)
		r, _, e := unix.RawSyscall(unix.SYS_READV, fd, uintptr(unsafe.Pointer(&v.iov[0])), uintptr(cnt))
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
		clear(v.iov[:cnt])
		return true
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
	for {
		n, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&r.buf[0])), uintptr(len(r.buf)))
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN:
			return false
		case e != 0:
			r.err = os.NewSyscallError("read", e)
		default:
			r.n = int(n)
		}
		return true
	}
}

// Speculative reads of a Read Response. A large Read Response comes as a
// run of FPDUs that, from a sender that segments at a fixed size (ours,
// resp.go, and Linux siw at its maximum segment), all carry the same
// payload length to consecutive tagged offsets of one sink STag. After the
// header of one such FPDU, readRespRun predicts the next ones and reads
// them with one readv: payload into the sink, trailer and next header into
// a small buffer, and so on. Then it checks each predicted header in
// stream order; the first that does not match ends the run, and every
// byte read after it goes back to the stream parser.
//
// Safety: speculative bytes only land in the sink range of the Read in
// progress, [sinkTO+got, sinkTO+size), which the run first checks and
// holds with one access (verbs.ProtectionDomain.BeginAccess, with the
// receive side's stopper, so an invalidation stops the read and waits
// for its end like a single placement's: RFC 8166 s8.1.3). The consumer
// must not look at a Read's sink before the Read completes, and the
// Read completes successfully only after the peer has placed every byte
// of the range in order (RFC 5040 s5.2: a Read Response's segments
// continue each other up to the Read's size; rxTagged checks that), so
// a byte a wrong prediction put there is overwritten before anyone may
// see it; if the Read fails instead, its sink is undefined anyway. RDMA
// Writes are not speculated on: their length is unknown until the last
// segment, so a wrong prediction could leave stream bytes in parts of
// the peer's target region that no segment of the message covers.
const specMax = 1 << 20 // payload read ahead beyond the current FPDU

// specSlot is one FPDU of a predicted run: its payload's offset in the
// run's sink range, its length, and whether it ends the Read Response.
type specSlot struct {
	off, n int
	last   bool
}

// gapLen: the trailer of a tagged FPDU with an n-byte payload (pad and
// CRC, RFC 5044 s4.1) and the next FPDU's length and tagged header.
func gapLen(n int) int { return -(2+taggedHdrLen+n)&3 + 4 + prefetchLen }

// specState is a run's plan and buffers, kept across runs.
type specState struct {
	slots [maxIov / 2]specSlot
	gaps  [maxIov / 2][3 + 4 + prefetchLen]byte
	bufs  [maxIov][]byte
	left  []byte
	miss  bool // the run ended on a header other than predicted
}

// plan lays out a run that starts with the current FPDU's n-byte payload
// (not the last of its message) when rem bytes of the Read, n included,
// are still to come; it returns the number of slots and the payload they
// span.
func (sp *specState) plan(n, rem int) (int, int) {
	sp.slots[0] = specSlot{n: n}
	k, off := 1, n
	for left := rem - n; left > 0 && k < len(sp.slots); k++ {
		m := min(n, left)
		if off+m > n+specMax {
			break
		}
		left -= m
		sp.slots[k] = specSlot{off: off, n: m, last: left == 0}
		off += m
	}
	return k, off
}

// item returns the layout's item i (even: payload of slot i/2 in dst; odd:
// the gap after it) and its offset in the stream from the run's start.
func (sp *specState) item(dst []byte, i int) []byte {
	s := sp.slots[i/2]
	if i%2 == 0 {
		return dst[s.off : s.off+s.n]
	}
	return sp.gaps[i/2][:gapLen(s.n)]
}

// streamOff is the stream offset of slot j's payload in the run.
func (sp *specState) streamOff(j int) int {
	o := 0
	for i := range j {
		o += sp.slots[i].n + gapLen(sp.slots[i].n)
	}
	return o
}

// matches reports whether hb, the MPA length and DDP header read where
// slot s's FPDU was predicted, is that FPDU: a Read Response segment
// (RFC 5040 s4.3) of s's length and Last flag to STag stag at offset to.
func matches(hb []byte, s specSlot, stag uint32, to uint64) bool {
	if int(binary.BigEndian.Uint16(hb)) != taggedHdrLen+s.n {
		return false
	}
	h, err := parseDDPHeader(hb[2:prefetchLen])
	return err == nil && h.tagged() && h.ddpVer() == ddpVersion && h.rdmapVer() == rdmapVersion &&
		h.opcode() == opReadResp && h.stag == stag && h.to == to && h.last() == s.last
}

// readRespRun places the Read Response segment h, whose n-byte payload is
// not the last of the Read r, and as many following segments as it can
// predict and read in the same system calls (see specMax). It checks each
// FPDU's trailer (readTrailer's work) and returns the payload bytes placed
// (also with an error: those of the FPDUs before it) and whether the last
// segment placed ends the Response. ok is false when the run cannot start
// (the caller places h alone).
func (q *QP) readRespRun(rs *rxState, h *ddpHeader, n int, r *readCtx) (placed int, last, ok bool, err error) {
	if rs.spec == nil {
		rs.spec = &specState{}
	}
	sp := rs.spec
	k, span := sp.plan(n, int(r.size-r.got))
	if k < 2 {
		return 0, false, false, nil
	}
	q.rxStop.prepare()
	dst, mr, aerr := q.pd.BeginAccess(h.stag, verbs.AccessLocalWrite, h.to, uint64(span), &q.rxStop)
	if aerr != nil {
		return 0, false, false, nil // placeAccess reports it for this segment
	}
	if q.onPlace != nil {
		q.onPlace()
	}
	rs.direct, rs.small = true, 0
	if q.rxStop.ioStart() {
		placed, last, err = q.specRun(rs, sp, dst, h, k)
	} else {
		err = errStopped
	}
	stopped := q.rxStop.ioEnd()
	// The FPDUs checked before an error count as placed, as they would
	// had each been placed alone.
	mr.EndAccess(&q.rxStop, h.to, uint64(placed))
	if err != nil {
		if stopped {
			err = rs.fault(LayerDDP, DDPEtypeTaggedBuf, DDPCodeTInvalidSTag,
				fmt.Errorf("inbound Read Response sink: STag %#08x invalidated during placement: %w: %w", h.stag, verbs.ErrInvalidSTag, err))
		}
		return placed, false, true, err
	}
	if sp.miss {
		// The peer does not segment this Response as predicted (or
		// puts other messages between its segments): the bytes read
		// past the miss cost a copy, so do not guess again for it.
		rs.specMiss = r.seq + 1
	}
	q.unread(rs, sp.left)
	return placed, last, true, nil
}

// specRun reads and checks the run of k slots planned in sp (see
// readRespRun); on return sp.left holds the bytes read past the last FPDU
// placed, which belong to the stream parser.
func (q *QP) specRun(rs *rxState, sp *specState, dst []byte, h *ddpHeader, k int) (placed int, last bool, err error) {
	sp.left, sp.miss = sp.left[:0], false
	have := 0 // stream bytes of the run read so far
	cur := 0  // the slot whose header is checked (slot 0: by receive)
	for {
		s := sp.slots[cur]
		pad := -(2 + taggedHdrLen + s.n) & 3
		gapStart := sp.streamOff(cur) + s.n
		reqEnd := gapStart + pad + 4
		if !s.last {
			// RFC 5041 s5.2: a segment without L is followed by
			// another of its message, at least a tagged header.
			reqEnd += prefetchLen
		}
		if have < reqEnd {
			// Read from the stream position to the plan's end: the
			// current FPDU up to the next header must come; the
			// rest is taken only if it is there already.
			bufs := sp.bufs[:0]
			for i, o := 2*cur, sp.streamOff(cur); i < 2*k; i++ {
				b := sp.item(dst, i)
				if o+len(b) > have {
					bufs = append(bufs, b[max(0, have-o):])
				}
				o += len(b)
			}
			got, err := rs.vr.fillv(bufs, reqEnd-have)
			if err != nil {
				return placed, false, err
			}
			have += got
		}
		gap := sp.gaps[cur][:]
		if q.crc {
			c := crc32.Update(rs.crc, castagnoli, dst[s.off:s.off+s.n])
			c = crc32.Update(c, castagnoli, gap[:pad])
			if got := binary.LittleEndian.Uint32(gap[pad:]); got != c {
				return placed, false, rs.fault(LayerLLP, LLPEtypeMPA, LLPCodeCRC, fmt.Errorf("iwarp: MPA CRC %#08x, computed %#08x", got, c))
			}
		}
		placed += s.n
		if s.last || cur+1 == k {
			// The next FPDU, or what arrived of it, is the parser's.
			sp.left = sp.gather(sp.left, dst, k, gapStart+pad+4, have)
			return placed, s.last, nil
		}
		next := sp.slots[cur+1]
		hb := gap[pad+4 : pad+4+prefetchLen]
		if !matches(hb, next, h.stag, h.to+uint64(next.off)) {
			sp.miss = true
			sp.left = sp.gather(sp.left, dst, k, gapStart+pad+4, have)
			return placed, false, nil
		}
		cur++
		rs.ulen = taggedHdrLen + next.n
		copy(rs.hdr[:], hb) // for a fault's Terminate
		if q.crc {
			rs.crc = crc32.Update(0, castagnoli, hb)
		}
	}
}

// gather appends the run's stream bytes [from, to) to b, from the gaps
// and the sink where the plan put them.
func (sp *specState) gather(b, dst []byte, k, from, to int) []byte {
	o := 0
	for i := 0; i < 2*k && o < to; i++ {
		it := sp.item(dst, i)
		lo, hi := max(from, o), min(to, o+len(it))
		if lo < hi {
			b = append(b, it[lo-o:hi-o]...)
		}
		o += len(it)
	}
	return b
}

// unread gives bytes read ahead of the stream parser back to it: a few
// (at most a tagged header, which every FPDU has: RFC 5044 s4.1, RFC 5041
// s4.2) as the next header's start, more by way of a buffered reader that
// returns them before the socket's.
func (q *QP) unread(rs *rxState, b []byte) {
	rs.trailerIn, rs.opt, rs.more = false, 0, false
	if len(b) <= prefetchLen {
		rs.pre = copy(rs.hdr[:], b)
		return
	}
	if rs.pend == nil {
		// From now on the buffered reader reads by way of rs.pend
		// (which only passes reads on while it is drained).
		rs.pend = &pendReader{r: rs.reader(q)}
		q.br = bufio.NewReaderSize(rs.pend, readerSize)
		rs.bigReader = true
	}
	rs.pend.buf = append(rs.pend.buf[:0], b...) // drained: no run starts otherwise
	rs.pend.b = rs.pend.buf
	rs.direct = false
}

// pendReader reads b, then r.
type pendReader struct {
	b   []byte
	buf []byte // b's storage, reused
	r   io.Reader
}

func (p *pendReader) Read(b []byte) (int, error) {
	if len(p.b) == 0 {
		return p.r.Read(b)
	}
	n := copy(b, p.b)
	p.b = p.b[n:]
	return n, nil
}

// drained reports whether no byte read ahead waits in p (nil: none).
func (p *pendReader) drained() bool { return p == nil || len(p.b) == 0 }
