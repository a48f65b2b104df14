package iwarp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/rdmafs/rdmafs/verbs"
)

// rxFault is a protocol violation detected on the receive side: the
// Terminate to send and the reason.
type rxFault struct {
	t     Terminate
	cause error
}

// Error describes the fault.
func (f *rxFault) Error() string { return fmt.Sprintf("%v: %v", &f.t, f.cause) }

// rxState is owned by the rx goroutine.
type rxState struct {
	hdr     [2 + untaggedHdrLen]byte
	tail    [8]byte
	rr      [readReqLen]byte
	tp      [256]byte
	ulen    int
	crc     uint32
	sendMSN uint32 // next expected MSN on QN 0
	readMSN uint32 // next expected MSN on QN 1
	active  bool   // a Send message is being reassembled
	cur     recvEntry
	curLen  uint32
	seen    bool // an FPDU arrived (mirrors QP.rxSeen)

	// direct: read straight from the socket, bypassing the buffered
	// reader, because the peer sends large FPDUs (see place).
	direct bool
	small  int // small FPDUs in a row while direct
	// more: the current FPDU is not the last segment of its message,
	// so another FPDU follows; pre: how many bytes of that next FPDU's
	// header were read with this one's trailer (into hdr).
	more bool
	pre  int
	pf   [8 + prefetchLen]byte
	// payload: the current FPDU's payload length; trailerIn: its
	// trailer (and prefetch) was read together with the payload.
	payload   int
	trailerIn bool
	// opt: bytes of the next FPDU read opportunistically into pf with
	// the trailer of a last segment (readTrailer moves them to hdr).
	opt int
	vr  *vecReader
	// rd reads the socket for direct reads (rawReader); nil: q.conn.
	rd io.Reader
	// yield: a work request completed since the last socket read
	// (see yieldIfIdle).
	yield bool
	// bigReader: q.br is the receive side's readerSize reader, no
	// longer the MPA exchange's.
	bigReader bool
}

// prefetchLen is how much of the next FPDU a direct reader takes with a
// trailer: MPA length and a tagged DDP header, which every FPDU has at
// least (RFC 5044 s4.1, RFC 5041 s4.2).
const prefetchLen = 2 + taggedHdrLen

// Placement of large payloads. A payload of at least directMin bytes is
// read from the socket straight into its destination; the stream then
// stays direct (headers read with exact-size reads, so no payload byte
// lands in the buffered reader first) until smallLimit small FPDUs in a
// row show the peer has gone back to small ones (Linux siw sends one
// FPDU per TCP segment: for those the buffered reader is cheaper).
const (
	directMin  = 16 << 10
	smallLimit = 8
)

// reader is what reads the socket: rd, or the connection itself.
func (rs *rxState) reader(q *QP) io.Reader {
	if rs.rd != nil {
		return rs.rd
	}
	return q.conn
}

// readFull reads len(b) bytes of headers or trailers.
func (q *QP) readFull(rs *rxState, b []byte) error {
	if rs.direct {
		_, err := io.ReadFull(rs.reader(q), b)
		return err
	}
	return readBuffered(q.br, b)
}

// readBuffered is io.ReadFull from br, without its loop and indirect call
// when br holds all of b already (small FPDUs: every header and payload).
func readBuffered(br *bufio.Reader, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if br.Buffered() >= len(b) {
		_, _ = br.Read(b) // copies len(b) bytes from the buffer; no error
		return nil
	}
	_, err := io.ReadFull(br, b)
	return err
}

