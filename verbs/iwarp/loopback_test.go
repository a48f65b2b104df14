package iwarp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

func TestSendRecvSizes(t *testing.T) {
	sizes := []int{0, 1, 3, 17, 4096, 65535 - untaggedHdrLen, 65536, 3*65536 + 5, 1 << 20}
	for _, crc := range []bool{false, true} {
		for _, seg := range []int{0, 100} {
			t.Run(fmt.Sprintf("crc=%v/seg=%d", crc, seg), func(t *testing.T) {
				c, s := pair(t, &verbs.ConnParams{CRC: crc, MaxSegment: seg}, &verbs.ConnParams{MaxSegment: seg})
				for i, n := range sizes {
					if seg != 0 && n > 70000 {
						continue
					}
					msg := randBytes(n, uint64(i))
					buf := make([]byte, n+7)
					if err := postRecv(s, uint64(100+i), buf); err != nil {
						t.Fatal(err)
					}
					// One region, three SGEs by offset; the middle one is empty.
					mmr := reg(t, c.PD(), msg, 0)
					sgl := []verbs.SGE{{MR: mmr, Length: uint32(n / 3)}, {MR: mmr, Offset: uint64(n / 3)}, {MR: mmr, Offset: uint64(n / 3), Length: uint32(n - n/3)}}
					if err := c.PostSend(verbs.SendWR{WRID: uint64(i), Opcode: verbs.OpSend, SGL: sgl}); err != nil {
						t.Fatal(err)
					}
					expect(t, pollOne(t, c.SendCQ()), uint64(i), verbs.StatusSuccess, verbs.OpSend)
					rc := pollOne(t, s.RecvCQ())
					expect(t, rc, uint64(100+i), verbs.StatusSuccess, verbs.OpRecv)
					if int(rc.ByteLen) != n {
						t.Fatalf("size %d: ByteLen %d", n, rc.ByteLen)
					}
					mustEqual(t, buf[:n], msg)
				}
			})
		}
	}
}

