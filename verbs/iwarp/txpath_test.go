package iwarp

import (
	"bufio"
	"bytes"
	"net"
	"runtime"
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

// TestPostDirectHandoff: an RDMA Write posted on an idle queue pair goes
// out from the poster's goroutine; the socket takes only part of it (the
// peer does not read yet), and the tx goroutine writes the rest. Sends
// posted meanwhile queue behind it. The peer receives every FPDU intact
// and in posting order, and the completions come in posting order.
func TestPostDirectHandoff(t *testing.T) {
	pd := NewProtectionDomain()
	sp := scriptParams(pd, 0, 0)
	sp.Setup = func(qp verbs.QueuePair) error {
		// A small send buffer: the direct write cannot finish.
		return qp.(*QP).conn.(*net.TCPConn).SetWriteBuffer(8 << 10)
	}
	qp, peer := newScriptPeer(t, sp)
	const size = maxBatch * (defaultMaxULPDU - taggedHdrLen) // the largest direct post
	data := randBytes(size, 7)
	if err := qp.PostSend(verbs.SendWR{WRID: 1, Opcode: verbs.OpRDMAWrite, SGL: gather(t, pd, data), RemoteSTag: 0x4200, RemoteOffset: 64}); err != nil {
		t.Fatal(err)
	}
	if n := qp.handoffs.Load(); n != 1 {
		t.Fatalf("%d hand-offs after a %d-byte post to a peer that does not read, want 1", n, size)
	}
	const sends = 5
	for i := range sends {
		msg := []byte{byte(i), 'm', 's', 'g'}
		if err := qp.PostSend(verbs.SendWR{WRID: uint64(2 + i), Opcode: verbs.OpSend, SGL: gather(t, pd, msg)}); err != nil {
			t.Fatal(err)
		}
	}
	var got []byte
	for len(got) < size {
		h, b, err := peer.next()
		if err != nil {
			t.Fatalf("after %d bytes of the Write: %v", len(got), err)
		}
		if !h.tagged() || h.opcode() != opWrite || h.stag != 0x4200 || h.to != 64+uint64(len(got)) {
			t.Fatalf("FPDU %+v at Write offset %d", h, len(got))
		}
		got = append(got, b...)
		if h.last() != (len(got) == size) {
			t.Fatalf("last flag %v at %d of %d bytes", h.last(), len(got), size)
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the Write's payload arrived changed")
	}
	for i := range sends {
		h, b, err := peer.next()
		if err != nil {
			t.Fatal(err)
		}
		if h.tagged() || h.opcode() != opSend || h.msn != uint32(1+i) || !bytes.Equal(b, []byte{byte(i), 'm', 's', 'g'}) {
			t.Fatalf("Send %d: %+v %q", i, h, b)
		}
	}
	wcs := pollN(t, qp.SendCQ(), 1+sends)
	expect(t, wcs[0], 1, verbs.StatusSuccess, verbs.OpRDMAWrite)
	if wcs[0].ByteLen != size {
		t.Fatalf("Write completion of %d bytes, want %d", wcs[0].ByteLen, size)
	}
	for i, wc := range wcs[1:] {
		expect(t, wc, uint64(2+i), verbs.StatusSuccess, verbs.OpSend)
	}
	if qp.Err() != nil {
		t.Fatal(qp.Err())
	}
}

// TestReceiveHeaderPrefetchSplits: after a large RDMA Write (read
// straight into place), the receiver takes whatever of the next FPDU's
// header has arrived with the Write's trailer. The next FPDU, a Send and
// then another large Write, arrives cut at every point of its header; each
// is placed and completed exactly once.
func TestReceiveHeaderPrefetchSplits(t *testing.T) {
	pd := NewProtectionDomain()
	qp, peer := newScriptPeer(t, scriptParams(pd, 0, 0))
	const big = directMin
	region := make([]byte, 2*big)
	mr := reg(t, pd, region, verbs.AccessRemoteWrite)
	var h [untaggedHdrLen]byte
	sendFPDU := func(msn uint32, payload ...byte) []byte {
		n := putUntagged(h[:], true, opSend, 0, qnSend, msn, 0)
		return fpdu(append(h[:n:n], payload...))
	}
	for cut := 0; cut <= 2+untaggedHdrLen+4; cut++ {
		rbuf, done := make([]byte, 8), make([]byte, 8)
		if err := postRecv(qp, uint64(2*cut), rbuf); err != nil {
			t.Fatal(err)
		}
		if err := postRecv(qp, uint64(2*cut+1), done); err != nil {
			t.Fatal(err)
		}
		w1 := randBytes(big, uint64(2*cut))
		w2 := randBytes(big, uint64(2*cut+1))
		send := sendFPDU(uint32(2*cut+1), 'c', 'u', 't', byte(cut))
		first := append(taggedFPDU(opWrite, true, mr.STag(), 0, w1), send[:cut]...)
		rest := append(send[cut:], taggedFPDU(opWrite, true, mr.STag(), big, w2)...)
		// A second Send after the second Write: its completion shows
		// the Write placed (RFC 5040 s5.5: in order).
		rest = append(rest, sendFPDU(uint32(2*cut+2), 'e', 'n', 'd')...)
		peer.mustWrite(first)
		peer.mustWrite(rest)
		wc := pollOne(t, qp.RecvCQ())
		expect(t, wc, uint64(2*cut), verbs.StatusSuccess, verbs.OpRecv)
		if wc.ByteLen != 4 || !bytes.Equal(rbuf[:4], []byte{'c', 'u', 't', byte(cut)}) {
			t.Fatalf("cut %d: received %q (%d bytes)", cut, rbuf[:wc.ByteLen], wc.ByteLen)
		}
		wc = pollOne(t, qp.RecvCQ())
		expect(t, wc, uint64(2*cut+1), verbs.StatusSuccess, verbs.OpRecv)
		if wc.ByteLen != 3 || string(done[:3]) != "end" {
			t.Fatalf("cut %d: second Send %q (%d bytes)", cut, done[:wc.ByteLen], wc.ByteLen)
		}
		if !bytes.Equal(region[:big], w1) || !bytes.Equal(region[big:], w2) {
			t.Fatalf("cut %d: Write payloads not in place", cut)
		}
		if qp.Err() != nil {
			t.Fatalf("cut %d: %v", cut, qp.Err())
		}
	}
}

// TestPostDoesNotWaitForStalledResponse: while the responder is stuck
// writing a Read Response the peer does not take, a post returns at once
// (the tx goroutine sends the work request later) instead of waiting for
// the writer. Once the peer reads, the Send arrives, whole and once.
func TestPostDoesNotWaitForStalledResponse(t *testing.T) {
	ctx := testCtx(t)
	pd := NewProtectionDomain()
	qp, peer := newScriptPeer(t, scriptParams(pd, 0, 0))
	const size = 16 << 20 // more than the socket buffers hold
	src := reg(t, pd, make([]byte, size), verbs.AccessRemoteRead)
	peer.mustWrite(peer.readRequestFPDU(readRequest{sinkSTag: 0x4200, size: size, srcSTag: src.STag()}))
	// Wait until the responder holds the writer (it soon stays in a
	// write the peer does not take).
	for qp.w.mu.TryLock() {
		qp.w.mu.Unlock()
		select {
		case <-ctx.Done():
			t.Fatal("the responder did not start")
		default:
			runtime.Gosched()
		}
	}
	posted := make(chan error, 1)
	go func() {
		posted <- qp.PostSend(verbs.SendWR{WRID: 1, Opcode: verbs.OpSend, SGL: gather(t, pd, []byte("after"))})
	}()
	select {
	case err := <-posted:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("PostSend waited for the stalled Read Response")
	}
	// The Send may go out between two batches of the response (they
	// are independent messages): each arrives whole, once.
	got, sends := 0, 0
	for got < size || sends == 0 {
		h, b, err := peer.next()
		if err != nil {
			t.Fatalf("after %d bytes of the response and %d Sends: %v", got, sends, err)
		}
		if !h.tagged() {
			if h.opcode() != opSend || string(b) != "after" || sends > 0 {
				t.Fatalf("untagged FPDU %+v %q (Sends so far %d)", h, b, sends)
			}
			sends++
			continue
		}
		if h.opcode() != opReadResp || h.to != uint64(got) {
			t.Fatalf("FPDU %+v at response offset %d", h, got)
		}
		got += len(b)
	}
	expect(t, pollOne(t, qp.SendCQ()), 1, verbs.StatusSuccess, verbs.OpSend)
}

// TestZeroLengthReadsInOrder: zero-length Read Requests are answered by
// the receiving goroutine when the writer is free and by the responder
// otherwise (respondInline); either way every request gets one response,
// in request order (RFC 5040 s5.2), while the queue pair streams RDMA
// Writes through a small send buffer that the peer drains slowly, so the
// writer is often busy or the socket full.
func TestZeroLengthReadsInOrder(t *testing.T) {
	ctx := testCtx(t)
	pd := NewProtectionDomain()
	qp, peer := newScriptPeer(t, scriptParams(pd, 0, 0))
	if err := qp.conn.(*net.TCPConn).SetWriteBuffer(4096); err != nil {
		t.Fatal(err)
	}
	src := gather(t, pd, randBytes(32<<10, 9))
	const writes = 64
	posted := make(chan error, 1)
	go func() {
		var wc [8]verbs.Completion
		inflight := 0
		for i := range writes {
			if err := qp.PostSend(verbs.SendWR{WRID: uint64(i), Opcode: verbs.OpRDMAWrite, SGL: src, RemoteSTag: 0x77}); err != nil {
				posted <- err
				return
			}
			if inflight++; inflight == len(wc) {
				k, err := qp.SendCQ().Poll(ctx, wc[:])
				if err != nil {
					posted <- err
					return
				}
				inflight -= k
			}
		}
		posted <- nil
	}()
	const rounds, depth = 100, 16 // depth: the queue pair's IRD
	var batch []byte
	next := uint64(0)
	written := 0
	for r := range rounds {
		batch = batch[:0]
		for i := range depth {
			rr := readRequest{sinkSTag: 0x99, sinkTO: uint64(r*depth + i), srcSTag: 0x1234}
			batch = append(batch, peer.readRequestFPDU(rr)...)
		}
		peer.mustWrite(batch)
		for got := 0; got < depth; {
			h, payload, err := peer.next()
			if err != nil {
				t.Fatalf("round %d: %v (queue pair: %v)", r, err, qp.Err())
			}
			switch {
			case h.tagged() && h.opcode() == opWrite:
				written += len(payload)
			case h.tagged() && h.opcode() == opReadResp:
				if h.stag != 0x99 || h.to != next || !h.last() || len(payload) != 0 {
					t.Fatalf("Read Response %+v with %d bytes, want the last segment of read %d", h, len(payload), next)
				}
				next++
				got++
			default:
				t.Fatalf("unexpected FPDU %+v", h)
			}
		}
	}
	for written < writes*(32<<10) {
		h, payload, err := peer.next()
		if err != nil || !h.tagged() || h.opcode() != opWrite {
			t.Fatalf("after %d Write bytes: FPDU %+v: %v", written, h, err)
		}
		written += len(payload)
	}
	if err := <-posted; err != nil {
		t.Fatal(err)
	}
	if qp.Err() != nil {
		t.Fatal(qp.Err())
	}
}

// TestFPDUsBufferedWithMPAFrame: FPDUs that arrive with the MPA Request,
// in the same segment, are read by the MPA exchange's reader; the receive
// loop takes them from it before it moves to its large reader. A Send
// that follows later arrives too.
func TestFPDUsBufferedWithMPAFrame(t *testing.T) {
	ctx := testCtx(t)
	bufs := [2][]byte{make([]byte, 64), make([]byte, 64)}
	ln, err := Listen("127.0.0.1:0", &verbs.ConnParams{Setup: func(qp verbs.QueuePair) error {
		for i, b := range bufs {
			if err := postRecv(qp, uint64(i), b); err != nil {
				return err
			}
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	send := func(msn uint32, text string) []byte {
		var h [untaggedHdrLen]byte
		n := putUntagged(h[:], true, opSend, 0, qnSend, msn, 0)
		return fpdu(append(h[:n:n], text...))
	}
	req := mpaFrame{flags: mpaFlagEnhanced, rev: 2, pdata: enhancedPData(16, 16, nil)}
	if _, err := conn.Write(append(req.marshal(), send(1, "with the request")...)); err != nil {
		t.Fatal(err)
	}
	qp, err := ln.AcceptQP(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	if rep, err := readMPAFrame(bufio.NewReader(conn)); err != nil || !rep.reply || rep.flags&mpaFlagReject != 0 {
		t.Fatalf("MPA reply %+v: %v", rep, err)
	}
	if _, err := conn.Write(send(2, "later")); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"with the request", "later"} {
		wc := pollOne(t, qp.RecvCQ())
		expect(t, wc, uint64(i), verbs.StatusSuccess, verbs.OpRecv)
		if got := string(bufs[i][:wc.ByteLen]); got != want {
			t.Fatalf("Send %d: %q, want %q", i, got, want)
		}
	}
}
