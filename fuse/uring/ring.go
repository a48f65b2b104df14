package uring

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The io_uring ABI (include/uapi/linux/io_uring.h), the part this
// package uses: a ring of 128-byte submission entries, the completion
// ring, and io_uring_enter. No liburing, no cgo.
const (
	sysIOURingSetup = 425
	sysIOURingEnter = 426

	setupSQE128 = 1 << 10 // IORING_SETUP_SQE128: SQEs are 128 bytes
	setupCQSize = 1 << 3  // IORING_SETUP_CQSIZE

	featSingleMmap = 1 << 0 // IORING_FEAT_SINGLE_MMAP

	enterGetEvents = 1 << 0 // IORING_ENTER_GETEVENTS

	offSQRing = 0          // IORING_OFF_SQ_RING
	offCQRing = 0x8000000  // IORING_OFF_CQ_RING
	offSQEs   = 0x10000000 // IORING_OFF_SQES

	opPollAdd  = 6  // IORING_OP_POLL_ADD
	opURingCmd = 46 // IORING_OP_URING_CMD

	pollAddMulti = 1 << 0 // IORING_POLL_ADD_MULTI, in the SQE's len
	cqeFMore     = 1 << 1 // IORING_CQE_F_MORE

	sqeSize = 128 // with IORING_SETUP_SQE128
	cqeSize = 16
)

// sqringOffsets is struct io_sqring_offsets.
type sqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	UserAddr                                                        uint64
}

// cqringOffsets is struct io_cqring_offsets.
type cqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, CQEs, Flags, Resv1 uint32
	UserAddr                                                        uint64
}

// params is struct io_uring_params.
type params struct {
	SQEntries, CQEntries, Flags, SQThreadCPU, SQThreadIdle, Features, WQFd uint32
	Resv                                                                   [3]uint32
	SQOff                                                                  sqringOffsets
	CQOff                                                                  cqringOffsets
}

// sqe is a 128-byte struct io_uring_sqe. The named fields are the
// common ones; Cmd is the command area of IORING_OP_URING_CMD (80
// bytes from offset 48, the "big SQE" area).
type sqe struct {
	Opcode   uint8
	Flags    uint8
	IOPrio   uint16
	Fd       int32
	Off      uint64 // cmd_op (low 32 bits) for IORING_OP_URING_CMD
	Addr     uint64
	Len      uint32
	OpFlags  uint32 // poll32_events, uring_cmd_flags, ...
	UserData uint64
	BufIndex uint16
	Persona  uint16
	FileIdx  int32
	Cmd      [80]byte
}

// cqe is struct io_uring_cqe (without IORING_SETUP_CQE32).
type cqe struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

// ring is one io_uring instance. It is not safe for concurrent use:
// one thread owns it (see Rings.run for why it must be one thread).
type ring struct {
	fd int

	sqMem, cqMem, sqeMem []byte

	sqHead, sqTail *uint32
	sqMask         uint32
	sqArray        []uint32
	sqes           []sqe
	pending        uint32 // SQEs filled in, not yet published
	unsubmitted    uint32 // SQEs published, not yet taken by the kernel

	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           []cqe
}