// rxLoop reads FPDUs until the stream ends, then flushes what the
// receive side owns.
func (q *QP) rxLoop() {
	defer q.wg.Done()
	rs := &rxState{sendMSN: 1, readMSN: 1, vr: newVecReader(q.conn), rd: newRawReader(q.conn)}
	err := q.receive(rs)
	readStatus := verbs.StatusFlushed
	var fault *rxFault
	var term *TerminateError
	switch {
	case errors.As(err, &fault):
		if q.terminate(fault.t, fault.cause) {
			// Drain until the peer closes (or the deadline the
			// terminate goroutine sets) so that closing does not
			// reset the connection under the Terminate.
			_, _ = io.Copy(io.Discard, q.br)
		}
		readStatus = verbs.StatusFatalErr
	case errors.As(err, &term):
		q.setErr(term)
		readStatus = term.status()
	default:
		q.setErr(fmt.Errorf("iwarp: receive: %w: %w", verbs.ErrConnectionLost, err))
	}
	if q.termStarted.Load() {
		<-q.termWritten
	}
	_ = q.conn.Close()
	q.hmu.Lock()
	q.mu.Lock()
	q.rxExited = true
	flushed := q.flushRecvLocked(readStatus)
	q.mu.Unlock()
	q.deliverRecvLocked(flushed...)
}

// fault builds an rxFault for the current FPDU.
func (rs *rxState) fault(layer, etype, code byte, cause error) *rxFault {
	hl := headerLen(rs.hdr[2])
	t := Terminate{Layer: layer, EType: etype, Code: code, SegLenValid: true, SegLen: uint16(rs.ulen),
		DDPHeader: append([]byte(nil), rs.hdr[2:2+hl]...)}
	return &rxFault{t: t, cause: cause}
}

// taggedCode maps a region lookup error to a DDP tagged buffer error code
// (RFC 5040 s7; insufficient rights map to Invalid STag as in Linux siw).
func taggedCode(err error) byte {
	if errors.Is(err, verbs.ErrBounds) {
		return DDPCodeTBaseBounds
	}
	return DDPCodeTInvalidSTag
}

// receive is the receive loop; it returns why the stream ended.
func (q *QP) receive(rs *rxState) error {
	for {
		have := rs.pre
		rs.pre = 0
		if !rs.bigReader && q.conn != nil && q.br.Buffered() == 0 {
			// The MPA exchange's reader is drained: go on with a
			// large one (nothing is lost replacing an empty one).
			q.br = bufio.NewReaderSize(rs.reader(q), readerSize)
			rs.bigReader = true
		}
		if have < 4 && rs.yield {
			q.yieldIfIdle(rs)
		}
		switch {
		case have >= 4:
		case rs.direct && rs.vr != nil:
			// With the length, whatever of the header has arrived
			// (every FPDU has at least prefetchLen bytes of length
			// and header: RFC 5044 s4.1, RFC 5041 s4.2), in one
			// system call.
			n, err := rs.vr.fill(q.conn, rs.hdr[have:4], nil, rs.hdr[4:prefetchLen])
			if err != nil {
				return err
			}
			have = 4 + n
		default:
			// Buffered small FPDUs: the length and as much of the
			// header as every FPDU has, in one copy.
			end := 4
			if !rs.direct && q.br.Buffered() >= prefetchLen-have {
				end = prefetchLen
			}
			if err := q.readFull(rs, rs.hdr[have:end]); err != nil {
				return err
			}
			have = end
		}
		if !rs.seen {
			rs.seen = true
			q.rxSeen.Store(true)
		}
		// RFC 5044 s4.1: ULPDU_Length counts the ULPDU only.
		rs.ulen = int(binary.BigEndian.Uint16(rs.hdr[:]))
		hl := headerLen(rs.hdr[2])
		if rs.ulen < hl {
			return &rxFault{t: Terminate{Layer: LayerDDP, EType: DDPEtypeCatastrophic, SegLenValid: true, SegLen: uint16(rs.ulen)},
				cause: fmt.Errorf("%w: ULPDU of %d bytes is shorter than its %d-byte header", errDDP, rs.ulen, hl)}
		}
		if have < 2+hl {
			if err := q.readFull(rs, rs.hdr[have:2+hl]); err != nil {
				return err
			}
		}
		h, err := parseDDPHeader(rs.hdr[2 : 2+hl])
		if err != nil {
			return rs.fault(LayerDDP, DDPEtypeCatastrophic, 0, err)
		}
		rs.more = !h.last()
		if q.crc {
			rs.crc = crc32.Update(0, castagnoli, rs.hdr[:2+hl])
		}
		n := rs.ulen - hl
		rs.payload = n
		// RFC 5041 s4.2 / RFC 5040 s4.2: versions must be 1.
		if h.ddpVer() != ddpVersion {
			if h.tagged() {
				return rs.fault(LayerDDP, DDPEtypeTaggedBuf, DDPCodeTVersion, fmt.Errorf("%w: DDP version %d", errDDP, h.ddpVer()))
			}
			return rs.fault(LayerDDP, DDPEtypeUntaggedBuf, DDPCodeUVersion, fmt.Errorf("%w: DDP version %d", errDDP, h.ddpVer()))
		}
		if h.rdmapVer() != rdmapVersion {
			return rs.fault(LayerRDMAP, RDMAPEtypeRemoteOperation, RDMAPCodeInvalidVersion, fmt.Errorf("%w: RDMAP version %d", errDDP, h.rdmapVer()))
		}
		if h.tagged() {
			err = q.rxTagged(rs, &h, n)
		} else {
			err = q.rxUntagged(rs, &h, n)
		}
		if err != nil {
			return err
		}
	}
}

