package iwarp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/verbs"
)

// Interleaved bulk benchmarks: each iteration runs one operation over the
// provider and one over plain loopback TCP, in turns, and the benchmark
// reports the ratios of the time (and process CPU time) they took; on a
// loaded machine benchmarks run one after the other see different loads.

// usage is the process's user and system CPU time so far and the
// voluntary context switches its threads made (a thread that slept for
// lack of work: a wake-up that crossed threads).
func usage() (time.Duration, int64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Nvcsw
}

// ratioCost is what alternate measured per operation: the wall time, CPU
// time and voluntary context switches each spent in all.
type ratioCost struct {
	spent, cpu []time.Duration
	csw        []int64
	n          int // iterations (operations of each)
}

// alternate runs ops (ops[0] TCP, ops[1] the provider, and any more)
// in turns, one of each per iteration, rotating which goes first. The
// operations are sequential, so the process's CPU time and context
// switches around each are its cost (both ends of the connection).
func alternate(b *testing.B, ops ...func() error) ratioCost {
	rc := ratioCost{spent: make([]time.Duration, len(ops)), cpu: make([]time.Duration, len(ops)), csw: make([]int64, len(ops))}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for k := range ops {
			j := (i + k) % len(ops)
			c0, v0 := usage()
			t0 := time.Now()
			err := ops[j]()
			rc.spent[j] += time.Since(t0)
			c1, v1 := usage()
			rc.cpu[j] += c1 - c0
			rc.csw[j] += v1 - v0
			if err != nil {
				b.Fatal(err)
			}
		}
		rc.n++
	}
	return rc
}

// ratioLoop runs ops[0] (TCP) and ops[1] (the provider) alternately
// (alternate) and reports the provider's time and CPU time over TCP's.
func ratioLoop(b *testing.B, ops [2]func() error) {
	rc := alternate(b, ops[:]...)
	b.ReportMetric(float64(rc.spent[1])/float64(rc.spent[0]), "time/tcp")
	if rc.cpu[0] > 0 {
		b.ReportMetric(float64(rc.cpu[1])/float64(rc.cpu[0]), "cpu/tcp")
	}
}

// tcpBulk returns an operation sending size bytes over a loopback TCP
// connection with one write, read by the peer into one buffer, which
// acknowledges them with one byte.
func tcpBulk(b *testing.B, size int) func() error {
	c, s := tcpPair(b)
	src := randBytes(size, 1)
	go func() {
		dst := make([]byte, size)
		for {
			if _, err := io.ReadFull(s, dst); err != nil {
				return
			}
			if _, err := s.Write([]byte{1}); err != nil {
				return
			}
		}
	}()
	var ack [1]byte
	return func() error {
		if _, err := c.Write(src); err != nil {
			return err
		}
		_, err := io.ReadFull(c, ack[:])
		return err
	}
}

