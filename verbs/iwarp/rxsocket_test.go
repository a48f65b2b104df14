package iwarp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/verbs"
)

// Tests of the receive side's socket path against reads from memory, with
// large Read Responses: a receive path without a peer reads a hand-made
// stream once from a loopback socket on which the whole stream has
// arrived before it starts (direct reads, readv counted), once from
// memory (no socket: io.ReadFull, no readv). Both must end alike.
//
// They were written for speculative Read Response runs (several
// predicted FPDUs per readv, commit 81fb9b8), which were dropped: with
// the raw system calls of readv.go they saved no time or CPU (see
// BenchmarkReadvPerMiB). Any later change of the socket path must pass
// them too.

// fpduStream builds a test stream of FPDUs, with CRCs if crc is set.
type fpduStream struct {
	b   []byte
	crc bool
}

func (s *fpduStream) frame(ulpdu []byte) {
	start := len(s.b)
	s.b = binary.BigEndian.AppendUint16(s.b, uint16(len(ulpdu)))
	s.b = append(s.b, ulpdu...)
	s.b = append(s.b, make([]byte, -len(s.b[start:])&3)...)
	var c uint32
	if s.crc {
		// RFC 5044 s4.1: the CRC covers length, ULPDU and pad.
		c = crc32.Update(0, castagnoli, s.b[start:])
	}
	s.b = binary.LittleEndian.AppendUint32(s.b, c)
}

func (s *fpduStream) tagged(op byte, last bool, stag uint32, to uint64, payload []byte) {
	var h [taggedHdrLen]byte
	putTagged(h[:], last, op, stag, to)
	s.frame(append(h[:], payload...))
}

func (s *fpduStream) send(msn uint32, payload []byte) {
	var h [untaggedHdrLen]byte
	putUntagged(h[:], true, opSend, 0, qnSend, msn, 0)
	s.frame(append(h[:], payload...))
}

// rxEnv holds the regions a test stream targets: sink, the sink of
// RDMA Reads of the given sizes laid out one after the other from
// rxGuard, with guard bytes around; and win, a region the peer may
// write (STag win.STag()).
type rxEnv struct {
	pd    *verbs.ProtectionDomain
	sink  *verbs.MemoryRegion
	win   *verbs.MemoryRegion
	reads []uint32
	total int
	guard []byte // the sink as run fills it: guard bytes only
	// unix: the socket is one of a Unix socket pair, not loopback
	// TCP (the same system calls on the receive path, without a
	// listener and a handshake per run: FuzzSocketReadResponse).
	unix bool
}

const rxGuard = 4096

func newRxEnv(t testing.TB, reads ...uint32) *rxEnv {
	t.Helper()
	e := &rxEnv{pd: NewProtectionDomain(), reads: reads}
	for _, r := range reads {
		e.total += int(r)
	}
	e.sink = reg(t, e.pd, make([]byte, rxGuard+e.total+rxGuard), verbs.AccessLocalWrite)
	e.win = reg(t, e.pd, make([]byte, 64<<10), verbs.AccessRemoteWrite)
	e.guard = make([]byte, len(e.sink.Bytes()))
	fillGuard(e.guard)
	return e
}

// sinkTO is the sink offset of Read i.
func (e *rxEnv) sinkTO(i int) uint64 {
	o := uint64(rxGuard)
	for _, r := range e.reads[:i] {
		o += uint64(r)
	}
	return o
}

// rxOutcome is what a receive path did with a stream.
type rxOutcome struct {
	fault    *Terminate // nil: the stream ended without a protocol fault
	err      error
	sends    []verbs.Completion // send queue: the Reads' completions
	recvs    []verbs.Completion
	recvData []byte
	got      uint32 // bytes the first outstanding Read has placed
	sink     []byte // copy of the sink region
	readv    uint64 // readv system calls (socket mode)
}

// byteConn is a connection that reads from memory and has no socket.
type byteConn struct {
	net.Conn
	r io.Reader
}

func (c *byteConn) Read(b []byte) (int, error)      { return c.r.Read(b) }
func (c *byteConn) SetReadDeadline(time.Time) error { return nil }