func TestSendWithInvalidate(t *testing.T) {
	c, s := pair(t, nil, nil)
	region := make([]byte, 4096)
	mr, err := s.PD().RegisterMemory(region, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.PD().LiveRemoteRegions(); n != 1 {
		t.Fatalf("live remote regions %d", n)
	}
	buf := make([]byte, 64)
	postRecv(s, 7, buf)
	for _, solicited := range []bool{false} {
		c.PostSend(verbs.SendWR{WRID: 1, Opcode: verbs.OpSendWithInvalidate, InvalidateSTag: mr.STag(), Solicited: solicited, SGL: gather(t, c.PD(), []byte("reply"))})
	}
	expect(t, pollOne(t, c.SendCQ()), 1, verbs.StatusSuccess, verbs.OpSendWithInvalidate)
	rc := pollOne(t, s.RecvCQ())
	expect(t, rc, 7, verbs.StatusSuccess, verbs.OpRecvWithInvalidate)
	if rc.InvalidatedSTag != mr.STag() || rc.ByteLen != 5 || string(buf[:5]) != "reply" {
		t.Fatalf("completion %+v buf %q", rc, buf[:5])
	}
	if mr.Valid() || s.PD().LiveRemoteRegions() != 0 {
		t.Fatalf("region still valid after remote invalidation")
	}
	// Re-registration gives a new key; the old STag stays dead.
	old := mr.STag()
	nw, err := mr.Reregister(verbs.AccessRemoteWrite)
	if err != nil || nw == old || nw>>8 != old>>8 || s.PD().LiveRemoteRegions() != 1 {
		t.Fatalf("reregister: %#x -> %#x, %v", old, nw, err)
	}
	if _, err := TableOf(s.PD()).Resolve(old, verbs.AccessRemoteWrite, 0, 1); !errors.Is(err, verbs.ErrInvalidSTag) {
		t.Fatalf("old STag resolves: %v", err)
	}
	// Solicited variant (opcode 6).
	postRecv(s, 8, buf)
	c.PostSend(verbs.SendWR{WRID: 2, Opcode: verbs.OpSendWithInvalidate, InvalidateSTag: nw, Solicited: true, SGL: gather(t, c.PD(), []byte("x"))})
	expect(t, pollOne(t, c.SendCQ()), 2, verbs.StatusSuccess, verbs.OpSendWithInvalidate)
	rc = pollOne(t, s.RecvCQ())
	if rc.InvalidatedSTag != nw || rc.Opcode != verbs.OpRecvWithInvalidate || s.PD().LiveRemoteRegions() != 0 {
		t.Fatalf("completion %+v", rc)
	}
}

func TestRDMAWriteRead(t *testing.T) {
	sizes := []int{1, 4097, 65536*2 + 3, 1 << 20, 16 << 20}
	for _, crc := range []bool{false, true} {
		t.Run(fmt.Sprintf("crc=%v", crc), func(t *testing.T) {
			c, s := pair(t, &verbs.ConnParams{CRC: crc}, nil)
			for i, n := range sizes {
				if crc && n > 1<<20 {
					continue
				}
				const off = 13
				remote := make([]byte, n+off+5)
				rmr, err := s.PD().RegisterMemory(remote, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
				if err != nil {
					t.Fatal(err)
				}
				data := randBytes(n, uint64(i+1))
				if err := c.PostSend(verbs.SendWR{WRID: 1, Opcode: verbs.OpRDMAWrite, SGL: gather(t, c.PD(), data), RemoteSTag: rmr.STag(), RemoteOffset: off}); err != nil {
					t.Fatal(err)
				}
				expect(t, pollOne(t, c.SendCQ()), 1, verbs.StatusSuccess, verbs.OpRDMAWrite)
				// The Read after the Write returns the written data: RDMAP
				// orders them on the stream (RFC 5040 s5.5).
				sink := make([]byte, n+2)
				smr, err := c.PD().RegisterMemory(sink, verbs.AccessLocalWrite)
				if err != nil {
					t.Fatal(err)
				}
				if err := c.PostSend(verbs.SendWR{WRID: 2, Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{{MR: smr, Offset: 2, Length: uint32(n)}}, Length: uint32(n), RemoteSTag: rmr.STag(), RemoteOffset: off}); err != nil {
					t.Fatal(err)
				}
				rc := pollOne(t, c.SendCQ())
				expect(t, rc, 2, verbs.StatusSuccess, verbs.OpRDMARead)
				if rc.ByteLen != uint32(n) {
					t.Fatalf("read ByteLen %d", rc.ByteLen)
				}
				// A Send orders after the Write at the server, and its
				// receive completion publishes the placed bytes.
				postRecv(s, 3, nil)
				c.PostSend(verbs.SendWR{WRID: 3, Opcode: verbs.OpSend})
				expect(t, pollOne(t, c.SendCQ()), 3, verbs.StatusSuccess, verbs.OpSend)
				expect(t, pollOne(t, s.RecvCQ()), 3, verbs.StatusSuccess, verbs.OpRecv)
				mustEqual(t, remote[off:off+n], data)
				mustEqual(t, sink[2:], data)
				rmr.Deregister()
				smr.Deregister()
			}
			if c.Err() != nil || s.Err() != nil {
				t.Fatalf("errors: %v %v", c.Err(), s.Err())
			}
		})
	}
}

// TestManyOutstanding runs Sends, Writes and Reads in both directions at
// once and checks every completion and every byte.
func TestManyOutstanding(t *testing.T) {
	c, s := pair(t, &verbs.ConnParams{ORD: 4, IRD: 4}, &verbs.ConnParams{ORD: 3, IRD: 3})
	const n = 64
	const size = 10000
	type side struct {
		qp      *QP
		src     []byte
		srcMR   *verbs.MemoryRegion
		sink    []byte
		sinkMR  *verbs.MemoryRegion
		wsink   []byte
		wsinkMR *verbs.MemoryRegion
		recv    [][]byte
	}
	mk := func(qp *QP, seed uint64) *side {
		sd := &side{qp: qp, src: randBytes(n*size, seed), sink: make([]byte, n*size), wsink: make([]byte, n*size)}
		sd.srcMR, _ = qp.PD().RegisterMemory(sd.src, verbs.AccessRemoteRead)
		sd.sinkMR, _ = qp.PD().RegisterMemory(sd.sink, verbs.AccessLocalWrite)
		sd.wsinkMR, _ = qp.PD().RegisterMemory(sd.wsink, verbs.AccessRemoteWrite)
		for i := range n {
			b := make([]byte, size)
			sd.recv = append(sd.recv, b)
			postRecv(qp, uint64(i), b)
		}
		return sd
	}
	a, b := mk(c, 1), mk(s, 2)
	for _, p := range [][2]*side{{a, b}, {b, a}} {
		me, peer := p[0], p[1]
		for i := range n {
			chunk := []verbs.SGE{{MR: me.srcMR, Offset: uint64(i * size), Length: size}}
			me.qp.PostSend(verbs.SendWR{WRID: uint64(3 * i), Opcode: verbs.OpSend, SGL: chunk})
			me.qp.PostSend(verbs.SendWR{WRID: uint64(3*i + 1), Opcode: verbs.OpRDMAWrite, SGL: chunk, RemoteSTag: peer.wsinkMR.STag(), RemoteOffset: uint64(i * size)})
			me.qp.PostSend(verbs.SendWR{WRID: uint64(3*i + 2), Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{{MR: me.sinkMR, Offset: uint64(i * size), Length: size}}, Length: size, RemoteSTag: peer.srcMR.STag(), RemoteOffset: uint64(i * size)})
		}
	}
	// A final Send after the Writes: its receive completion at the peer
	// follows the placement of every Write (RFC 5040 s5.5 ordering).
	for _, sd := range []*side{a, b} {
		postRecv(sd.qp, n, make([]byte, 1))
	}
	for _, sd := range []*side{a, b} {
		sd.qp.PostSend(verbs.SendWR{WRID: 3 * n, Opcode: verbs.OpSend})
	}
	for _, sd := range []*side{a, b} {
		// Send queue completions come in posting order.
		for i, wc := range pollN(t, sd.qp.SendCQ(), 3*n+1) {
			if wc.WRID != uint64(i) || wc.Status != verbs.StatusSuccess {
				t.Fatalf("send completion %d: %+v", i, wc)
			}
		}
		for i, wc := range pollN(t, sd.qp.RecvCQ(), n+1) {
			if wc.WRID != uint64(i) || wc.Status != verbs.StatusSuccess || (i < n && wc.ByteLen != size) {
				t.Fatalf("recv completion %d: %+v", i, wc)
			}
		}
	}
	for _, p := range [][2]*side{{a, b}, {b, a}} {
		me, peer := p[0], p[1]
		mustEqual(t, me.sink, peer.src)
		mustEqual(t, peer.wsink, me.src)
		for i := range n {
			mustEqual(t, peer.recv[i], me.src[i*size:(i+1)*size])
		}
	}
	if c.maxReads.Load() > 4 || s.maxReads.Load() > 3 {
		t.Fatalf("reads in flight: client %d (ORD 4), server %d (ORD 3)", c.maxReads.Load(), s.maxReads.Load())
	}
}

// TestORDLimit: with ORD 2, ten posted reads never have more than two
// Read Requests outstanding, and the responder never queues more than its
// IRD.
func TestORDLimit(t *testing.T) {
	c, s := pair(t, &verbs.ConnParams{ORD: 2}, &verbs.ConnParams{IRD: 2})
	if c.ORD() != 2 {
		t.Fatalf("ORD %d", c.ORD())
	}
	src := randBytes(1<<20, 9)
	smr, _ := s.PD().RegisterMemory(src, verbs.AccessRemoteRead)
	sink := make([]byte, len(src))
	kmr, _ := c.PD().RegisterMemory(sink, verbs.AccessLocalWrite)
	const reads = 10
	part := len(src) / reads
	for i := range reads {
		c.PostSend(verbs.SendWR{WRID: uint64(i), Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{{MR: kmr, Offset: uint64(i * part), Length: uint32(part)}}, Length: uint32(part), RemoteSTag: smr.STag(), RemoteOffset: uint64(i * part)})
	}
	for i, wc := range pollN(t, c.SendCQ(), reads) {
		expect(t, wc, uint64(i), verbs.StatusSuccess, verbs.OpRDMARead)
	}
	mustEqual(t, sink[:reads*part], src[:reads*part])
	if m := c.maxReads.Load(); m < 1 || m > 2 {
		t.Fatalf("max reads in flight %d, ORD 2", m)
	}
	if m := s.maxIRQ.Load(); m > 2 {
		t.Fatalf("responder queued %d reads, IRD 2", m)
	}
}

// termOf returns the TerminateError of a broken queue pair.
func termOf(t *testing.T, qp *QP) *TerminateError {
	t.Helper()
	select {
	case <-qp.Done():
	case <-testCtx(t).Done():
		t.Fatalf("queue pair not terminated: %v", qp.Err())
	}
	var te *TerminateError
	if !errors.As(qp.Err(), &te) || !errors.Is(qp.Err(), verbs.ErrTerminated) {
		t.Fatalf("error %v, want a TerminateError", qp.Err())
	}
	return te
}

// TestTaggedAccessViolations: every inbound tagged segment is checked
// (RFC 5041 s5.3); a violation sends a Terminate with the RFC 5040 s7
// layer/type/code, breaks both queue pairs and never touches memory
// outside the region.
func TestTaggedAccessViolations(t *testing.T) {
	type setup func(mr *verbs.MemoryRegion) (stag uint32, off uint64)
	valid := func(mr *verbs.MemoryRegion) (uint32, uint64) { return mr.STag(), 0 }
	tests := []struct {
		name    string
		access  verbs.Access
		prepare setup
		op      verbs.Opcode
		layer   byte
		etype   byte
		code    byte
		status  verbs.Status // of the client's work request
	}{
		{"write invalidated", verbs.AccessRemoteWrite, func(mr *verbs.MemoryRegion) (uint32, uint64) { mr.Invalidate(); return mr.STag(), 0 },
			verbs.OpRDMAWrite, LayerDDP, DDPEtypeTaggedBuf, DDPCodeTInvalidSTag, verbs.StatusSuccess},
		{"write bad stag", verbs.AccessRemoteWrite, func(mr *verbs.MemoryRegion) (uint32, uint64) { return mr.STag() + 1, 0 },
			verbs.OpRDMAWrite, LayerDDP, DDPEtypeTaggedBuf, DDPCodeTInvalidSTag, verbs.StatusSuccess},
		{"write out of range", verbs.AccessRemoteWrite, func(mr *verbs.MemoryRegion) (uint32, uint64) { return mr.STag(), 4000 },
			verbs.OpRDMAWrite, LayerDDP, DDPEtypeTaggedBuf, DDPCodeTBaseBounds, verbs.StatusSuccess},
		{"write without rights", verbs.AccessRemoteRead, valid,
			verbs.OpRDMAWrite, LayerDDP, DDPEtypeTaggedBuf, DDPCodeTInvalidSTag, verbs.StatusSuccess},
		{"read invalidated", verbs.AccessRemoteRead, func(mr *verbs.MemoryRegion) (uint32, uint64) { mr.Invalidate(); return mr.STag(), 0 },
			verbs.OpRDMARead, LayerRDMAP, RDMAPEtypeRemoteProtection, RDMAPCodeInvalidSTag, verbs.StatusRemoteAccessErr},
		{"read bad stag", verbs.AccessRemoteRead, func(mr *verbs.MemoryRegion) (uint32, uint64) { return 0x12345678, 0 },
			verbs.OpRDMARead, LayerRDMAP, RDMAPEtypeRemoteProtection, RDMAPCodeInvalidSTag, verbs.StatusRemoteAccessErr},
		{"read out of range", verbs.AccessRemoteRead, func(mr *verbs.MemoryRegion) (uint32, uint64) { return mr.STag(), 1 << 40 },
			verbs.OpRDMARead, LayerRDMAP, RDMAPEtypeRemoteProtection, RDMAPCodeBaseBounds, verbs.StatusRemoteAccessErr},
		{"read without rights", verbs.AccessRemoteWrite, valid,
			verbs.OpRDMARead, LayerRDMAP, RDMAPEtypeRemoteProtection, RDMAPCodeAccessRights, verbs.StatusRemoteAccessErr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, s := pair(t, nil, nil)
			backing := make([]byte, 8192)
			region := backing[:4096]
			mr, _ := s.PD().RegisterMemory(region, tt.access)
			postRecv(s, 1, make([]byte, 16))
			postRecv(c, 2, make([]byte, 16))
			stag, off := tt.prepare(mr)
			data := make([]byte, 200)
			for i := range data {
				data[i] = 0xee
			}
			wr := verbs.SendWR{WRID: 10, Opcode: tt.op, RemoteSTag: stag, RemoteOffset: off}
			if tt.op == verbs.OpRDMARead {
				sink, _ := c.PD().RegisterMemory(make([]byte, 200), verbs.AccessLocalWrite)
				wr.SGL, wr.Length = []verbs.SGE{{MR: sink, Length: 200}}, 200
			} else {
				wr.SGL = gather(t, c.PD(), data)
			}
			if err := c.PostSend(wr); err != nil {
				t.Fatal(err)
			}
			wc := pollOne(t, c.SendCQ())
			expect(t, wc, 10, tt.status, tt.op)
			// The server detected the violation and sent the Terminate.
			st, rt := termOf(t, s), termOf(t, c)
			if !st.Sent || rt.Sent {
				t.Fatalf("sent flags: %v %v", st.Sent, rt.Sent)
			}
			if rt.Layer != tt.layer || rt.EType != tt.etype || rt.Code != tt.code {
				t.Fatalf("peer received %v, want layer %d etype %d code %#x (cause %v)", &rt.Terminate, tt.layer, tt.etype, tt.code, st.Cause)
			}
			if tt.op == verbs.OpRDMARead && len(rt.ReadRequest) != readReqLen {
				t.Fatalf("terminate lacks the Read Request header")
			}
			// Posted receives on both sides flush.
			expect(t, pollOne(t, s.RecvCQ()), 1, verbs.StatusFlushed, verbs.OpRecv)
			expect(t, pollOne(t, c.RecvCQ()), 2, verbs.StatusFlushed, verbs.OpRecv)
			for i, b := range backing {
				if b != 0 {
					t.Fatalf("byte %d of the region's memory was written", i)
				}
			}
			// Work requests on a broken queue pair complete as flushed.
			c.PostSend(verbs.SendWR{WRID: 11, Opcode: verbs.OpSend})
			expect(t, pollOne(t, c.SendCQ()), 11, verbs.StatusFlushed, verbs.OpSend)
			postRecv(s, 3, make([]byte, 1))
			expect(t, pollOne(t, s.RecvCQ()), 3, verbs.StatusFlushed, verbs.OpRecv)
		})
	}
}

// TestReceiveNotReady: a Send with no posted buffer is a DDP error
// (RFC 5041 s7, untagged error code 2), not a silent drop.
func TestReceiveNotReady(t *testing.T) {
	c, s := pair(t, nil, nil)
	c.PostSend(verbs.SendWR{WRID: 1, Opcode: verbs.OpSend, SGL: gather(t, c.PD(), []byte("hi"))})
	expect(t, pollOne(t, c.SendCQ()), 1, verbs.StatusSuccess, verbs.OpSend)
	rt := termOf(t, c)
	if rt.Layer != LayerDDP || rt.EType != DDPEtypeUntaggedBuf || rt.Code != DDPCodeUNoBuffer {
		t.Fatalf("terminate %v", &rt.Terminate)
	}
	if st := termOf(t, s); !st.Sent {
		t.Fatalf("server error %v", st)
	}
}

// TestMessageTooLong: a Send larger than the posted buffer completes that
// receive with LocalLengthErr and terminates (DDP untagged code 5).
func TestMessageTooLong(t *testing.T) {
	c, s := pair(t, nil, nil)
	postRecv(s, 5, make([]byte, 10))
	c.PostSend(verbs.SendWR{WRID: 1, Opcode: verbs.OpSend, SGL: gather(t, c.PD(), make([]byte, 11))})
	expect(t, pollOne(t, s.RecvCQ()), 5, verbs.StatusLocalLengthErr, verbs.OpRecv)
	if rt := termOf(t, c); rt.Code != DDPCodeUTooLong || rt.EType != DDPEtypeUntaggedBuf {
		t.Fatalf("terminate %v", &rt.Terminate)
	}
}

// TestCRCMismatch corrupts one byte on the wire: the receiver's CRC check
// (RFC 5044 s4.4) fails, it sends an LLP Terminate and the message is not
// delivered.
func TestCRCMismatch(t *testing.T) {
	for _, at := range []int64{1, 10, 30, 4000} {
		t.Run(fmt.Sprint(at), func(t *testing.T) {
			var fc *faultConn
			pv := &Provider{DialConn: func(ctx context.Context, addr string) (net.Conn, error) {
				var d net.Dialer
				conn, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					return nil, err
				}
				fc = &faultConn{Conn: conn}
				return fc, nil
			}}
			c, s := pairWith(t, pv, &verbs.ConnParams{CRC: true}, nil)
			postRecv(s, 1, make([]byte, 8192))
			fc.arm(at)
			// The second Send pushes enough bytes for a receiver
			// whose length field was corrupted upward.
			c.PostSend(verbs.SendWR{WRID: 1, Opcode: verbs.OpSend, SGL: gather(t, c.PD(), make([]byte, 5000))})
			c.PostSend(verbs.SendWR{WRID: 2, Opcode: verbs.OpSend, SGL: gather(t, c.PD(), make([]byte, 5000))})
			expect(t, pollOne(t, s.RecvCQ()), 1, verbs.StatusFlushed, verbs.OpRecv)
			st := termOf(t, s)
			if !st.Sent || st.Layer != LayerLLP || st.Code != LLPCodeCRC {
				if at >= 20 || st.Layer != LayerDDP { // corrupting a header may fail a header check first
					t.Fatalf("server terminate %v (%v)", &st.Terminate, st.Cause)
				}
			}
			<-c.Done()
		})
	}
}

