package iwarp

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmafs/rdmafs/verbs"
)

// Defaults.
const (
	defaultDepth = 16
	// defaultMaxULPDU is the largest ULPDU we send: near the 16-bit MPA
	// length limit (RFC 5044 s4.1). Linux siw accepts any FPDU size.
	defaultMaxULPDU = 65536 - 64
	minMaxULPDU     = 64
	// readerSize is the buffered reader's size: a peer sending small
	// FPDUs (Linux siw: one per TCP segment) has many of them read per
	// system call.
	readerSize = 256 << 10
	// mpaReaderSize is the reader of the MPA exchange, which the queue
	// pair keeps until it has taken what that reader holds (a
	// connection not yet accepted holds no more: maxPendingConns).
	mpaReaderSize = 4 << 10
	// teardownWait bounds how long a Terminate may take to leave and
	// how long we drain the stream after one.
	teardownWait = 5 * time.Second
	// sendQueueDepth bounds the send work requests outstanding (posted
	// and not yet completed), like max_send_wr of a hardware queue
	// pair (verbs/ibverbs asks for the same): a peer that stops
	// reading cannot make the queue grow without limit (RFC 8166
	// s8.1.4, RFC 5042 s6.4).
	sendQueueDepth = 1024
)

// sqEntry is a posted send work request, its gather list resolved.
type sqEntry struct {
	wr      verbs.SendWR
	pieces  [verbs.MaxSGE][]byte // the local memory of wr.SGL
	npieces int
	done    bool
	status  verbs.Status
	byteLen uint32
}

// recvEntry is a posted receive buffer (one SGE: iWARP places a Send
// into one buffer).
type recvEntry struct {
	wrid uint64
	buf  []byte
}

// readCtx is an outbound RDMA Read awaiting its Read Response.
type readCtx struct {
	seq      uint64
	sinkSTag uint32
	sinkTO   uint64
	size     uint32
	got      uint32
}

// QP is an iWARP queue pair: one TCP connection carrying MPA, DDP and
// RDMAP. It implements verbs.QueuePair.
type QP struct {
	conn     net.Conn
	br       *bufio.Reader
	w        fpduWriter
	pd       *STagTable // the protection domain's
	scq, rcq *verbs.SoftCQ
	ownRCQ   bool // rcq is the queue pair's own (SetRecvHandler)
	crc      bool
	ird, ord int
	maxULPDU int
	peerPD   []byte

	mu        sync.Mutex
	cond      sync.Cond // the tx goroutine waits here for work or ORD credit
	err       error
	done      chan struct{}
	sq        ring[sqEntry]
	sqHeadSeq uint64 // sequence number of sq.at(0)
	// regs are the completions of registration work requests not yet
	// delivered, in posting order (regwr.go); regHead counts those
	// delivered, regNext those ever queued.
	regs             []pendingReg
	regHead, regNext uint64
	sqNextSeq        uint64 // next entry to transmit
	orq              ring[readCtx]
	reads            int // outbound reads in flight
	rq               ring[recvEntry]
	rxExited         bool
	txExited         bool

	// Inbound RDMA Read Requests waiting for the responder, at most IRD.
	irq      chan readRequest
	respKick chan struct{} // the responder writes what respondInline left
	// Under w.mu (resp.go): the inline response the responder
	// finishes; the responder goroutine has exited.
	inl        inlineResp
	respExited bool
	irqCount   atomic.Int32
	wg         sync.WaitGroup
	closeOnce  sync.Once

	// Accesses to registered memory that an invalidation stops: the
	// rx goroutine's placement and the responder's Read Response.
	rxStop, respStop stopper
	inlStop          stopper // an inline Read Response's (resp.go)
	// inlActive mirrors inl.active for the receiving goroutine (parkRead).
	inlActive atomic.Bool
	// pk: a Read Request left to a direct poster (resp.go, parkRead).
	pk postParked

	// copied counts payload bytes placed by way of the buffered reader
	// (a user-space copy) rather than read straight into place.
	copied atomic.Uint64

	// Instrumentation for tests.
	maxReads     atomic.Int32 // most outbound reads in flight at once
	maxIRQ       atomic.Int32 // most inbound reads queued at once
	termWritten  chan struct{}
	termStarted  atomic.Bool
	closing      chan struct{} // closed when Close starts
	rxSeen       atomic.Bool   // an FPDU has arrived
	kicks        atomic.Int32  // zero-length Writes sent by kickLoop
	handoffs     atomic.Int32  // direct posts whose write the tx goroutine finished
	respHandoffs atomic.Int32  // inline Read Responses the responder goroutine finished
	respQueued   atomic.Int32  // Read Requests left to the responder goroutine whole (respondInline declined)
	respParked   atomic.Int32  // Read Requests left to a direct poster (parkRead)
	kick         bool          // active side: run kickLoop after the first transmission
	kickStarted  bool          // owned by the transmit side's owner
	// Delivery of receive completions (handler.go).
	hmu sync.Mutex
	rd  recvDelivery

	// The transmit side (tx.go), under mu: txBusy: a sender owns it;
	// txFlush: a poster's write left the rest of txPend for the tx
	// goroutine to write and complete.
	txBusy, txFlush bool
	txPend          txGroup

	// Used by the transmit side's owner only.
	sendMSN, readMSN uint32
	txHdr            [untaggedHdrLen + readReqLen]byte
	txPieces         [][]byte
	txBatch          []sqEntry
}