// run receives stream with fresh receive state, from a socket if sock.
func (e *rxEnv) run(t testing.TB, stream []byte, crc, sock bool) rxOutcome {
	t.Helper()
	copy(e.sink.Bytes(), e.guard)
	q := &QP{pd: TableOf(e.pd), crc: crc, ird: 1, scq: verbs.NewSoftCQ(), rcq: verbs.NewSoftCQ(), irq: make(chan readRequest, 1)}
	q.cond.L = &q.mu
	q.rxStop.q = q
	for i, size := range e.reads {
		q.sq.push(sqEntry{wr: verbs.SendWR{WRID: uint64(i + 1), Opcode: verbs.OpRDMARead}})
		q.orq.push(readCtx{seq: uint64(i), sinkSTag: e.sink.STag(), sinkTO: e.sinkTO(i), size: size})
	}
	q.sqNextSeq, q.reads, q.ord = uint64(len(e.reads)), len(e.reads), len(e.reads)
	recvBuf := make([]byte, 256)
	q.rq.push(recvEntry{wrid: 100, buf: recvBuf})
	switch {
	case sock && e.unix:
		q.conn = queuedUnixConn(t, stream)
	case sock:
		q.conn = queuedConn(t, stream)
	default:
		q.conn = &byteConn{r: bytes.NewReader(stream)}
	}
	q.br = bufio.NewReaderSize(q.conn, readerSize)
	// direct: as after an earlier large FPDU, with the reader empty.
	rs := &rxState{sendMSN: 1, readMSN: 1, vr: newVecReader(q.conn), bigReader: true, direct: true}
	calls := readvCalls.Load()
	err := q.receive(rs)
	var o rxOutcome
	o.readv = readvCalls.Load() - calls
	var f *rxFault
	if errors.As(err, &f) {
		o.fault = &f.t
	} else {
		o.err = err
	}
	o.sends = drainCQ(t, q.scq)
	o.recvs = drainCQ(t, q.rcq)
	if len(o.recvs) > 0 {
		o.recvData = recvBuf[:o.recvs[0].ByteLen]
	}
	if q.orq.len() > 0 {
		o.got = q.orq.at(0).got
	}
	o.sink = append([]byte(nil), e.sink.Bytes()...)
	return o
}

// drainCQ returns the completions cq holds.
func drainCQ(t testing.TB, cq *verbs.SoftCQ) []verbs.Completion {
	var out []verbs.Completion
	for {
		var wc [8]verbs.Completion
		n := cq.TryPoll(wc[:])
		if n == 0 {
			return out
		}
		out = append(out, wc[:n]...)
	}
}

