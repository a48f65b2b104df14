// Package uring serves a FUSE connection over io_uring
// (FUSE_OVER_IO_URING, Linux 6.14 and later; the kernel's
// Documentation/filesystems/fuse-io-uring.rst) instead of read(2) and
// writev(2) on /dev/fuse.
//
// The server registers ring entries with the kernel, each a header
// buffer and a payload buffer, spread over one FUSE queue per possible
// CPU (the kernel routes a request to the queue of the CPU it was
// issued on and makes the connection use the rings only once every
// queue has an entry). A registered entry's command completes when a
// request has been copied into its buffers; the reply is written into
// the same buffers and handed back with COMMIT_AND_FETCH, which also
// waits for the entry's next request. One command per request, no
// read(2) and no writev(2).
//
// The requests themselves are answered by a Handler, go-fuse's
// fuse.ProtocolServer in rdmafs, each in a goroutine of its own as on
// /dev/fuse. FORGET and INTERRUPT never come through the rings: the
// kernel still sends those on /dev/fuse, which the caller keeps
// reading.
package uring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Handler answers one FUSE request: in holds the request as /dev/fuse
// would deliver it (fuse_in_header, the operation's header, its
// payload), split over several slices; the reply, fuse_out_header
// first, is written over out and its length returned.
// go-fuse's *fuse.ProtocolServer is one.
type Handler interface {
	HandleRequest(in, out [][]byte) (int, gofuse.Status)
}

// The FUSE io_uring ABI (include/uapi/linux/fuse.h, protocol 7.42).
const (
	cmdRegister       = 1 // FUSE_IO_URING_CMD_REGISTER
	cmdCommitAndFetch = 2 // FUSE_IO_URING_CMD_COMMIT_AND_FETCH

	// struct fuse_uring_req_header: in_out[128], op_in[128], then
	// struct fuse_uring_ent_in_out {flags, commit_id u64; payload_sz,
	// padding u32; reserved u64}.
	hdrInOut       = 0
	hdrOpIn        = 128
	hdrEntInOut    = 256
	hdrCommitID    = hdrEntInOut + 8
	hdrPayloadSize = hdrEntInOut + 16
	hdrSize        = hdrEntInOut + 32
	opInMax        = 128

	inHeaderSize  = 40 // struct fuse_in_header
	outHeaderSize = 16 // struct fuse_out_header

	// FUSE_MIN_READ_BUFFER: the kernel's smallest payload buffer.
	minPayload = 8192

	hdrSlot  = 512        // a header's slot in the header area
	pollData = ^uint64(0) // user_data of the eventfd poll
)

// Config sizes the rings.
type Config struct {
	// Queues is the number of FUSE queues; zero means the kernel's,
	// one per possible CPU.
	Queues int
	// Depth is the number of entries per queue, the requests a queue
	// can have in flight; zero means 16.
	Depth int
	// MaxPayload is the largest request or reply payload, at least
	// the connection's max_write and max_pages*page size (the kernel
	// refuses smaller buffers); zero means 1 MiB.
	MaxPayload int
}

// Server serves one FUSE connection's rings.
type Server struct {
	dev     int // /dev/fuse
	handler Handler
	ring    *ring
	evfd    int // wakes the ring thread for replies and Close
	ents    []entry

	hdrMem, payMem []byte // the entries' buffers, outside the Go heap

	mu       sync.Mutex
	replies  []int // entries with a reply to commit
	stopping bool

	handlers sync.WaitGroup
	requests atomic.Uint64
	errMu    sync.Mutex
	err      error
	exited   chan struct{}
}

// entry is one registered ring entry: its buffers and what the ring
// thread knows of it.
type entry struct {
	qid      uint16
	header   []byte
	payload  []byte
	scratch  []byte // small payloads are copied here (see serve)
	iov      [2]unix.Iovec
	commitID uint64
	dead     bool // the kernel refused or dropped the entry
}