// readTrailer reads pad and CRC and checks the CRC (RFC 5044 s4.4).
// A direct reader whose message goes on reads the start of the next FPDU
// in the same system call, saving one per FPDU.
func (q *QP) readTrailer(rs *rxState) error {
	pad := -(2 + rs.ulen) & 3
	prefetch := rs.direct && rs.more
	if rs.trailerIn {
		rs.trailerIn = false
	} else if err := q.readFull(rs, rs.trailerBuf()); err != nil {
		return err
	}
	if prefetch {
		copy(rs.tail[:pad+4], rs.pf[:pad+4])
	}
	if q.crc {
		c := crc32.Update(rs.crc, castagnoli, rs.tail[:pad])
		if got := binary.LittleEndian.Uint32(rs.tail[pad:]); got != c {
			return rs.fault(LayerLLP, LLPEtypeMPA, LLPCodeCRC, fmt.Errorf("iwarp: MPA CRC %#08x, computed %#08x", got, c))
		}
	}
	if prefetch {
		rs.pre = copy(rs.hdr[:], rs.pf[pad+4:pad+4+prefetchLen])
	} else if rs.opt > 0 {
		rs.pre = copy(rs.hdr[:], rs.pf[:rs.opt])
	}
	rs.opt = 0
	return nil
}

// trailerBuf is where the current FPDU's trailer is read: with the
// start of the next FPDU's header when a direct reader's message goes on.
func (rs *rxState) trailerBuf() []byte {
	pad := -(2 + rs.ulen) & 3
	if rs.direct && rs.more {
		return rs.pf[:pad+4+prefetchLen]
	}
	return rs.tail[:pad+4]
}

// place reads len(dst) payload bytes into dst and folds them into the
// CRC. A large payload goes from the socket straight into dst; only what
// the buffered reader already holds is copied (tagged data counted in
// copied: the bulk data of the upper layer).
func (q *QP) place(rs *rxState, dst []byte) error {
	return q.placeData(rs, dst, false)
}

// placeTagged is place for tagged data (RDMA Write, Read Response).
func (q *QP) placeTagged(rs *rxState, dst []byte) error {
	return q.placeData(rs, dst, true)
}

