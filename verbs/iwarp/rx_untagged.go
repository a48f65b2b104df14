package iwarp

// The untagged side of the receive path: Sends into posted receive
// buffers, Read Requests for the responder, and Terminates (RFC 5041
// s5.2 untagged buffer model, RFC 5040 s5 and s7).

import (
	"errors"
	"fmt"
	"io"
	"runtime"

	"github.com/rdmafs/rdmafs/verbs"
)

// rxUntagged handles Sends, Read Requests and Terminates (RFC 5041 s5.2
// untagged buffer model, RFC 5040 s5).
func (q *QP) rxUntagged(rs *rxState, h *ddpHeader, n int) error {
	op := h.opcode()
	var wantQN uint32
	switch op {
	case opSend, opSendInv, opSendSE, opSendSEInv:
		wantQN = qnSend
	case opReadReq:
		wantQN = qnReadReq
	case opTerminate:
		wantQN = qnTerminate
	default:
		return rs.fault(LayerRDMAP, RDMAPEtypeRemoteOperation, RDMAPCodeUnexpectedOpcode, fmt.Errorf("iwarp: untagged segment with opcode %d", op))
	}
	if h.qn != wantQN {
		return rs.fault(LayerDDP, DDPEtypeUntaggedBuf, DDPCodeUInvalidQN, fmt.Errorf("iwarp: opcode %d on QN %d", op, h.qn))
	}
	switch wantQN {
	case qnSend:
		return q.rxSend(rs, h, n)
	case qnReadReq:
		return q.rxReadRequest(rs, h, n)
	default:
		return q.rxTerminate(rs, n)
	}
}

func (q *QP) rxSend(rs *rxState, h *ddpHeader, n int) error {
	if h.msn != rs.sendMSN {
		return rs.fault(LayerDDP, DDPEtypeUntaggedBuf, DDPCodeUMSNRange, fmt.Errorf("iwarp: Send MSN %d, expected %d", h.msn, rs.sendMSN))
	}
	if !rs.active {
		// RFC 5040 s5.3/RFC 5041 s5.2: a Send needs a posted buffer;
		// none is a protocol error, not a silent drop.
		q.mu.Lock()
		if q.rq.len() == 0 {
			q.mu.Unlock()
			return rs.fault(LayerDDP, DDPEtypeUntaggedBuf, DDPCodeUNoBuffer, fmt.Errorf("iwarp: Send MSN %d: no receive buffer posted", h.msn))
		}
		rs.cur = *q.rq.at(0)
		q.mu.Unlock()
		rs.active, rs.curLen = true, 0
	}
	size := uint64(len(rs.cur.buf))
	if uint64(h.mo) > size {
		return rs.fault(LayerDDP, DDPEtypeUntaggedBuf, DDPCodeUInvalidMO, fmt.Errorf("iwarp: Send MO %d beyond %d-byte buffer", h.mo, size))
	}
	if h.mo != rs.curLen {
		// RFC 5041 s5.4: a message is delivered only once all its
		// segments are placed; over MPA/TCP they arrive in order
		// (RFC 5041 s5.3, RFC 5044), so a segment that does not start
		// where the message's placed bytes end leaves a gap (or
		// overlap) that no later segment can fill. Completing the
		// message would hand up whatever the buffer held in the gap:
		// terminate with the untagged buffer error Invalid MO
		// (RFC 5041 s7.2, code 4), as Linux siw does, rather than
		// deliver a prefix the sender did not mean as a message.
		return rs.fault(LayerDDP, DDPEtypeUntaggedBuf, DDPCodeUInvalidMO, fmt.Errorf("iwarp: Send segment at MO %d, message placed up to %d", h.mo, rs.curLen))
	}
	if uint64(h.mo)+uint64(n) > size {
		q.mu.Lock()
		q.rq.pop()
		q.mu.Unlock()
		q.deliverRecv(verbs.Completion{WRID: rs.cur.wrid, Status: verbs.StatusLocalLengthErr, Opcode: verbs.OpRecv})
		return rs.fault(LayerDDP, DDPEtypeUntaggedBuf, DDPCodeUTooLong, fmt.Errorf("iwarp: Send of at least %d bytes into %d-byte buffer", uint64(h.mo)+uint64(n), size))
	}
	if err := q.place(rs, rs.cur.buf[h.mo:h.mo+uint32(n)]); err != nil {
		return err
	}
	if err := q.readTrailer(rs); err != nil {
		return err
	}
	rs.curLen = h.mo + uint32(n) // contiguous: h.mo was rs.curLen
	if !h.last() {
		return nil
	}
	c := verbs.Completion{WRID: rs.cur.wrid, Opcode: verbs.OpRecv, ByteLen: rs.curLen}
	if op := h.opcode(); op == opSendInv || op == opSendSEInv {
		// RFC 5040 s5.3: invalidate the STag named in the header
		// before the receive completes.
		if err := q.pd.InvalidateRemote(h.rsvd); err != nil {
			return rs.fault(LayerRDMAP, RDMAPEtypeRemoteProtection, RDMAPCodeCannotInvalidate, err)
		}
		c.Opcode, c.InvalidatedSTag = verbs.OpRecvWithInvalidate, h.rsvd
	}
	q.mu.Lock()
	q.rq.pop()
	q.mu.Unlock()
	rs.active = false
	rs.sendMSN++
	// The message is placed and no placement state is held: a
	// receive handler may invalidate memory and post (handler.go).
	q.deliverRecv(c)
	rs.yield = true
	return nil
}

