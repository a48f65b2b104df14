package iwarp

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/verbs"
)

// waitHandoff waits until the receiving goroutine has left the rest of an
// inline Read Response to the responder goroutine.
func waitHandoff(ctx context.Context, t *testing.T, qp *QP) {
	t.Helper()
	for qp.respHandoffs.Load() == 0 {
		if ctx.Err() != nil {
			t.Fatalf("no inline Read Response was handed to the responder (queue pair: %v)", qp.Err())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLargeReadInlineHandoff: a large RDMA Read that arrives when the
// responder is idle is answered by the receiving goroutine until the
// socket is full (the peer does not read yet); the responder goroutine
// writes the rest. Reads queued behind it, and a Send posted meanwhile,
// go out after or between its segments: every response is whole, with
// the region's bytes, in request order (RFC 5040 s5).
func TestLargeReadInlineHandoff(t *testing.T) {
	ctx := testCtx(t)
	pd := NewProtectionDomain()
	qp, peer := newScriptPeer(t, scriptParams(pd, 0, 0))
	if err := qp.conn.(*net.TCPConn).SetWriteBuffer(4096); err != nil {
		t.Fatal(err)
	}
	const big = 2 << 20
	data := randBytes(big, 11)
	src := reg(t, pd, data, verbs.AccessRemoteRead)
	reads := []readRequest{
		{sinkSTag: 0x91, size: big, srcSTag: src.STag()},
		{sinkSTag: 0x92, srcSTag: 0x1234}, // zero-length: no region
		{sinkSTag: 0x93, sinkTO: 7, size: 4096, srcSTag: src.STag(), srcTO: 100},
		{sinkSTag: 0x94, size: big - 1, srcSTag: src.STag(), srcTO: 1},
	}
	peer.mustWrite(peer.readRequestFPDU(reads[0]))
	waitHandoff(ctx, t, qp)
	var batch []byte
	for _, rr := range reads[1:] {
		batch = append(batch, peer.readRequestFPDU(rr)...)
	}
	peer.mustWrite(batch)
	send := []byte("between the segments")
	if err := qp.PostSend(verbs.SendWR{WRID: 5, Opcode: verbs.OpSend, SGL: gather(t, pd, send)}); err != nil {
		t.Fatal(err)
	}
	sends := 0
	for i, rr := range reads {
		off := 0
		for {
			h, payload, err := peer.next()
			if err != nil {
				t.Fatalf("read %d at %d: %v (queue pair: %v)", i, off, err, qp.Err())
			}
			if !h.tagged() {
				if h.opcode() != opSend || !bytes.Equal(payload, send) {
					t.Fatalf("unexpected untagged FPDU %+v", h)
				}
				sends++
				continue
			}
			if h.opcode() != opReadResp || h.stag != rr.sinkSTag || h.to != rr.sinkTO+uint64(off) {
				t.Fatalf("read %d at %d: FPDU %+v", i, off, h)
			}
			want := data[rr.srcTO+uint64(off) : rr.srcTO+uint64(off+len(payload))]
			if rr.size == 0 {
				want = nil
			}
			if !bytes.Equal(payload, want) {
				t.Fatalf("read %d: wrong bytes at %d", i, off)
			}
			off += len(payload)
			if h.last() {
				break
			}
		}
		if off != int(rr.size) {
			t.Fatalf("read %d: %d bytes, want %d", i, off, rr.size)
		}
	}
	if sends == 0 {
		h, payload, err := peer.next()
		if err != nil || h.tagged() || h.opcode() != opSend || !bytes.Equal(payload, send) {
			t.Fatalf("after the responses: FPDU %+v: %v", h, err)
		}
	}
	if wc := pollOne(t, qp.SendCQ()); wc.WRID != 5 || wc.Status != verbs.StatusSuccess {
		t.Fatalf("Send completion %+v", wc)
	}
	if qp.Err() != nil {
		t.Fatal(qp.Err())
	}
	// Every access has ended: the region can be deregistered.
	if err := src.Deregister(); err != nil {
		t.Fatalf("deregister after the responses: %v", err)
	}
}

// TestCrossedLargeReads: two queue pairs RDMA-Read 1 MiB from each other
// at the same time, several reads deep, through small socket buffers.
// Each answers the other's requests from its receiving goroutine while
// its socket takes them and leaves the rest to its responder goroutine:
// neither receiving goroutine waits for its socket, so the two never wait
// for each other, and every read gets the other side's bytes.
func TestCrossedLargeReads(t *testing.T) {
	ctx := testCtx(t)
	c, s := pair(t, nil, nil)
	qps := []*QP{c, s}
	const size, rounds = 1 << 20, 8
	var srcs [2]*verbs.MemoryRegion
	var data [2][]byte
	for i, qp := range qps {
		if err := qp.conn.(*net.TCPConn).SetWriteBuffer(8 << 10); err != nil {
			t.Fatal(err)
		}
		data[i] = randBytes(size, uint64(20+i))
		srcs[i] = reg(t, qp.PD(), data[i], verbs.AccessRemoteRead)
	}
	errs := make(chan error, 2)
	for i, qp := range qps {
		peer := srcs[1-i]
		want := data[1-i]
		go func() {
			depth := min(qp.ORD(), 4)
			sinks := make([][]byte, depth)
			mrs := make([]*verbs.MemoryRegion, depth)
			for j := range sinks {
				sinks[j] = make([]byte, size)
				mr, err := qp.PD().RegisterMemory(sinks[j], verbs.AccessLocalWrite)
				if err != nil {
					errs <- err
					return
				}
				mrs[j] = mr
			}
			post := func(n int) error {
				j := n % depth
				return qp.PostSend(verbs.SendWR{WRID: uint64(n), Opcode: verbs.OpRDMARead, Length: size,
					SGL: []verbs.SGE{{MR: mrs[j], Length: size}}, RemoteSTag: peer.STag()})
			}
			for n := range depth {
				if err := post(n); err != nil {
					errs <- err
					return
				}
			}
			var wc [1]verbs.Completion
			for n := range rounds {
				if _, err := qp.SendCQ().Poll(ctx, wc[:]); err != nil {
					errs <- err
					return
				}
				if wc[0].Status != verbs.StatusSuccess || wc[0].WRID != uint64(n) {
					errs <- fmt.Errorf("completion %+v, want read %d", wc[0], n)
					return
				}
				if !bytes.Equal(sinks[n%depth], want) {
					errs <- fmt.Errorf("read %d: wrong bytes", n)
					return
				}
				clear(sinks[n%depth])
				if n+depth < rounds {
					if err := post(n + depth); err != nil {
						errs <- err
						return
					}
				}
			}
			errs <- nil
		}()
	}
	for range qps {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, qp := range qps {
		if qp.Err() != nil {
			t.Fatal(qp.Err())
		}
	}
	t.Logf("inline responses finished by the responder: %d, %d", c.respHandoffs.Load(), s.respHandoffs.Load())
}