func (q *QP) placeData(rs *rxState, dst []byte, tagged bool) error {
	switch {
	case len(dst) >= directMin:
		k := 0
		if !rs.direct {
			k = min(q.br.Buffered(), len(dst))
			if _, err := io.ReadFull(q.br, dst[:k]); err != nil {
				return err
			}
			if tagged {
				q.copied.Add(uint64(k))
			}
			// Direct reads only once the buffered reader is empty,
			// or the stream would be read out of order.
			rs.direct = q.br.Buffered() == 0
		}
		rs.small = 0
		switch {
		case k == len(dst):
		case rs.direct && len(dst) == rs.payload:
			// The whole payload: take the trailer in the same
			// system call (readTrailer then only checks it).
			// The last segment: also whatever of the next FPDU's
			// header is there already, without waiting for it.
			var opt []byte
			if !rs.more {
				opt = rs.pf[:prefetchLen]
			}
			n, err := rs.vr.fill(q.conn, dst[k:], rs.trailerBuf(), opt)
			if err != nil {
				return err
			}
			rs.trailerIn, rs.opt = true, n
		default:
			if _, err := io.ReadFull(rs.reader(q), dst[k:]); err != nil {
				return err
			}
		}
	case rs.direct:
		if rs.small++; rs.small >= smallLimit {
			rs.direct = false
		}
		if _, err := io.ReadFull(rs.reader(q), dst); err != nil {
			return err
		}
	default:
		if err := readBuffered(q.br, dst); err != nil {
			return err
		}
		if tagged {
			q.copied.Add(uint64(len(dst)))
		}
	}
	if q.crc {
		rs.crc = crc32.Update(rs.crc, castagnoli, dst)
	}
	return nil
}

// rxTagged handles RDMA Write and RDMA Read Response segments (RFC 5040
// s5.1, s5.2; RFC 5041 s5.1 tagged buffer model).
func (q *QP) rxTagged(rs *rxState, h *ddpHeader, n int) error {
	switch h.opcode() {
	case opWrite:
		if n > 0 {
			if err := q.placeAccess(rs, h, n, verbs.AccessRemoteWrite, "inbound RDMA Write"); err != nil {
				return err
			}
		}
		return q.readTrailer(rs)
	case opReadResp:
		// RFC 5040 s5.2: Read Responses arrive in request order;
		// each segment must continue the oldest outstanding read.
		q.mu.Lock()
		if q.orq.len() == 0 {
			q.mu.Unlock()
			return rs.fault(LayerRDMAP, RDMAPEtypeRemoteOperation, RDMAPCodeUnexpectedOpcode, errors.New("iwarp: RDMA Read Response without a request"))
		}
		r := *q.orq.at(0)
		q.mu.Unlock()
		switch {
		case h.stag != r.sinkSTag:
			return rs.fault(LayerDDP, DDPEtypeTaggedBuf, DDPCodeTInvalidSTag, fmt.Errorf("iwarp: Read Response to STag %#08x, expected %#08x", h.stag, r.sinkSTag))
		case h.to != r.sinkTO+uint64(r.got) || uint64(n) > uint64(r.size-r.got) || (h.last() && r.got+uint32(n) != r.size):
			return rs.fault(LayerDDP, DDPEtypeTaggedBuf, DDPCodeTBaseBounds, fmt.Errorf("iwarp: Read Response [%d,+%d) does not continue [%d,+%d) at %d", h.to, n, r.sinkTO, r.size, r.got))
		}
		if n > 0 {
			if err := q.placeAccess(rs, h, n, verbs.AccessLocalWrite, "inbound Read Response sink"); err != nil {
				return err
			}
		}
		if err := q.readTrailer(rs); err != nil {
			return err
		}
		q.mu.Lock()
		q.orq.at(0).got += uint32(n)
		if h.last() {
			q.orq.pop()
			q.reads--
			// An ORD credit is free: wake the tx goroutine only if
			// a work request waits to go (a Read for the credit).
			// An owner of the transmit side looks itself when done
			// (tx.go), and a wake-up for nothing costs a thread
			// wake-up per Read.
			if !q.txBusy && q.sendableLocked() {
				q.cond.Broadcast()
			}
		}
		q.mu.Unlock()
		if h.last() {
			q.completeSend(r.seq, verbs.StatusSuccess, r.size)
			rs.yield = true
		}
		return nil
	default:
		return rs.fault(LayerRDMAP, RDMAPEtypeRemoteOperation, RDMAPCodeUnexpectedOpcode, fmt.Errorf("iwarp: tagged segment with opcode %d", h.opcode()))
	}
}