// Start registers the rings of the FUSE connection dev (a /dev/fuse
// descriptor past INIT, whose INIT reply offered FUSE_OVER_IO_URING)
// and serves them with h until the connection ends or Close.
// Registration errors the kernel reports at once are returned;
// later ones by Err.
func Start(dev int, h Handler, cfg Config) (*Server, error) {
	if cfg.Queues == 0 {
		n, err := possibleCPUs()
		if err != nil {
			return nil, err
		}
		cfg.Queues = n
	}
	if cfg.Depth == 0 {
		cfg.Depth = 16
	}
	if cfg.MaxPayload == 0 {
		cfg.MaxPayload = 1 << 20
	}
	if cfg.Queues < 1 || cfg.Queues > 1<<16 || cfg.Depth < 1 || cfg.Depth > 1024 {
		return nil, fmt.Errorf("fuse io_uring: %d queues of %d entries: out of range", cfg.Queues, cfg.Depth)
	}
	page := os.Getpagesize()
	paySize := (max(cfg.MaxPayload, minPayload) + page - 1) &^ (page - 1)
	n := cfg.Queues * cfg.Depth

	s := &Server{dev: dev, handler: h, evfd: -1, ents: make([]entry, n), exited: make(chan struct{})}
	var err error
	// One entry per submission slot, one more for the eventfd's poll:
	// an entry has at most one command with the kernel.
	sqEntries := uint32(1)
	for sqEntries < uint32(n+2) {
		sqEntries <<= 1
	}
	if s.ring, err = newRing(sqEntries, 2*sqEntries); err != nil {
		return nil, fmt.Errorf("fuse io_uring: %w", err)
	}
	if s.evfd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		s.release()
		return nil, fmt.Errorf("fuse io_uring: eventfd: %w", err)
	}
	const prot, flags = unix.PROT_READ | unix.PROT_WRITE, unix.MAP_PRIVATE | unix.MAP_ANONYMOUS
	if s.hdrMem, err = unix.Mmap(-1, 0, n*hdrSlot, prot, flags); err != nil {
		s.release()
		return nil, fmt.Errorf("fuse io_uring: header buffers: %w", err)
	}
	if s.payMem, err = unix.Mmap(-1, 0, n*paySize, prot, flags|unix.MAP_NORESERVE); err != nil {
		s.release()
		return nil, fmt.Errorf("fuse io_uring: %d payload buffers of %d bytes: %w", n, paySize, err)
	}
	for i := range s.ents {
		e := &s.ents[i]
		e.qid = uint16(i / cfg.Depth)
		e.header = s.hdrMem[i*hdrSlot : i*hdrSlot+hdrSize : i*hdrSlot+hdrSize]
		e.payload = s.payMem[i*paySize : (i+1)*paySize : (i+1)*paySize]
		e.iov[0] = unix.Iovec{Base: &e.header[0]}
		e.iov[0].SetLen(len(e.header))
		e.iov[1] = unix.Iovec{Base: &e.payload[0]}
		e.iov[1].SetLen(len(e.payload))
	}

	started := make(chan error, 1)
	go s.run(started)
	if err := <-started; err != nil {
		return nil, err
	}
	return s, nil
}

// possibleCPUs counts the CPUs in /sys/devices/system/cpu/possible:
// the kernel's number of FUSE queues (num_possible_cpus()).
func possibleCPUs() (int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err != nil {
		return 0, fmt.Errorf("fuse io_uring: possible CPUs: %w", err)
	}
	n, err := parseCPUList(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("fuse io_uring: possible CPUs %q: %w", strings.TrimSpace(string(b)), err)
	}
	return n, nil
}

// parseCPUList counts the CPUs of a kernel CPU list such as "0-3,8".
func parseCPUList(s string) (int, error) {
	n := 0
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return 0, fmt.Errorf("bad CPU %q", part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0, fmt.Errorf("bad CPU range %q", part)
			}
		}
		n += b - a + 1
		if n > 1<<16 {
			return 0, errors.New("too many CPUs")
		}
	}
	return n, nil
}

// Requests returns how many requests came through the rings.
func (s *Server) Requests() uint64 { return s.requests.Load() }

// Err returns the first error of the rings: a refused registration, a
// failed io_uring_enter. The connection goes on over /dev/fuse.
func (s *Server) Err() error {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return s.err
}

func (s *Server) setErr(err error) {
	s.errMu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.errMu.Unlock()
}

// Close stops the rings (the kernel cancels the commands still
// registered) and waits for the ring thread; handlers still running
// finish on their own.
func (s *Server) Close() {
	select {
	case <-s.exited:
		return
	default:
	}
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	s.wake()
	<-s.exited
}

// Done is closed when the rings have stopped.
func (s *Server) Done() <-chan struct{} { return s.exited }