// queuedConn returns the receiving end of a loopback TCP connection on
// which all of stream has arrived, followed by the end of the stream.
func queuedConn(t testing.TB, stream []byte) net.Conn {
	t.Helper()
	wr, rd := tcpPair(t)
	_ = rd.(*net.TCPConn).SetReadBuffer(4 << 20)
	go func() {
		_, _ = wr.Write(stream)
		_ = wr.(*net.TCPConn).CloseWrite()
	}()
	raw, err := rd.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	// Every byte and the end of the stream (the FIN: the socket is in
	// CLOSE_WAIT) must have arrived, or the receiver makes one more
	// system call to wait for them. On loopback that is usually so by
	// the time the writer is done: look first, then yield and look
	// again, sleeping only when that does not do (a sleep of a
	// millisecond per stream was most of FuzzSocketReadResponse's time).
	for queued, tries := 0, 0; ; tries++ {
		var state uint8
		_ = raw.Control(func(fd uintptr) {
			queued, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
			if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
				state = info.State
			}
		})
		if queued >= len(stream) && state == tcpCloseWait {
			return rd
		}
		if ctx.Err() != nil {
			t.Fatalf("%d of %d stream bytes arrived (TCP state %d)", queued, len(stream), state)
		}
		if tries < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// tcpCloseWait is the TCP_INFO state of a socket that has received the
// peer's FIN (Linux include/net/tcp_states.h).
const tcpCloseWait = 8

// queuedUnixConn is queuedConn on a Unix stream socket pair: the whole
// stream is in the receiving socket once the write returns.
func queuedUnixConn(t testing.TB, stream []byte) net.Conn {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
	_ = unix.SetsockoptInt(fds[1], unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	for off := 0; off < len(stream); {
		n, err := unix.Write(fds[0], stream[off:])
		if err != nil {
			unix.Close(fds[0])
			unix.Close(fds[1])
			if errors.Is(err, unix.EAGAIN) {
				// Larger than the socket buffers: the loopback
				// TCP path waits for it instead.
				return queuedConn(t, stream)
			}
			t.Fatal(err)
		}
		off += n
	}
	unix.Close(fds[0]) // the end of the stream
	f := os.NewFile(uintptr(fds[1]), "rx")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// compare fails unless the socket run ended as the memory
// run: same fault, completions, Send data, bytes of
// the Reads that completed and of the outstanding Read's placed prefix,
// and no byte outside the Reads' sink ranges.
func (e *rxEnv) compare(t testing.TB, sock, mem rxOutcome) {
	t.Helper()
	switch {
	case (sock.fault == nil) != (mem.fault == nil):
		t.Fatalf("socket: fault %v (%v); memory: %v (%v)", sock.fault, sock.err, mem.fault, mem.err)
	case sock.fault != nil && (sock.fault.Layer != mem.fault.Layer || sock.fault.EType != mem.fault.EType || sock.fault.Code != mem.fault.Code):
		t.Fatalf("socket: fault %v; memory: %v", sock.fault, mem.fault)
	case !sameCompletions(sock.sends, mem.sends) || !sameCompletions(sock.recvs, mem.recvs):
		t.Fatalf("socket: completions %+v %+v; memory: %+v %+v", sock.sends, sock.recvs, mem.sends, mem.recvs)
	case !bytes.Equal(sock.recvData, mem.recvData):
		t.Fatalf("socket: Send data %x; memory %x", sock.recvData, mem.recvData)
	case sock.fault != nil && sock.got != mem.got:
		t.Fatalf("socket: outstanding Read placed %d bytes; memory %d", sock.got, mem.got)
	}
	// When the stream ends in the middle of a message, a reader that
	// reads the next header with a trailer (today's direct path) does
	// not count the FPDU before it; either count is right.
	done := len(mem.sends)
	end := e.sinkTO(done) + uint64(min(sock.got, mem.got))
	if !bytes.Equal(sock.sink[rxGuard:end], mem.sink[rxGuard:end]) {
		t.Fatalf("socket: sink bytes [%d, %d) differ", rxGuard, end)
	}
	hi := rxGuard + e.total
	for _, o := range []rxOutcome{sock, mem} {
		if !bytes.Equal(o.sink[:rxGuard], e.guard[:rxGuard]) || !bytes.Equal(o.sink[hi:], e.guard[hi:]) {
			t.Fatal("sink bytes outside the Reads' ranges written")
		}
	}
}

func sameCompletions(a, b []verbs.Completion) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].WRID != b[i].WRID || a[i].Status != b[i].Status || a[i].ByteLen != b[i].ByteLen || a[i].Opcode != b[i].Opcode {
			return false
		}
	}
	return true
}

// respond appends Read i's Response cut into segments of the given
// payload sizes (the last segment takes the rest).
func (e *rxEnv) respond(s *fpduStream, i int, data []byte, sizes ...int) {
	off := 0
	for k := 0; off < len(data); k++ {
		n := len(data) - off
		if k < len(sizes) {
			n = min(n, sizes[k])
		}
		s.tagged(opReadResp, off+n == len(data), e.sink.STag(), e.sinkTO(i)+uint64(off), data[off:off+n])
		off += n
	}
}

func repeatSize(n, k int) []int {
	s := make([]int, k)
	for i := range s {
		s[i] = n
	}
	return s
}