// placeAccess places the n-byte payload of tagged segment h into the
// region h names (RFC 5041 s5.3: STag, rights and bounds are checked for
// every tagged segment; nothing lands outside). The region stays busy
// until the payload is in, so an invalidation waits for the placement;
// if the invalidation comes while the payload is still on its way, it
// stops the placement (stopper): the rest of the payload does not land
// and the queue pair terminates with an invalid STag error, as for a
// segment that arrives after the invalidation (RFC 8166 s8.1.3).
func (q *QP) placeAccess(rs *rxState, h *ddpHeader, n int, need verbs.Access, what string) error {
	if !rs.direct && q.br.Buffered() >= n {
		// The payload is in the buffered reader: placing it is a copy
		// that cannot wait for the peer, so there is nothing for an
		// invalidation to stop (the invalidation waits for the copy).
		// Small FPDUs take this path, without the stopper's locking.
		if n <= placeUnderLock {
			return q.placeLocked(rs, h, n, need, what)
		}
		dst, mr, err := q.pd.BeginAccess(h.stag, need, h.to, uint64(n), nil)
		if err != nil {
			return rs.fault(LayerDDP, DDPEtypeTaggedBuf, taggedCode(err), fmt.Errorf("%s: %w", what, err))
		}
		if err := q.placeTagged(rs, dst); err != nil {
			mr.EndAccess(nil, 0, 0)
			return err
		}
		mr.EndAccess(nil, h.to, uint64(n))
		return nil
	}
	q.rxStop.prepare()
	dst, mr, err := q.pd.BeginAccess(h.stag, need, h.to, uint64(n), &q.rxStop)
	if err != nil {
		return rs.fault(LayerDDP, DDPEtypeTaggedBuf, taggedCode(err), fmt.Errorf("%s: %w", what, err))
	}
	if q.rxStop.ioStart() {
		err = q.placeTagged(rs, dst)
	} else {
		err = errStopped
	}
	stopped := q.rxStop.ioEnd()
	if err != nil {
		mr.EndAccess(&q.rxStop, 0, 0)
		if stopped {
			return rs.fault(LayerDDP, DDPEtypeTaggedBuf, DDPCodeTInvalidSTag,
				fmt.Errorf("%s: STag %#08x invalidated during placement: %w: %w", what, h.stag, verbs.ErrInvalidSTag, err))
		}
		return err
	}
	mr.EndAccess(&q.rxStop, h.to, uint64(n))
	return nil
}

// placeUnderLock: a buffered payload up to this size is placed under the
// domain's lock (placeLocked); a larger one would hold it too long.
const placeUnderLock = 8 << 10

// placeLocked places a tagged payload that is all in the buffered reader
// under the domain's lock (verbs.ProtectionDomain.Place): one lock for
// the check and the copy, where Begin and End take two, and no
// invalidation can overlap it.
func (q *QP) placeLocked(rs *rxState, h *ddpHeader, n int, need verbs.Access, what string) error {
	var perr error // placeTagged's: not a protection fault
	err := q.pd.Place(h.stag, need, h.to, uint64(n), func(dst []byte) (uint64, error) {
		if perr = q.placeTagged(rs, dst); perr != nil {
			return 0, perr
		}
		return uint64(n), nil
	})
	switch {
	case perr != nil:
		return perr
	case err != nil:
		return rs.fault(LayerDDP, DDPEtypeTaggedBuf, taggedCode(err), fmt.Errorf("%s: %w", what, err))
	}
	return nil
}

// errStopped: an invalidation stopped an access before it began.
var errStopped = errors.New("iwarp: access stopped by invalidation")