// TestConnectionLossFlushes: when the TCP connection dies, every posted
// receive and every unfinished send work request completes exactly once,
// as flushed (or success if it was already on the wire).
func TestConnectionLossFlushes(t *testing.T) {
	c, s := pair(t, &verbs.ConnParams{ORD: 2}, nil)
	const recvs, sends = 8, 40
	for i := range recvs {
		postRecv(c, uint64(i), make([]byte, 100))
	}
	// Cut the server's socket under it while the client's work is
	// in progress.
	for i := range sends {
		postRecv(s, uint64(i), make([]byte, 256<<10))
	}
	src, _ := s.PD().RegisterMemory(make([]byte, 1<<20), verbs.AccessRemoteRead)
	sink, _ := c.PD().RegisterMemory(make([]byte, 1<<20), verbs.AccessLocalWrite)
	for i := range sends {
		wr := verbs.SendWR{WRID: uint64(i), Opcode: verbs.OpSend, SGL: gather(t, c.PD(), make([]byte, 256<<10))}
		if i%4 == 0 {
			wr = verbs.SendWR{WRID: uint64(i), Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{{MR: sink, Length: 1 << 20}}, Length: 1 << 20, RemoteSTag: src.STag()}
		}
		c.PostSend(wr)
	}
	s.conn.Close()
	wcs := pollN(t, c.SendCQ(), sends)
	for i, wc := range wcs {
		if wc.WRID != uint64(i) {
			t.Fatalf("completion %d has WRID %d", i, wc.WRID)
		}
		if wc.Status != verbs.StatusFlushed && wc.Status != verbs.StatusSuccess {
			t.Fatalf("completion %+v", wc)
		}
	}
	for i, wc := range pollN(t, c.RecvCQ(), recvs) {
		expect(t, wc, uint64(i), verbs.StatusFlushed, verbs.OpRecv)
	}
	<-c.Done()
	if !errors.Is(c.Err(), verbs.ErrConnectionLost) && !errors.Is(c.Err(), verbs.ErrTerminated) {
		t.Fatalf("error %v", c.Err())
	}
	if c.scq.Len() != 0 {
		t.Fatalf("extra completions")
	}
}