// yieldIfIdle runs before the receive loop goes to the socket for the
// next FPDU after it completed a work request. When nothing more is
// buffered, the read that comes next usually finds the socket empty and
// parks the goroutine, while the goroutine the completion woke (a poller
// of the completion queue, or one a receive handler signalled) waits for
// this thread, or for another one to be woken up and take it over.
// Yielding first lets it run here at once, ahead of that read and park,
// instead of after them or on another thread: for a request/reply
// exchange that takes a system call and a hand-over between threads off
// the critical path of every round trip (BenchmarkRatioSendRecv64). With
// more FPDUs buffered the loop goes on with them.
func (q *QP) yieldIfIdle(rs *rxState) {
	rs.yield = false
	if rs.direct || q.br.Buffered() == 0 {
		runtime.Gosched()
	}
}

func (q *QP) rxReadRequest(rs *rxState, h *ddpHeader, n int) error {
	if h.msn != rs.readMSN {
		return rs.fault(LayerDDP, DDPEtypeUntaggedBuf, DDPCodeUMSNRange, fmt.Errorf("iwarp: Read Request MSN %d, expected %d", h.msn, rs.readMSN))
	}
	if n != readReqLen || h.mo != 0 || !h.last() {
		return rs.fault(LayerDDP, DDPEtypeUntaggedBuf, DDPCodeUTooLong, fmt.Errorf("iwarp: Read Request segment of %d bytes at MO %d", n, h.mo))
	}
	if err := q.place(rs, rs.rr[:]); err != nil {
		return err
	}
	if err := q.readTrailer(rs); err != nil {
		return err
	}
	rr, _ := parseReadRequest(rs.rr[:])
	rs.readMSN++
	// RFC 5040 s5.2/RFC 6581: serve at most IRD reads at once.
	k := q.irqCount.Add(1)
	if int(k) > q.ird {
		f := rs.fault(LayerRDMAP, RDMAPEtypeRemoteOperation, RDMAPCodeCatastrophicStrm, fmt.Errorf("iwarp: %d Read Requests outstanding, IRD is %d", k, q.ird))
		f.t.ReadRequest = append([]byte(nil), rs.rr[:]...)
		return f
	}
	for {
		m := q.maxIRQ.Load()
		if k <= m || q.maxIRQ.CompareAndSwap(m, k) {
			break
		}
	}
	if k == 1 && q.respondInline(rr) {
		return nil
	}
	q.respQueued.Add(1)
	select {
	case q.irq <- rr:
	default:
		return rs.fault(LayerRDMAP, RDMAPEtypeRemoteOperation, RDMAPCodeCatastrophicStrm, errors.New("iwarp: read queue full"))
	}
	return nil
}

// rxTerminate reads a Terminate (RFC 5040 s5.3); the stream is dead after it.
func (q *QP) rxTerminate(rs *rxState, n int) error {
	k := min(n, len(rs.tp))
	if err := q.place(rs, rs.tp[:k]); err != nil {
		return err
	}
	if _, err := io.CopyN(io.Discard, q.br, int64(n-k)); err != nil {
		return err
	}
	t, err := parseTerminate(rs.tp[:k])
	if err != nil {
		return fmt.Errorf("iwarp: peer sent a malformed Terminate: %w", err)
	}
	t.DDPHeader = append([]byte(nil), t.DDPHeader...)
	t.ReadRequest = append([]byte(nil), t.ReadRequest...)
	return &TerminateError{Terminate: t}
}