// The queue pair's optional capabilities (see package verbs).
var (
	_ verbs.QueuePair         = (*QP)(nil)
	_ verbs.CopyCounter       = (*QP)(nil)
	_ verbs.RecvHandlerSetter = (*QP)(nil)
)

var (
	_ verbs.QueuePair   = (*QP)(nil)
	_ verbs.CopyCounter = (*QP)(nil)
)

func newQP(conn net.Conn, br *bufio.Reader, n negotiated, p *params) *QP {
	q := &QP{
		conn: conn, br: br, pd: TableOf(p.pd), scq: p.scq, rcq: p.rcq,
		crc: n.crc, ird: n.ird, ord: n.ord, maxULPDU: p.maxULPDU, peerPD: n.peerPD, kick: n.active,
		done:        make(chan struct{}),
		irq:         make(chan readRequest, max(n.ird, 1)),
		respKick:    make(chan struct{}, 1),
		termWritten: make(chan struct{}),
		closing:     make(chan struct{}),
		sendMSN:     1, readMSN: 1,
	}
	if q.pd == nil {
		q.pd = TableOf(NewProtectionDomain())
	}
	if q.scq == nil {
		q.scq = verbs.NewSoftCQ()
	}
	if q.rcq == nil {
		q.rcq, q.ownRCQ = verbs.NewSoftCQ(), true
	}
	q.cond.L = &q.mu
	q.w.init(conn, n.crc)
	q.rxStop.q = q
	q.respStop.q, q.respStop.write = q, true
	q.inlStop.q, q.inlStop.write = q, true
	return q
}

// start starts the queue pair's goroutines.
func (q *QP) start() {
	q.wg.Add(3)
	go q.rxLoop()
	go q.txLoop()
	go q.respLoop()
}

// abort breaks a queue pair that was never started and flushes what
// Setup posted.
func (q *QP) abort(err error) {
	q.setErr(err)
	q.hmu.Lock()
	q.mu.Lock()
	q.rxExited, q.txExited = true, true
	flushed := q.flushRecvLocked(verbs.StatusFlushed)
	q.mu.Unlock()
	q.deliverRecvLocked(flushed...)
	q.closeOnce.Do(func() {})
}

