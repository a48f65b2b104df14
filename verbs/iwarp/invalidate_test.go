package iwarp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

// TestInvalidateStopsStalledPlacement: a peer stalls in the middle of a
// tagged segment (an RDMA Write into an exposed window, or a Read
// Response into a read's sink); the local invalidation of the region
// returns without waiting for the peer, and when the peer goes on, the
// rest of the payload does not land: the queue pair terminates with a DDP
// tagged buffer Invalid STag error (RFC 5040 s7, RFC 8166 s8.1.3) and the
// stopped placement is not counted as placed. Payloads below and above
// directMin cover the buffered and the direct receive path.
func TestInvalidateStopsStalledPlacement(t *testing.T) {
	for _, tc := range []struct {
		write bool
		size  int
	}{{true, 4096}, {true, 60000}, {false, 4096}, {false, 60000}} {
		name := fmt.Sprintf("read response %d", tc.size)
		if tc.write {
			name = fmt.Sprintf("write %d", tc.size)
		}
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			pd := NewProtectionDomain()
			var sc *starveConn
			qp, peer := newScriptPeerConn(t, scriptParams(pd, 0, 0), func(c net.Conn) net.Conn {
				var err error
				if sc, err = newStarveConn(c); err != nil {
					t.Error(err)
					return c
				}
				return sc
			})
			if sc == nil {
				t.FailNow()
			}
			const guard = 4096
			parentBuf := make([]byte, guard+tc.size+guard)
			fillGuard(parentBuf)
			parent := reg(t, pd, parentBuf, verbs.AccessLocalWrite)
			// The region the peer places into: a fast-registered
			// window for a Write, the registered sink of an RDMA
			// Read we post.
			var target *verbs.MemoryRegion
			var stag uint32
			var to uint64
			if tc.write {
				fr, err := pd.AllocFastReg()
				if err != nil {
					t.Fatal(err)
				}
				if stag, err = fr.FastRegister(parent, guard, tc.size, verbs.AccessRemoteWrite); err != nil {
					t.Fatal(err)
				}
				target = fr
			} else {
				target, stag, to = parent, parent.STag(), guard
				err := qp.PostSend(verbs.SendWR{WRID: 7, Opcode: verbs.OpRDMARead, Length: uint32(tc.size),
					SGL: []verbs.SGE{{MR: parent, Offset: guard, Length: uint32(tc.size)}}, RemoteSTag: 0x1234})
				if err != nil {
					t.Fatal(err)
				}
				h, b, err := peer.next()
				if err != nil || h.tagged() || h.opcode() != opReadReq {
					t.Fatalf("expected our Read Request, got %+v: %v", h, err)
				}
				if rr, _ := parseReadRequest(b); rr.sinkSTag != stag || rr.sinkTO != to || rr.size != uint32(tc.size) {
					t.Fatalf("Read Request %+v", rr)
				}
			}
			op := byte(opWrite)
			if !tc.write {
				op = opReadResp
			}
			payload := bytes.Repeat([]byte{0x77}, tc.size)
			frame := taggedFPDU(op, true, stag, to, payload)
			const sent = 1000 // payload bytes before the stall
			cut := 2 + taggedHdrLen + sent
			peer.mustWrite(frame[:cut])
			// The queue pair has read all we sent and waits for
			// the rest of the payload: the placement is under way.
			sc.waitStarved(ctx, t, peer.conn)
			// The invalidation must not wait for the stalled peer.
			if err := target.InvalidateContext(ctx); err != nil {
				t.Fatalf("invalidate during a stalled placement: %v", err)
			}
			_ = peer.write(frame[cut:]) // the late bytes
			term, err := peer.terminate(nil)
			if err != nil {
				t.Fatal(err)
			}
			if term.Layer != LayerDDP || term.EType != DDPEtypeTaggedBuf || term.Code != DDPCodeTInvalidSTag {
				t.Fatalf("peer received %v, want DDP tagged Invalid STag", &term)
			}
			if h := term.DDPHeader; len(h) != taggedHdrLen || binary.BigEndian.Uint32(h[2:]) != stag {
				t.Fatalf("Terminate names DDP header %x, want STag %#x", h, stag)
			}
			peer.conn.Close() // as a peer does after a Terminate
			var te *TerminateError
			if !errors.As(qp.Err(), &te) || !te.Sent || !errors.Is(te, verbs.ErrInvalidSTag) {
				t.Fatalf("queue pair error %v, want a Terminate we sent for the invalidated STag", qp.Err())
			}
			if !tc.write {
				if wc := pollOne(t, qp.SendCQ()); wc.WRID != 7 || wc.Status == verbs.StatusSuccess {
					t.Fatalf("read completion %+v, want an error", wc)
				}
			}
			qp.Close() // no goroutine can touch the memory any more
			for i, b := range parentBuf {
				if (i < guard || i >= guard+sent) && b != guardByte {
					t.Fatalf("byte %d written: only the %d bytes before the stall may land at %d", i, sent, guard)
				}
			}
			if placed, _ := target.Placed(); placed != 0 {
				t.Fatalf("the stopped placement counts %d bytes as placed", placed)
			}
		})
	}
}