// wake writes the eventfd the ring thread polls. Under mu: release
// closes it there, so a late handler never writes a reused descriptor.
func (s *Server) wake() {
	one := [8]byte{1}
	s.mu.Lock()
	if s.evfd >= 0 {
		unix.Write(s.evfd, one[:])
	}
	s.mu.Unlock()
}

// run is the ring thread. Every command goes to the kernel from this
// one locked OS thread, for two reasons:
//   - the kernel hands a request to its entry by task work in the
//     thread that submitted the entry's command; a thread that could
//     block in a FUSE request on this very mount (any goroutine's
//     thread: go-fuse's WaitMount stats the mount point) would wait for
//     a request only it can deliver;
//   - io_uring's submission ring is single-producer.
//
// Replies come to it through s.replies and the eventfd.
func (s *Server) run(started chan<- error) {
	runtime.LockOSThread()
	// Give the thread back, do not let it end with the goroutine: a
	// locked thread that exits sends the parent-death signal
	// (PR_SET_PDEATHSIG) to any child started from it, and a test's
	// file server may have been started from this very thread.
	defer runtime.UnlockOSThread()
	defer s.finish()

	s.armPoll()
	for i := range s.ents {
		s.submit(i, cmdRegister)
	}
	if err := s.ring.submit(0); err != nil {
		started <- fmt.Errorf("fuse io_uring: register: %w", err)
		return
	}
	// A refusal (io_uring turned off, a buffer the kernel finds too
	// small) completes at once.
	s.ring.reap(s.complete)
	if err := s.Err(); err != nil {
		started <- err
		return
	}
	started <- nil

	for {
		if err := s.ring.submit(1); err != nil {
			s.setErr(err)
			return
		}
		s.ring.reap(s.complete)
		s.mu.Lock()
		ready, stopping := s.replies, s.stopping
		s.replies = nil
		s.mu.Unlock()
		if stopping {
			return
		}
		for _, i := range ready {
			s.submit(i, cmdCommitAndFetch)
		}
		if !s.anyLive() {
			return
		}
	}
}

// anyLive reports whether an entry is still with the kernel or with a
// handler.
func (s *Server) anyLive() bool {
	for i := range s.ents {
		if !s.ents[i].dead {
			return true
		}
	}
	return false
}

// submit queues entry i's command: REGISTER hands the kernel its
// buffers, COMMIT_AND_FETCH its reply.
func (s *Server) submit(i int, op uint32) {
	e := &s.ents[i]
	q := s.ring.nextSQE()
	for q == nil {
		// Full: the ring is sized so this does not happen; should it,
		// let the kernel take what is there.
		s.ring.submit(0)
		q = s.ring.nextSQE()
	}
	q.Opcode = opURingCmd
	q.Fd = int32(s.dev)
	q.Off = uint64(op) // cmd_op
	q.UserData = uint64(i)
	// struct fuse_uring_cmd_req in the command area: flags, commit_id,
	// qid.
	binary.NativeEndian.PutUint64(q.Cmd[8:], e.commitID)
	binary.NativeEndian.PutUint16(q.Cmd[16:], e.qid)
	if op == cmdRegister {
		q.Addr = uint64(uintptr(unsafe.Pointer(&e.iov[0])))
		q.Len = uint32(len(e.iov)) // FUSE_URING_IOV_SEGS
	}
}

// armPoll watches the eventfd (multishot: one submission, a completion
// per wake-up).
func (s *Server) armPoll() {
	q := s.ring.nextSQE()
	q.Opcode = opPollAdd
	q.Fd = int32(s.evfd)
	q.OpFlags = unix.POLLIN
	q.Len = pollAddMulti
	q.UserData = pollData
}

// complete handles one completion on the ring thread.
func (s *Server) complete(c cqe) {
	if c.UserData == pollData {
		var buf [8]byte
		unix.Read(s.evfd, buf[:])
		if c.Flags&cqeFMore == 0 {
			// The multishot poll ended (an overflow, say): arm again.
			s.armPoll()
		}
		return
	}
	if c.UserData >= uint64(len(s.ents)) {
		s.setErr(fmt.Errorf("fuse io_uring: completion for unknown entry %d", c.UserData))
		return
	}
	i := int(c.UserData)
	e := &s.ents[i]
	if c.Res < 0 {
		e.dead = true
		// ENOTCONN and ECONNABORTED: the connection ended (unmount);
		// ECANCELED: the ring is going away. Anything else is a
		// refusal worth reporting.
		switch errno := syscall.Errno(-c.Res); errno {
		case syscall.ENOTCONN, syscall.ECONNABORTED, syscall.ECANCELED, syscall.ENODEV:
		default:
			s.setErr(fmt.Errorf("fuse io_uring: queue %d entry %d: %w", e.qid, i, errno))
		}
		return
	}
	e.commitID = binary.NativeEndian.Uint64(e.header[hdrCommitID:])
	s.requests.Add(1)
	s.handlers.Add(1)
	go s.serve(i)
}