// TestSocketReadResponse runs layouts the socket path must parse as the
// memory one does, with at most one readv per FPDU when all has arrived.
func TestSocketReadResponse(t *testing.T) {
	const seg = 16 << 10 // directMin: the smallest segment read directly
	const size = 8 * seg
	data := randBytes(size, 7)
	data2 := randBytes(size, 8)
	tests := []struct {
		name     string
		crc      bool
		build    func(e *rxEnv, s *fpduStream)
		maxReadv uint64 // 0: not checked
	}{
		{"predicted", false, func(e *rxEnv, s *fpduStream) {
			e.respond(s, 0, data, repeatSize(seg, 8)...)
		}, 10},
		{"predicted with CRC", true, func(e *rxEnv, s *fpduStream) {
			e.respond(s, 0, data, repeatSize(seg, 8)...)
		}, 10},
		{"two Reads", false, func(e *rxEnv, s *fpduStream) {
			e.respond(s, 0, data, repeatSize(seg, 8)...)
			e.respond(s, 1, data2, repeatSize(seg, 8)...)
		}, 18},
		{"smaller than predicted", false, func(e *rxEnv, s *fpduStream) {
			e.respond(s, 0, data, seg, seg, 5000, 11000, 1460, seg)
		}, 0},
		{"larger than predicted", false, func(e *rxEnv, s *fpduStream) {
			e.respond(s, 0, data, seg, 2*seg, 3*seg)
		}, 0},
		{"siw-sized after a large one", true, func(e *rxEnv, s *fpduStream) {
			e.respond(s, 0, data, append([]int{seg}, repeatSize(1460-2-4-taggedHdrLen, 200)...)...)
		}, 0},
		{"Send interleaved", false, func(e *rxEnv, s *fpduStream) {
			s.tagged(opReadResp, false, e.sink.STag(), e.sinkTO(0), data[:seg])
			s.tagged(opReadResp, false, e.sink.STag(), e.sinkTO(0)+seg, data[seg:2*seg])
			s.send(1, []byte("interleaved"))
			for off := 2 * seg; off < size; off += seg {
				s.tagged(opReadResp, off+seg == size, e.sink.STag(), e.sinkTO(0)+uint64(off), data[off:off+seg])
			}
		}, 0},
		{"Write interleaved", false, func(e *rxEnv, s *fpduStream) {
			s.tagged(opReadResp, false, e.sink.STag(), e.sinkTO(0), data[:seg])
			s.tagged(opWrite, true, e.win.STag(), 100, data[:seg])
			for off := seg; off < size; off += seg {
				s.tagged(opReadResp, off+seg == size, e.sink.STag(), e.sinkTO(0)+uint64(off), data[off:off+seg])
			}
		}, 0},
		{"wrong STag", false, func(e *rxEnv, s *fpduStream) {
			for off := 0; off < size; off += seg {
				stag := e.sink.STag()
				if off == 3*seg {
					stag ^= 0x100
				}
				s.tagged(opReadResp, off+seg == size, stag, e.sinkTO(0)+uint64(off), data[off:off+seg])
			}
		}, 0},
		{"wrong TO", false, func(e *rxEnv, s *fpduStream) {
			for off := 0; off < size; off += seg {
				to := e.sinkTO(0) + uint64(off)
				if off == 2*seg {
					to += 4
				}
				s.tagged(opReadResp, off+seg == size, e.sink.STag(), to, data[off:off+seg])
			}
		}, 0},
		{"Last too early", false, func(e *rxEnv, s *fpduStream) {
			for off := 0; off < 4*seg; off += seg {
				s.tagged(opReadResp, off == 3*seg, e.sink.STag(), e.sinkTO(0)+uint64(off), data[off:off+seg])
			}
		}, 0},
		{"bad CRC in a predicted FPDU", true, func(e *rxEnv, s *fpduStream) {
			e.respond(s, 0, data, repeatSize(seg, 8)...)
			s.b[3*(2+taggedHdrLen+seg+4)+100] ^= 1 // a payload byte of the fourth FPDU
		}, 0},
		{"stream ends in a predicted FPDU", false, func(e *rxEnv, s *fpduStream) {
			e.respond(s, 0, data, repeatSize(seg, 8)...)
			s.b = s.b[:3*(2+taggedHdrLen+seg+4)+500]
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newRxEnv(t, size, size)
			s := &fpduStream{crc: tt.crc}
			tt.build(e, s)
			sock := e.run(t, s.b, tt.crc, true)
			mem := e.run(t, s.b, tt.crc, false)
			e.compare(t, sock, mem)
			if tt.maxReadv > 0 && sock.readv > tt.maxReadv {
				t.Errorf("%d readv calls, want at most %d", sock.readv, tt.maxReadv)
			}
			t.Logf("%d readv calls; fault %v; sends %d", sock.readv, sock.fault, len(sock.sends))
		})
	}
}