// TestInvalidateStopsReadResponse: a peer asks for a 16 MiB RDMA Read and
// does not take the response. Invalidating the source region returns
// without waiting for the peer, and no byte the peer receives afterwards
// was read from the region after the invalidation (RFC 8166 s8.1.3): the
// memory is overwritten once the invalidation has returned, and the
// overwritten value never reaches the peer. The response is cut short and
// the queue pair breaks. The response is the responder goroutine's, or
// one the receiving goroutine started (respondInline) and left to it when
// the socket was full.
func TestInvalidateStopsReadResponse(t *testing.T) {
	for _, inline := range []bool{false, true} {
		name := "responder"
		if inline {
			name = "inline"
		}
		t.Run(name, func(t *testing.T) { testInvalidateStopsReadResponse(t, inline) })
	}
}

func testInvalidateStopsReadResponse(t *testing.T, inline bool) {
	ctx := testCtx(t)
	pd := NewProtectionDomain()
	var wrap func(net.Conn) net.Conn
	if !inline {
		// Without a socket to write to without blocking, the
		// receiving goroutine leaves every read to the responder.
		wrap = func(c net.Conn) net.Conn {
			// The socket takes a little of the response.
			if err := c.(*net.TCPConn).SetWriteBuffer(4096); err != nil {
				t.Error(err)
			}
			return plainConn{c}
		}
	}
	qp, peer := newScriptPeerConn(t, scriptParams(pd, 0, 0), wrap)
	if inline {
		// The socket takes a little of the response: the rest is
		// left to the responder goroutine.
		if err := qp.conn.(*net.TCPConn).SetWriteBuffer(4096); err != nil {
			t.Fatal(err)
		}
	}
	const size = 16 << 20
	const before, after = 0x11, 0xbb
	src := bytes.Repeat([]byte{before}, size)
	parent := reg(t, pd, src, verbs.AccessLocalWrite)
	fr, err := pd.AllocFastReg()
	if err != nil {
		t.Fatal(err)
	}
	stag, err := fr.FastRegister(parent, 0, size, verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	peer.mustWrite(peer.readRequestFPDU(readRequest{sinkSTag: 0x4200, size: size, srcSTag: stag}))
	if inline {
		waitHandoff(ctx, t, qp)
	} else {
		// The first byte of the response is in: the responder is
		// in the middle of it.
		peer.awaitData(ctx, "the response did not start")
	}
	if err := fr.InvalidateContext(ctx); err != nil {
		t.Fatalf("invalidate during a Read Response: %v", err)
	}
	for i := range src {
		src[i] = after // races with any read of the region after the invalidation
	}
	got := 0
	term, err := peer.terminate(func(h ddpHeader, b []byte) {
		if !h.tagged() || h.opcode() != opReadResp || h.stag != 0x4200 || h.to != uint64(got) {
			t.Fatalf("unexpected FPDU %+v at response offset %d", h, got)
		}
		if i := bytes.IndexByte(b, after); i >= 0 {
			t.Fatalf("response byte %d was read after the invalidation", got+i)
		}
		got += len(b)
	})
	if err == nil {
		// Stopped between two segments: the peer is told why.
		if term.Layer != LayerRDMAP || term.EType != RDMAPEtypeRemoteProtection || term.Code != RDMAPCodeInvalidSTag || len(term.ReadRequest) != readReqLen {
			t.Fatalf("peer received %v, want RDMAP remote protection Invalid STag with the Read Request", &term)
		}
	} // else stopped inside a segment: the stream just ends.
	if got >= size {
		t.Fatalf("the whole %d-byte response went out", got)
	}
	<-qp.Done()
	t.Logf("%d bytes of the response sent before the invalidation; queue pair: %v", got, qp.Err())
}

// TestInboundReadsBoundedByIRD: a peer that sends more RDMA Read Requests
// than the negotiated IRD while the responder is busy gets a Terminate
// naming the excess request (RFC 5040 s5.2, RFC 6581): the queue of
// inbound reads never grows past IRD.
func TestInboundReadsBoundedByIRD(t *testing.T) {
	pd := NewProtectionDomain()
	const ird = 2
	// The responder is stuck in the first read's response: it is
	// larger than the sockets hold, and we do not take it yet.
	qp, peer := newScriptPeerConn(t, scriptParams(pd, ird, 0), func(c net.Conn) net.Conn {
		if err := c.(*net.TCPConn).SetWriteBuffer(4096); err != nil {
			t.Error(err)
		}
		return plainConn{c}
	})
	if qp.IRD() != ird {
		t.Fatalf("IRD %d", qp.IRD())
	}
	const big = 16 << 20
	src := reg(t, pd, make([]byte, big), verbs.AccessRemoteRead)
	for i := range ird + 1 {
		size := uint32(4096)
		if i == 0 {
			size = big
		}
		peer.mustWrite(peer.readRequestFPDU(readRequest{sinkSTag: 0x4200, sinkTO: uint64(i), size: size, srcSTag: src.STag()}))
		if i == 0 {
			peer.awaitData(testCtx(t), "the first read was not served")
		}
	}
	term, err := peer.terminate(nil)
	if err != nil {
		t.Fatal(err)
	}
	if term.Layer != LayerRDMAP || term.EType != RDMAPEtypeRemoteOperation || term.Code != RDMAPCodeCatastrophicStrm {
		t.Fatalf("peer received %v", &term)
	}
	if rr, err := parseReadRequest(term.ReadRequest); err != nil || rr.sinkTO != ird {
		t.Fatalf("Terminate names Read Request %+v (%v), want the one past IRD", rr, err)
	}
	if m := qp.maxIRQ.Load(); m > ird {
		t.Fatalf("%d inbound reads queued, IRD %d", m, ird)
	}
}

// TestSendQueueBounded: with the peer not answering, posted work requests
// pile up in the send queue only up to its depth; a further post fails
// with ErrQueueFull, and posting works again once a request completes.
// The queue pair stays usable throughout.
func TestSendQueueBounded(t *testing.T) {
	pd := NewProtectionDomain()
	qp, peer := newScriptPeer(t, scriptParams(pd, 0, 1))
	sinkBuf := make([]byte, sendQueueDepth)
	sink := reg(t, pd, sinkBuf, verbs.AccessLocalWrite)
	read := func(i int) verbs.SendWR {
		return verbs.SendWR{WRID: uint64(i), Opcode: verbs.OpRDMARead, Length: 1,
			SGL: []verbs.SGE{{MR: sink, Offset: uint64(i % sendQueueDepth), Length: 1}}, RemoteSTag: 0x1234}
	}
	// ORD 1: the first read goes out; the peer does not answer, and the
	// others wait in the send queue.
	for i := range sendQueueDepth {
		if err := qp.PostSend(read(i)); err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
	}
	send := verbs.SendWR{WRID: 1 << 20, Opcode: verbs.OpSend}
	for _, wr := range []verbs.SendWR{read(sendQueueDepth), send} {
		if err := qp.PostSend(wr); !errors.Is(err, verbs.ErrQueueFull) {
			t.Fatalf("post %v past the queue depth: %v, want ErrQueueFull", wr.Opcode, err)
		}
	}
	h, b, err := peer.next()
	if err != nil || h.opcode() != opReadReq {
		t.Fatalf("expected the first Read Request: %+v %v", h, err)
	}
	rr, _ := parseReadRequest(b)
	peer.mustWrite(taggedFPDU(opReadResp, true, rr.sinkSTag, rr.sinkTO, []byte{9}))
	expect(t, pollOne(t, qp.SendCQ()), 0, verbs.StatusSuccess, verbs.OpRDMARead)
	if err := qp.PostSend(send); err != nil {
		t.Fatalf("post after a completion: %v", err)
	}
	if qp.Err() != nil {
		t.Fatal(qp.Err())
	}
	qp.Close()
	wcs := pollN(t, qp.SendCQ(), sendQueueDepth)
	for i, wc := range wcs[:sendQueueDepth-1] {
		expect(t, wc, uint64(i+1), verbs.StatusFlushed, verbs.OpRDMARead)
	}
	if wc := wcs[sendQueueDepth-1]; wc.WRID != send.WRID || wc.Status != verbs.StatusFlushed {
		t.Fatalf("last completion %+v", wc)
	}
	if sinkBuf[0] != 9 {
		t.Fatalf("read data %d", sinkBuf[0])
	}
}