// PostSend implements verbs.QueuePair. The gather list is resolved to the
// registered memory it names now, as a NIC resolves lkeys when it
// processes the request.
func (q *QP) PostSend(wr verbs.SendWR) error {
	if wr.Opcode.IsRegistration() {
		return q.postRegistration(wr)
	}
	e := sqEntry{wr: wr}
	if len(wr.SGL) > verbs.MaxSGE {
		return fmt.Errorf("iwarp: post %v with %d SGEs (max %d): %w", wr.Opcode, len(wr.SGL), verbs.MaxSGE, verbs.ErrInvalidWR)
	}
	switch wr.Opcode {
	case verbs.OpSend, verbs.OpSendWithInvalidate, verbs.OpRDMAWrite:
		n := verbs.SGLLen(wr.SGL)
		if n > 1<<32-1 {
			return fmt.Errorf("iwarp: post %v of %d bytes: %w", wr.Opcode, n, verbs.ErrInvalidWR)
		}
		e.byteLen = uint32(n)
		for i, sge := range wr.SGL {
			b, err := localSGE(sge, 0)
			if err == nil && sge.MR.PD() != q.pd.pd {
				err = errOtherPD
			}
			if err != nil {
				return fmt.Errorf("iwarp: post %v: SGE %d: %w: %w", wr.Opcode, i, verbs.ErrInvalidWR, err)
			}
			e.pieces[i] = b
		}
		e.npieces = len(wr.SGL)
	case verbs.OpRDMARead:
		// RFC 5040 s4.4: a Read Request names one sink STag.
		if len(wr.SGL) != 1 || wr.SGL[0].Length != wr.Length {
			return fmt.Errorf("iwarp: post RDMA Read: the sink must be one SGE of the read's %d bytes: %w", wr.Length, verbs.ErrInvalidWR)
		}
		if _, err := localSGE(wr.SGL[0], verbs.AccessLocalWrite); err != nil || wr.SGL[0].MR.PD() != q.pd.pd {
			return fmt.Errorf("iwarp: post RDMA Read: sink region missing, of another PD or without local write access: %w: %v", verbs.ErrInvalidWR, err)
		}
		if q.ord == 0 {
			return fmt.Errorf("iwarp: post RDMA Read: negotiated ORD is 0: %w", verbs.ErrInvalidWR)
		}
	default:
		return fmt.Errorf("iwarp: post send opcode %v: %w", wr.Opcode, verbs.ErrInvalidWR)
	}
	q.mu.Lock()
	if q.sq.len() >= sendQueueDepth {
		n := q.sq.len()
		q.mu.Unlock()
		return fmt.Errorf("iwarp: post %v: %d send work requests outstanding: %w", wr.Opcode, n, verbs.ErrQueueFull)
	}
	if q.err != nil {
		e.done, e.status = true, verbs.StatusFlushed
		q.sq.push(e)
		q.releaseLocked()
		q.mu.Unlock()
		return nil
	}
	q.sq.push(e)
	// The writer may be busy with a Read Response the peer does not
	// take, or hold the rest of one (respondInline): a post does not
	// wait for it (TryLock).
	direct := q.directOKLocked(&e.wr) && q.w.mu.TryLock()
	if direct && q.w.pending() {
		q.w.mu.Unlock()
		direct = false
	}
	if direct {
		q.startPosting()
	}
	if !direct {
		// The tx goroutine sends it, batched with what is queued.
		q.cond.Broadcast()
		q.mu.Unlock()
		return nil
	}
	// The queue is idle: send it from this goroutine, without a
	// hand-off (the write does not block; see postDirect).
	seq := q.sqNextSeq
	q.claimLocked()
	q.txBusy = true
	q.mu.Unlock()
	q.postDirect(&e, seq)
	return nil
}

// errOtherPD: a work request named memory of another protection domain
// (a local protection error on hardware).
var errOtherPD = errors.New("memory region of another protection domain")

// localSGE resolves a local scatter/gather element.
func localSGE(sge verbs.SGE, need verbs.Access) ([]byte, error) {
	if sge.MR == nil {
		return nil, fmt.Errorf("no memory region: %w", verbs.ErrInvalidSTag)
	}
	return link.Local(sge.MR, need, sge.Offset, sge.Length)
}