// TestSocketInvalidate invalidates the sink while the receiver waits for
// the rest of the third FPDU of a Read Response: the invalidation stops
// the read (RFC 8166 s8.1.3), the receiver faults with an invalid STag,
// and no byte lands after the invalidation returns.
func TestSocketInvalidate(t *testing.T) {
	const seg = 16 << 10
	ctx := testCtx(t)
	e := newRxEnv(t, 8*seg)
	data := bytes.Repeat([]byte{0x77}, 8*seg)
	s := &fpduStream{}
	e.respond(s, 0, data, repeatSize(seg, 8)...)
	const early = 2*(2+taggedHdrLen+seg+4) + 2 + taggedHdrLen + 1000 // 1000 bytes into the third payload
	fillGuard(e.sink.Bytes())
	q := &QP{pd: TableOf(e.pd), ird: 1, scq: verbs.NewSoftCQ(), rcq: verbs.NewSoftCQ(), irq: make(chan readRequest, 1)}
	q.cond.L = &q.mu
	q.rxStop.q = q
	q.sq.push(sqEntry{wr: verbs.SendWR{WRID: 1, Opcode: verbs.OpRDMARead}})
	q.orq.push(readCtx{sinkSTag: e.sink.STag(), sinkTO: e.sinkTO(0), size: 8 * seg})
	q.sqNextSeq, q.reads, q.ord = 1, 1, 1
	wr, rd := tcpPair(t)
	q.conn, q.br = rd, bufio.NewReaderSize(rd, readerSize)
	if _, err := wr.Write(s.b[:early]); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- q.receive(&rxState{sendMSN: 1, readMSN: 1, vr: newVecReader(rd), bigReader: true, direct: true})
	}()
	// The receiver has taken every byte sent: it waits for the rest of
	// the third FPDU, holding the sink.
	raw, _ := rd.(*net.TCPConn).SyscallConn()
	for queued := 1; queued > 0; {
		if ctx.Err() != nil {
			t.Fatal("the receiver did not read the stream")
		}
		time.Sleep(time.Millisecond)
		_ = raw.Control(func(fd uintptr) { queued, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	}
	if err := e.sink.InvalidateContext(ctx); err != nil {
		t.Fatalf("invalidate: %v", err)
	}
	snap := append([]byte(nil), e.sink.Bytes()...)
	_, _ = wr.Write(s.b[early:]) // the late bytes
	var f *rxFault
	if err := <-done; !errors.As(err, &f) || f.t.Code != DDPCodeTInvalidSTag || !errors.Is(f.cause, verbs.ErrInvalidSTag) {
		t.Fatalf("receive: %v, want an invalid STag fault", err)
	}
	if !bytes.Equal(snap, e.sink.Bytes()) {
		t.Fatal("sink bytes changed after the invalidation returned")
	}
	for i, b := range snap {
		inPlaced := i >= rxGuard && i < rxGuard+2*seg+1000
		if inPlaced != (b == 0x77) {
			t.Fatalf("sink byte %d is %#x: only the %d bytes received may land", i, b, 2*seg+1000)
		}
	}
}

// FuzzSocketReadResponse builds streams of Read Response segments of mixed
// sizes, with Sends and Writes between them and wrong STags, offsets and
// Last flags, and checks that the socket path ends as the memory one
// does (TestSocketReadResponse's compare).
func FuzzSocketReadResponse(f *testing.F) {
	f.Add(false, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add(true, []byte{0, 0, 3, 0, 5, 0, 0, 7, 0, 0})
	f.Add(false, []byte{0, 0, 6, 0, 0, 0, 0x0e, 0, 0, 0x16, 0})
	f.Add(false, []byte{0, 0x08, 0x10, 0x18, 0x20, 0x28, 0})
	// Set up once per worker, not per input: the regions (and their
	// guard bytes, which run restores) and the segment data, a window
	// into one random buffer at an offset that differs per segment.
	const seg = 16 << 10
	e := newRxEnv(f, 6*seg, 3*seg)
	e.unix = true
	data := randBytes(4*seg, 1)
	f.Fuzz(func(t *testing.T, crc bool, ops []byte) {
		sizes := [...]int{seg, seg, seg, 5000, 1, 2 * seg, 0, 1460 - 2 - 4 - taggedHdrLen}
		s := &fpduStream{crc: crc}
		read, off, msn := 0, 0, uint32(1)
		mutate := byte(0)
		for i, op := range ops {
			if len(s.b) > 1<<20 || i > 64 {
				break
			}
			switch op & 7 {
			case 5:
				s.send(msn, []byte("between"))
				msn++
			case 6:
				mutate = op >> 3 & 3 // for the next segment
			case 7:
				s.tagged(opWrite, op&8 != 0, e.win.STag(), uint64(op>>4)*100, make([]byte, 16))
			default:
				if read >= len(e.reads) {
					continue
				}
				n := min(sizes[int(op>>3)%len(sizes)], int(e.reads[read])-off)
				last := off+n == int(e.reads[read])
				stag, to := e.sink.STag(), e.sinkTO(read)+uint64(off)
				switch mutate {
				case 1:
					stag ^= 0x100
				case 2:
					to += 4
				case 3:
					last = !last
				}
				mutate = 0
				k := i * 4099 % (2 * seg)
				s.tagged(opReadResp, last, stag, to, data[k:k+n])
				if off += n; off == int(e.reads[read]) {
					read, off = read+1, 0
				}
			}
		}
		sock := e.run(t, s.b, crc, true)
		mem := e.run(t, s.b, crc, false)
		e.compare(t, sock, mem)
	})
}

// TestReadResponseEndToEnd reads regions of several sizes between two queue
// pairs, with and without CRCs and with several segment sizes (large
// segments, remainders, pipelined Reads), and checks every byte.
func TestReadResponseEndToEnd(t *testing.T) {
	for _, crc := range []bool{false, true} {
		for _, segment := range []int{0, 16<<10 + taggedHdrLen, 20000} {
			t.Run(fmt.Sprintf("crc=%v segment=%d", crc, segment), func(t *testing.T) {
				c, s := pair(t, &verbs.ConnParams{CRC: crc, MaxSegment: segment, ORD: 4}, &verbs.ConnParams{IRD: 4, MaxSegment: segment})
				sizes := []int{1 << 20, 1<<20 + 3, 100000, 3 << 20, 40000}
				var srcs, sinks []*verbs.MemoryRegion
				for i, n := range sizes {
					srcs = append(srcs, reg(t, s.PD(), randBytes(n, uint64(i+10)), verbs.AccessRemoteRead))
					sinks = append(sinks, reg(t, c.PD(), make([]byte, n), verbs.AccessLocalWrite))
				}
				for i, n := range sizes {
					wr := verbs.SendWR{WRID: uint64(i), Opcode: verbs.OpRDMARead, Length: uint32(n),
						SGL: []verbs.SGE{{MR: sinks[i], Length: uint32(n)}}, RemoteSTag: srcs[i].STag()}
					if err := c.PostSend(wr); err != nil {
						t.Fatal(err)
					}
				}
				for range sizes {
					if wc := pollOne(t, c.SendCQ()); wc.Status != verbs.StatusSuccess {
						t.Fatalf("completion %+v", wc)
					}
				}
				for i := range sizes {
					if !bytes.Equal(sinks[i].Bytes(), srcs[i].Bytes()) {
						t.Fatalf("Read %d (%d bytes): sink differs from source", i, sizes[i])
					}
				}
			})
		}
	}
}