// newRing sets up an io_uring with room for entries submissions and
// cqEntries completions and maps its rings.
func newRing(entries, cqEntries uint32) (*ring, error) {
	p := params{Flags: setupSQE128 | setupCQSize, CQEntries: cqEntries}
	fd, _, errno := syscall.Syscall(sysIOURingSetup, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup(%d entries): %w", entries, errno)
	}
	r := &ring{fd: int(fd)}
	if err := r.mmap(&p); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *ring) mmap(p *params) error {
	sqLen := int(p.SQOff.Array) + int(p.SQEntries)*4
	cqLen := int(p.CQOff.CQEs) + int(p.CQEntries)*cqeSize
	if p.Features&featSingleMmap != 0 {
		sqLen = max(sqLen, cqLen)
		cqLen = sqLen
	}
	var err error
	const prot, flags = unix.PROT_READ | unix.PROT_WRITE, unix.MAP_SHARED | unix.MAP_POPULATE
	if r.sqMem, err = unix.Mmap(r.fd, offSQRing, sqLen, prot, flags); err != nil {
		return fmt.Errorf("mmap io_uring SQ ring: %w", err)
	}
	if p.Features&featSingleMmap != 0 {
		r.cqMem = r.sqMem
	} else if r.cqMem, err = unix.Mmap(r.fd, offCQRing, cqLen, prot, flags); err != nil {
		return fmt.Errorf("mmap io_uring CQ ring: %w", err)
	}
	if r.sqeMem, err = unix.Mmap(r.fd, offSQEs, int(p.SQEntries)*sqeSize, prot, flags); err != nil {
		return fmt.Errorf("mmap io_uring SQEs: %w", err)
	}
	sq, cq := unsafe.Pointer(&r.sqMem[0]), unsafe.Pointer(&r.cqMem[0])
	r.sqHead = (*uint32)(unsafe.Add(sq, p.SQOff.Head))
	r.sqTail = (*uint32)(unsafe.Add(sq, p.SQOff.Tail))
	r.sqMask = *(*uint32)(unsafe.Add(sq, p.SQOff.RingMask))
	r.sqArray = unsafe.Slice((*uint32)(unsafe.Add(sq, p.SQOff.Array)), p.SQEntries)
	r.sqes = unsafe.Slice((*sqe)(unsafe.Pointer(&r.sqeMem[0])), p.SQEntries)
	r.cqHead = (*uint32)(unsafe.Add(cq, p.CQOff.Head))
	r.cqTail = (*uint32)(unsafe.Add(cq, p.CQOff.Tail))
	r.cqMask = *(*uint32)(unsafe.Add(cq, p.CQOff.RingMask))
	r.cqes = unsafe.Slice((*cqe)(unsafe.Add(cq, p.CQOff.CQEs)), p.CQEntries)
	return nil
}

// nextSQE returns a zeroed submission entry to fill in, or nil when the
// submission ring is full (submit first).
func (r *ring) nextSQE() *sqe {
	head := atomic.LoadUint32(r.sqHead)
	tail := atomic.LoadUint32(r.sqTail) + r.pending
	if tail-head >= uint32(len(r.sqes)) {
		return nil
	}
	i := tail & r.sqMask
	r.sqArray[i] = i
	e := &r.sqes[i]
	*e = sqe{}
	r.pending++
	return e
}

// submit makes the filled-in entries visible to the kernel and enters
// it, waiting for at least wait completions. EINTR (the Go runtime's
// preemption signals) is not an error: the caller loops anyway.
func (r *ring) submit(wait uint32) error {
	if r.pending > 0 {
		// The store publishes the entries written before it
		// (sync/atomic stores are sequentially consistent).
		atomic.StoreUint32(r.sqTail, atomic.LoadUint32(r.sqTail)+r.pending)
		r.unsubmitted += r.pending
		r.pending = 0
	}
	flags := uintptr(0)
	if wait > 0 {
		flags = enterGetEvents
	}
	// io_uring_enter(fd, to_submit, min_complete, flags, sig, sigsz)
	done, _, errno := syscall.Syscall6(sysIOURingEnter, uintptr(r.fd), uintptr(r.unsubmitted), uintptr(wait), flags, 0, 0)
	switch errno {
	case 0:
		r.unsubmitted -= min(uint32(done), r.unsubmitted)
		return nil
	case syscall.EINTR, syscall.EAGAIN, syscall.EBUSY:
		// Interrupted, or completions must be reaped first; what
		// was not taken goes with the next call.
		return nil
	default:
		return fmt.Errorf("io_uring_enter: %w", errno)
	}
}

// reap calls fn for every completion in the ring and consumes them.
func (r *ring) reap(fn func(c cqe)) {
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail)
	for ; head != tail; head++ {
		fn(r.cqes[head&r.cqMask])
	}
	atomic.StoreUint32(r.cqHead, head)
}

func (r *ring) close() {
	if r.sqeMem != nil {
		unix.Munmap(r.sqeMem)
	}
	if r.cqMem != nil && (r.sqMem == nil || &r.cqMem[0] != &r.sqMem[0]) {
		unix.Munmap(r.cqMem)
	}
	if r.sqMem != nil {
		unix.Munmap(r.sqMem)
	}
	r.sqeMem, r.cqMem, r.sqMem = nil, nil, nil
	if r.fd >= 0 {
		unix.Close(r.fd)
		r.fd = -1
	}
}