func TestCloseFlushes(t *testing.T) {
	c, _ := pair(t, nil, nil)
	postRecv(c, 1, make([]byte, 4))
	c.Close()
	expect(t, pollOne(t, c.RecvCQ()), 1, verbs.StatusFlushed, verbs.OpRecv)
	postRecv(c, 2, make([]byte, 4))
	expect(t, pollOne(t, c.RecvCQ()), 2, verbs.StatusFlushed, verbs.OpRecv)
	if !errors.Is(c.Err(), verbs.ErrClosed) {
		t.Fatalf("err %v", c.Err())
	}
}

// TestPostSendInvalid: malformed work requests and gather/scatter
// elements that name no usable local memory are refused at post time
// with ErrInvalidWR and leave the queue pair working.
func TestPostSendInvalid(t *testing.T) {
	c, s := pair(t, nil, nil)
	other := reg(t, NewProtectionDomain(), make([]byte, 8), verbs.AccessLocalWrite)
	own := reg(t, c.PD(), make([]byte, 8), verbs.AccessLocalWrite)
	readOnly := reg(t, c.PD(), make([]byte, 8), verbs.AccessRemoteRead)
	dead := reg(t, c.PD(), make([]byte, 8), verbs.AccessLocalWrite)
	if err := dead.Deregister(); err != nil {
		t.Fatal(err)
	}
	fast, err := c.PD().AllocFastReg()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fast.FastRegister(own, 0, 8, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	sge := func(mr *verbs.MemoryRegion, off uint64, n uint32) []verbs.SGE {
		return []verbs.SGE{{MR: mr, Offset: off, Length: n}}
	}
	tooMany := make([]verbs.SGE, verbs.MaxSGE+1)
	for i := range tooMany {
		tooMany[i] = verbs.SGE{MR: own, Offset: uint64(i % 8), Length: 1}
	}
	for i, wr := range []verbs.SendWR{
		{Opcode: 0},
		{Opcode: verbs.OpRecv},
		{Opcode: verbs.OpRDMARead, Length: 1}, // no sink
		{Opcode: verbs.OpRDMARead, SGL: sge(other, 0, 1), Length: 1},                          // sink of another PD
		{Opcode: verbs.OpRDMARead, SGL: sge(own, 4, 5), Length: 5},                            // sink leaves its region
		{Opcode: verbs.OpRDMARead, SGL: sge(readOnly, 0, 1), Length: 1},                       // sink without local write
		{Opcode: verbs.OpRDMARead, SGL: sge(own, 0, 4), Length: 5},                            // sink shorter than the read
		{Opcode: verbs.OpRDMARead, SGL: sge(own, 0, 5), Length: 4},                            // sink longer than the read
		{Opcode: verbs.OpRDMARead, SGL: append(sge(own, 0, 1), sge(own, 1, 1)...), Length: 2}, // two sinks
		{Opcode: verbs.OpRDMARead, SGL: sge(nil, 0, 1), Length: 1},                            // no region
		{Opcode: verbs.OpRDMARead, SGL: sge(fast, 0, 1), Length: 1},                           // a fast-registration region has no local key
		{Opcode: verbs.OpRDMARead, SGL: sge(dead, 0, 1), Length: 1},                           // deregistered sink
		{Opcode: verbs.OpSend, SGL: tooMany},                                                  // more than MaxSGE
		{Opcode: verbs.OpSend, SGL: sge(nil, 0, 1)},                                           // no region
		{Opcode: verbs.OpSend, SGL: append(sge(own, 0, 8), sge(own, 4, 5)...)},                // second element leaves its region
		{Opcode: verbs.OpSend, SGL: sge(own, 9, 0)},                                           // offset beyond the region
		{Opcode: verbs.OpRDMAWrite, SGL: sge(dead, 0, 1)},                                     // deregistered
		{Opcode: verbs.OpSendWithInvalidate, SGL: sge(fast, 0, 1)},                            // fast-registration region
	} {
		if err := c.PostSend(wr); !errors.Is(err, verbs.ErrInvalidWR) {
			t.Errorf("send %d %+v: %v", i, wr, err)
		}
	}
	for i, wr := range []verbs.RecvWR{
		{WRID: 1}, // no buffer
		{WRID: 2, SGL: append(sge(own, 0, 4), sge(own, 4, 4)...)}, // iWARP places a Send into one buffer
		{WRID: 3, SGL: sge(readOnly, 0, 8)},                       // without local write
		{WRID: 4, SGL: sge(own, 4, 5)},                            // leaves its region
		{WRID: 5, SGL: sge(nil, 0, 1)},                            // no region
		{WRID: 6, SGL: sge(fast, 0, 8)},                           // fast-registration region
		{WRID: 7, SGL: sge(dead, 0, 8)},                           // deregistered
	} {
		if err := c.PostRecv(wr); !errors.Is(err, verbs.ErrInvalidWR) {
			t.Errorf("receive %d %+v: %v", i, wr, err)
		}
	}
	if c.scq.Len() != 0 || c.rcq.Len() != 0 || c.Err() != nil {
		t.Fatalf("refused requests left completions (%d, %d) or broke the queue pair: %v", c.scq.Len(), c.rcq.Len(), c.Err())
	}
	// MaxSGE elements are fine; the message is their concatenation.
	copy(own.Bytes(), "abcdefgh")
	sgl := make([]verbs.SGE, verbs.MaxSGE)
	for i := range sgl {
		sgl[i] = verbs.SGE{MR: own, Offset: uint64(7 - i), Length: 1}
	}
	got := make([]byte, 8)
	if err := postRecv(s, 1, got); err != nil {
		t.Fatal(err)
	}
	if err := c.PostSend(verbs.SendWR{WRID: 1, Opcode: verbs.OpSend, SGL: sgl}); err != nil {
		t.Fatal(err)
	}
	expect(t, pollOne(t, c.SendCQ()), 1, verbs.StatusSuccess, verbs.OpSend)
	if rc := pollOne(t, s.RecvCQ()); rc.Status != verbs.StatusSuccess || rc.ByteLen != 8 || string(got) != "hgfedcba" {
		t.Fatalf("receive %+v: %q", rc, got)
	}
}

// TestSetupPostsBeforeAccept: receives posted by ConnParams.Setup are in
// place before the initiator can send, so a Send right after Dial always
// finds a buffer (rdma_accept after ibv_post_recv). A failing Setup
// rejects the connection and flushes what it posted.
func TestSetupPostsBeforeAccept(t *testing.T) {
	for i := range 20 {
		buf := make([]byte, 8)
		sp := &verbs.ConnParams{Setup: func(qp verbs.QueuePair) error { return postRecv(qp, 7, buf) }}
		cbuf := make([]byte, 8)
		cp := &verbs.ConnParams{Setup: func(qp verbs.QueuePair) error { return postRecv(qp, 8, cbuf) }}
		c, s := pair(t, cp, sp)
		c.PostSend(verbs.SendWR{WRID: 1, Opcode: verbs.OpSend, SGL: gather(t, c.PD(), []byte("first"))})
		s.PostSend(verbs.SendWR{WRID: 2, Opcode: verbs.OpSend, SGL: gather(t, s.PD(), []byte("second"))})
		expect(t, pollOne(t, s.RecvCQ()), 7, verbs.StatusSuccess, verbs.OpRecv)
		expect(t, pollOne(t, c.RecvCQ()), 8, verbs.StatusSuccess, verbs.OpRecv)
		if string(buf[:5]) != "first" || string(cbuf[:6]) != "second" {
			t.Fatalf("round %d: %q %q", i, buf, cbuf)
		}
		c.Close()
		s.Close()
	}
	ctx := testCtx(t)
	ln, err := Listen("127.0.0.1:0", &verbs.ConnParams{Setup: func(qp verbs.QueuePair) error {
		postRecv(qp, 9, make([]byte, 1))
		return errors.New("no resources")
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := Dial(ctx, ln.Addr().String(), nil); !errors.Is(err, verbs.ErrRejected) {
		t.Fatalf("dial: %v, want rejection", err)
	}
	ok, err := Listen("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ok.Close()
	cq := verbs.NewSoftCQ()
	_, err = Dial(ctx, ok.Addr().String(), &verbs.ConnParams{RecvCQ: cq, Setup: func(qp verbs.QueuePair) error {
		postRecv(qp, 10, make([]byte, 1))
		return errors.New("changed my mind")
	}})
	if err == nil {
		t.Fatal("dial with failing Setup succeeded")
	}
	expect(t, pollOne(t, cq), 10, verbs.StatusFlushed, verbs.OpRecv)
}