// PostRecv implements verbs.QueuePair.
func (q *QP) PostRecv(wr verbs.RecvWR) error {
	if len(wr.SGL) != 1 {
		return fmt.Errorf("iwarp: post receive with %d SGEs (the provider places a Send into one): %w", len(wr.SGL), verbs.ErrInvalidWR)
	}
	buf, err := localSGE(wr.SGL[0], verbs.AccessLocalWrite)
	if err == nil && wr.SGL[0].MR.PD() != q.pd.pd {
		err = errOtherPD
	}
	if err != nil {
		return fmt.Errorf("iwarp: post receive: %w: %w", verbs.ErrInvalidWR, err)
	}
	q.mu.Lock()
	if q.rxExited {
		q.mu.Unlock()
		q.flushPosted(verbs.Completion{WRID: wr.WRID, Status: verbs.StatusFlushed, Opcode: verbs.OpRecv})
		return nil
	}
	q.rq.push(recvEntry{wrid: wr.WRID, buf: buf})
	q.mu.Unlock()
	return nil
}

// completeSend records the end of send queue entry seq and releases
// completions in posting order.
func (q *QP) completeSend(seq uint64, st verbs.Status, n uint32) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if seq < q.sqHeadSeq {
		return
	}
	e := q.sq.at(int(seq - q.sqHeadSeq))
	if e.done {
		return
	}
	e.done, e.status, e.byteLen = true, st, n
	q.releaseLocked()
}

// releaseLocked delivers finished send completions from the head: a send
// queue completes in order even when a later request finished first.
func (q *QP) releaseLocked() {
	for {
		released, blocked := q.releaseRegLocked()
		if released {
			continue
		}
		if blocked || q.sq.len() == 0 || !q.sq.at(0).done {
			return
		}
		e := q.sq.pop()
		q.sqHeadSeq++
		c := verbs.Completion{WRID: e.wr.WRID, Status: e.status, Opcode: e.wr.Opcode}
		if e.status == verbs.StatusSuccess {
			c.ByteLen = e.byteLen
		}
		q.scq.Push(c)
	}
}

// setErr moves the queue pair to the error state; only the first error
// sticks. It reports whether err was the first.
func (q *QP) setErr(err error) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.setErrLocked(err)
}

func (q *QP) setErrLocked(err error) bool {
	if q.err != nil {
		return false
	}
	q.err = err
	close(q.done)
	q.cond.Broadcast()
	return true
}

// flushSendLocked, run by the exiting tx goroutine, flushes every send
// entry not finished, except reads the rx goroutine still owns.
func (q *QP) flushSendLocked() {
	for i := 0; i < q.sq.len(); i++ {
		e := q.sq.at(i)
		seq := q.sqHeadSeq + uint64(i)
		if e.done || (seq < q.sqNextSeq && e.wr.Opcode == verbs.OpRDMARead && !q.rxExited) {
			continue
		}
		e.done, e.status = true, verbs.StatusFlushed
	}
	q.releaseLocked()
}

// flushRecvLocked, run by the exiting rx goroutine, flushes posted
// receives and the outbound reads awaiting responses. The first
// outstanding read gets st; the others are flushed. It returns the
// receive completions, for deliverFlushed once mu is released (a
// receive handler may post).
func (q *QP) flushRecvLocked(st verbs.Status) []verbs.Completion {
	var flushed []verbs.Completion
	for q.rq.len() > 0 {
		e := q.rq.pop()
		flushed = append(flushed, verbs.Completion{WRID: e.wrid, Status: verbs.StatusFlushed, Opcode: verbs.OpRecv})
	}
	for q.orq.len() > 0 {
		r := q.orq.pop()
		if r.seq >= q.sqHeadSeq {
			e := q.sq.at(int(r.seq - q.sqHeadSeq))
			if !e.done {
				e.done, e.status = true, st
			}
		}
		st = verbs.StatusFlushed
	}
	if q.txExited {
		q.flushSendLocked()
	}
	q.releaseLocked()
	return flushed
}