// BenchmarkRatioWrite1MiB alternates a 1 MiB RDMA Write between two
// queue pairs of the provider with a 1 MiB write on plain TCP. Each
// operation waits for its data to arrive: the RDMA Write is followed by
// a zero-length RDMA Read (answered after the Write is placed: RFC 5040
// s5.5 ordering), the TCP write by a one-byte acknowledgement.
//
//	go test -run '^$' -bench RatioWrite1MiB ./verbs/iwarp
func BenchmarkRatioWrite1MiB(b *testing.B) {
	const size = 1 << 20
	ctx := testCtx(b)
	c, s := pair(b, nil, nil)
	dst := reg(b, s.PD(), make([]byte, size), verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	src := gather(b, c.PD(), randBytes(size, 1))
	sink := reg(b, c.PD(), make([]byte, 1), verbs.AccessLocalWrite)
	write := verbs.SendWR{Opcode: verbs.OpRDMAWrite, SGL: src, RemoteSTag: dst.STag()}
	fence := verbs.SendWR{Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{{MR: sink}}, RemoteSTag: dst.STag()}
	var wc [2]verbs.Completion
	rdma := func() error {
		if err := c.PostSend(write); err != nil {
			return err
		}
		if err := c.PostSend(fence); err != nil {
			return err
		}
		for got := 0; got < 2; {
			k, err := c.SendCQ().Poll(ctx, wc[:2-got])
			if err != nil {
				return err
			}
			for _, w := range wc[:k] {
				if w.Status != verbs.StatusSuccess {
					return &completionError{w}
				}
			}
			got += k
		}
		return nil
	}
	b.SetBytes(size)
	ratioLoop(b, [2]func() error{tcpBulk(b, size), rdma})
}

// completionError reports an unsuccessful completion.
type completionError struct{ c verbs.Completion }

func (e *completionError) Error() string { return "completion " + e.c.Status.String() }

// siwSegment is the ULPDU size of an FPDU that fills one 1460-byte TCP
// segment (2-byte length, ULPDU, CRC): Linux siw sends one FPDU per
// segment (drivers/infiniband/sw/siw/siw_qp_tx.c, siw_tx_hdt).
const siwSegment = 1460 - 2 - 4

// smallFPDUStream frames an RDMA Write of payload to stag as Linux siw
// does: siwSegment-byte ULPDUs, each its own FPDU (no CRC), followed by a
// Send of one byte with MSN msn that tells the receiver the Write is in
// (RFC 5040 s5.5: a Send completes after the Writes before it are
// placed).
func smallFPDUStream(stag uint32, payload []byte, msn uint32) []byte {
	var out []byte
	for off := 0; off < len(payload); {
		k := min(len(payload)-off, siwSegment-taggedHdrLen)
		out = append(out, taggedFPDU(opWrite, off+k == len(payload), stag, uint64(off), payload[off:off+k])...)
		off += k
	}
	var h [untaggedHdrLen + 1]byte
	putUntagged(h[:], true, opSend, 0, qnSend, msn, 0)
	return append(out, fpdu(h[:])...)
}

// BenchmarkRatioRecvSmallFPDU1MiB alternates receiving 1 MiB as an RDMA
// Write cut into one FPDU per TCP segment, as Linux siw sends it (a
// scripted peer writes the prepared frames), with receiving 1 MiB over
// plain TCP into one buffer. It reports the time and the process CPU
// time per transfer over TCP's: the cost of receiving small FPDUs.
//
//	go test -run '^$' -bench RatioRecvSmallFPDU1MiB ./verbs/iwarp
func BenchmarkRatioRecvSmallFPDU1MiB(b *testing.B) {
	const size = 1 << 20
	ctx := testCtx(b)
	qp, peer := newScriptPeer(b, nil)
	dst := reg(b, qp.PD(), make([]byte, size), verbs.AccessRemoteWrite)
	rwr, err := recvWR(qp.PD(), 0, make([]byte, 16))
	if err != nil {
		b.Fatal(err)
	}
	if err := qp.PostRecv(rwr); err != nil {
		b.Fatal(err)
	}
	// Prepared once; each transfer patches the Send's MSN (there is
	// no CRC to recompute).
	st := smallFPDUStream(dst.STag(), randBytes(size, 3), 1)
	msnAt := len(st) - len(fpdu(make([]byte, untaggedHdrLen+1))) + 2 + 10
	msn := uint32(1)
	var wc [1]verbs.Completion
	rdma := func() error {
		binary.BigEndian.PutUint32(st[msnAt:], msn)
		msn++
		werr := make(chan error, 1)
		go func() { werr <- peer.write(st) }()
		if _, err := qp.RecvCQ().Poll(ctx, wc[:]); err != nil {
			return err
		}
		if wc[0].Status != verbs.StatusSuccess {
			return &completionError{wc[0]}
		}
		if err := qp.PostRecv(rwr); err != nil {
			return err
		}
		return <-werr
	}

	tc, ts := tcpPair(b)
	tsrc, tdst := randBytes(size, 1), make([]byte, size)
	tcp := func() error {
		werr := make(chan error, 1)
		go func() {
			_, err := ts.Write(tsrc)
			werr <- err
		}()
		if _, err := io.ReadFull(tc, tdst); err != nil {
			return err
		}
		return <-werr
	}
	b.SetBytes(size)
	ratioLoop(b, [2]func() error{tcp, rdma})
}

// replayReader returns stream n times, then io.EOF.
type replayReader struct {
	stream []byte
	off, n int
}

func (r *replayReader) Read(p []byte) (int, error) {
	if r.off == len(r.stream) {
		if r.n == 0 {
			return 0, io.EOF
		}
		r.n--
		r.off = 0
	}
	k := copy(p, r.stream[r.off:])
	r.off += k
	return k, nil
}

// BenchmarkReceiveSmallFPDUs is the receive path's own cost for a 1 MiB
// RDMA Write in one FPDU per TCP segment (as BenchmarkRatioRecvSmallFPDU1MiB),
// without the socket: the frames come from memory.
//
//	go test -run '^$' -bench ReceiveSmallFPDUs ./verbs/iwarp
func BenchmarkReceiveSmallFPDUs(b *testing.B) {
	const size = 1 << 20
	pd := NewProtectionDomain()
	dst := reg(b, pd, make([]byte, size), verbs.AccessRemoteWrite)
	var st []byte
	for off := 0; off < size; {
		k := min(size-off, siwSegment-taggedHdrLen)
		st = append(st, taggedFPDU(opWrite, off+k == size, dst.STag(), uint64(off), make([]byte, k))...)
		off += k
	}
	b.SetBytes(size)
	b.ReportAllocs()
	b.ResetTimer()
	q := &QP{br: bufio.NewReaderSize(&replayReader{stream: st, off: len(st), n: b.N}, readerSize), pd: TableOf(pd),
		scq: verbs.NewSoftCQ(), rcq: verbs.NewSoftCQ()}
	q.cond.L = &q.mu
	if err := q.receive(&rxState{sendMSN: 1, readMSN: 1}); !errors.Is(err, io.EOF) {
		b.Fatalf("receive: %v, want the end of the frames", err)
	}
	if p, _ := dst.Placed(); p != size {
		b.Fatalf("%d bytes placed, want %d", p, size)
	}
}