// serve answers the request in entry i and queues its commit.
func (s *Server) serve(i int) {
	defer s.handlers.Done()
	e := &s.ents[i]
	hdr, opIn, payload, err := splitRequest(e.header, e.payload)
	n := 0
	if err == nil {
		if op := binary.NativeEndian.Uint32(hdr[4:]); op != opWrite && len(payload) <= 4096 {
			// Names and xattr values: the reply may be written over
			// the payload buffer while the handler still reads them.
			if e.scratch == nil {
				e.scratch = make([]byte, 4096)
			}
			payload = e.scratch[:copy(e.scratch, payload)]
		}
		var st gofuse.Status
		n, st = s.handler.HandleRequest([][]byte{hdr, opIn, payload}, [][]byte{e.header[:outHeaderSize], e.payload})
		if n == 0 && st.Ok() {
			// No reply (a request that wants none cannot come
			// here); the entry must be committed all the same.
			st = gofuse.EIO
		}
		if n == 0 {
			err = fmt.Errorf("status %v", st)
		}
	}
	if err != nil || n < outHeaderSize {
		// Answer EIO so the caller is not left waiting.
		unique := binary.NativeEndian.Uint64(e.header[8:])
		binary.NativeEndian.PutUint32(e.header[0:], outHeaderSize)
		eio := -int32(syscall.EIO)
		binary.NativeEndian.PutUint32(e.header[4:], uint32(eio))
		binary.NativeEndian.PutUint64(e.header[8:], unique)
		n = outHeaderSize
	}
	binary.NativeEndian.PutUint32(e.header[hdrPayloadSize:], uint32(n-outHeaderSize))
	s.mu.Lock()
	s.replies = append(s.replies, i)
	s.mu.Unlock()
	s.wake()
}

const opWrite = 16 // FUSE_WRITE

// splitRequest returns the parts of the request in an entry's buffers:
// the fuse_in_header, the operation's header (in op_in) and the
// payload. The kernel puts the first argument in op_in and the rest in
// the payload, payload_sz bytes (fs/fuse/dev_uring.c,
// fuse_uring_args_to_ring); the in_header's len is the sum.
func splitRequest(header, payload []byte) (hdr, opIn, pay []byte, err error) {
	if len(header) < hdrSize {
		return nil, nil, nil, fmt.Errorf("ring header of %d bytes", len(header))
	}
	total := int64(binary.NativeEndian.Uint32(header[0:]))
	paySize := int64(binary.NativeEndian.Uint32(header[hdrPayloadSize:]))
	if paySize > int64(len(payload)) {
		return nil, nil, nil, fmt.Errorf("payload of %d bytes in a %d-byte buffer", paySize, len(payload))
	}
	opSize := total - inHeaderSize - paySize
	if opSize < 0 || opSize > opInMax {
		return nil, nil, nil, fmt.Errorf("request of %d bytes with %d bytes of payload", total, paySize)
	}
	return header[:inHeaderSize], header[hdrOpIn : hdrOpIn+opSize], payload[:paySize], nil
}

// finish runs when the ring thread leaves: the kernel cancels what is
// still registered when the ring's descriptor closes; the buffers go
// once no handler can write them.
func (s *Server) finish() {
	s.ring.close()
	s.ring = nil
	go func() {
		s.handlers.Wait()
		s.release()
	}()
	close(s.exited)
}

func (s *Server) release() {
	if s.ring != nil {
		s.ring.close()
	}
	if s.hdrMem != nil {
		unix.Munmap(s.hdrMem)
	}
	if s.payMem != nil {
		unix.Munmap(s.payMem)
	}
	s.mu.Lock()
	if s.evfd >= 0 {
		unix.Close(s.evfd)
		s.evfd = -1
	}
	s.mu.Unlock()
}