// CopiedBytes returns how many received tagged payload bytes (RDMA Write
// and Read Response data) went through the provider's buffered reader, a
// user-space copy, instead of straight from the socket into place.
func (q *QP) CopiedBytes() uint64 { return q.copied.Load() }

// SendCQ implements verbs.QueuePair.
func (q *QP) SendCQ() verbs.CompletionQueue { return q.scq }

// RecvCQ implements verbs.QueuePair.
func (q *QP) RecvCQ() verbs.CompletionQueue { return q.rcq }

// PD implements verbs.QueuePair.
func (q *QP) PD() *verbs.ProtectionDomain { return q.pd.pd }

// PeerPrivateData implements verbs.QueuePair.
func (q *QP) PeerPrivateData() []byte { return q.peerPD }

// IRD implements verbs.QueuePair.
func (q *QP) IRD() int { return q.ird }

// ORD implements verbs.QueuePair.
func (q *QP) ORD() int { return q.ord }

// CRC implements verbs.QueuePair.
func (q *QP) CRC() bool { return q.crc }

// LocalAddr implements verbs.QueuePair.
func (q *QP) LocalAddr() net.Addr { return q.conn.LocalAddr() }

// RemoteAddr implements verbs.QueuePair.
func (q *QP) RemoteAddr() net.Addr { return q.conn.RemoteAddr() }

// Err implements verbs.QueuePair.
func (q *QP) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// Done implements verbs.QueuePair.
func (q *QP) Done() <-chan struct{} { return q.done }

// Close implements verbs.QueuePair.
//
// A Terminate being written is let out first, for at most teardownWait:
// closing the connection under it would leave the peer with the end of
// the stream and no reason (RFC 5040 s5.3: the Terminate is the last
// message on the stream).
func (q *QP) Close() error {
	q.closeOnce.Do(func() {
		if q.closing != nil {
			close(q.closing)
		}
		q.setErr(fmt.Errorf("iwarp: queue pair: %w", verbs.ErrClosed))
		// After setErr, a Terminate that won the error state has
		// been started (terminate marks it under the same lock).
		if q.termStarted.Load() {
			t := time.NewTimer(teardownWait)
			select {
			case <-q.termWritten:
			case <-t.C:
			}
			t.Stop()
		}
		_ = q.conn.Close()
		q.wg.Wait()
	})
	return nil
}

// terminate sends a Terminate (RFC 5040 s5.3/s7) for a locally detected
// error and moves the queue pair to the error state. It returns at once;
// the Terminate is written by its own goroutine.
func (q *QP) terminate(t Terminate, cause error) bool {
	q.mu.Lock()
	if !q.setErrLocked(&TerminateError{Terminate: t, Sent: true, Cause: cause}) {
		q.mu.Unlock()
		return false
	}
	// Under the lock that set the error: a Close that finds the error
	// set also finds the Terminate started, and waits for it.
	q.termStarted.Store(true)
	q.wg.Add(1)
	q.mu.Unlock()
	go func() {
		defer q.wg.Done()
		defer close(q.termWritten)
		// Unblock a sender stuck on a full socket, then write.
		_ = q.conn.SetWriteDeadline(time.Now().Add(teardownWait))
		var hb [untaggedHdrLen]byte
		putUntagged(hb[:], true, opTerminate, 0, qnTerminate, 1, 0)
		var pb [4 + 2 + untaggedHdrLen + readReqLen]byte
		q.w.mu.Lock()
		_ = q.w.writeLocked(hb[:], [][]byte{t.marshal(pb[:0])})
		q.w.sealed = true // RFC 5040 s5.3: the last message on the stream
		q.w.mu.Unlock()
		if cw, ok := q.conn.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		// The rx goroutine drains until the peer closes; bound it.
		_ = q.conn.SetReadDeadline(time.Now().Add(teardownWait))
	}()
	return true
}
