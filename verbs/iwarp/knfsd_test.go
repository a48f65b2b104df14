package iwarp

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/test/testpeer"
	"github.com/rdmafs/rdmafs/verbs"
)

// TestMain stops the test servers (knfsd guest) the interop tests start.
func TestMain(m *testing.M) { testpeer.Main(m) }

// RFC 8797 s4: RPC-over-RDMA connection private data.
const rpcrdmaCMMagic = 0xf6ab0e18

// cmPrivateData encodes RFC 8797 private data: magic, version, flags,
// inline send and receive sizes as size/1024 - 1.
func cmPrivateData(flags byte, send, recv int) []byte {
	b := binary.BigEndian.AppendUint32(nil, rpcrdmaCMMagic)
	return append(b, 1, flags, byte(send/1024-1), byte(recv/1024-1))
}

// parseCMPrivateData decodes RFC 8797 private data.
func parseCMPrivateData(b []byte) (version, flags byte, send, recv int, err error) {
	if len(b) < 8 || binary.BigEndian.Uint32(b) != rpcrdmaCMMagic {
		return 0, 0, 0, 0, fmt.Errorf("not RFC 8797 private data: %x", b)
	}
	return b[4], b[5], (int(b[6]) + 1) * 1024, (int(b[7]) + 1) * 1024, nil
}

// knfsdDmesgOnFailure logs the guest's kernel messages when t fails.
func knfsdDmesgOnFailure(t *testing.T, k *testpeer.Knfsd) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := k.Exec(ctx, "dmesg | tail -20; cat /proc/net/tcp")
		t.Logf("guest dmesg (%v):\n%s", err, out)
	})
}

func knfsdDial(t *testing.T, k *testpeer.Knfsd, crc bool) *QP {
	t.Helper()
	return knfsdDialSeg(t, k, crc, 0)
}

// knfsdDialSeg is knfsdDial with a maximum ULPDU size (0: default).
func knfsdDialSeg(t *testing.T, k *testpeer.Knfsd, crc bool, seg int) *QP {
	t.Helper()
	knfsdDmesgOnFailure(t, k)
	qp, err := Dial(testCtx(t), k.RDMAAddr, &verbs.ConnParams{CRC: crc, MaxSegment: seg, PrivateData: cmPrivateData(0, 4096, 4096)})
	if err != nil {
		t.Fatalf("MPA connect to knfsd at %s (crc %v): %v", k.RDMAAddr, crc, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("qp: kicks %d, inbound FPDU seen %v, error %v", qp.kicks.Load(), qp.rxSeen.Load(), qp.Err())
		}
		qp.Close()
	})
	return qp
}

// TestKnfsdMPAConnect: Linux siw accepts our MPA Request (rev 2, enhanced,
// IRD/ORD word, RFC 8797 private data), with and without CRC, and knfsd
// answers with its own RFC 8797 private data.
func TestKnfsdMPAConnect(t *testing.T) {
	k := testpeer.RequireKnfsd(t)
	for _, crc := range []bool{false, true} {
		t.Run(fmt.Sprintf("crc=%v", crc), func(t *testing.T) {
			qp := knfsdDial(t, k, crc)
			if qp.CRC() != crc {
				t.Fatalf("CRC negotiated %v, asked %v", qp.CRC(), crc)
			}
			if qp.ORD() < 1 {
				t.Fatalf("ORD %d", qp.ORD())
			}
			v, flags, send, recv, err := parseCMPrivateData(qp.PeerPrivateData())
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("knfsd private data: version %d flags %#x send %d recv %d; ORD %d", v, flags, send, recv, qp.ORD())
			if v != 1 || send < 1024 || recv < 1024 {
				t.Fatalf("knfsd private data: version %d send %d recv %d", v, send, recv)
			}
		})
	}
}

// nullCall is an RPC-over-RDMA v1 RDMA_MSG (RFC 8166 s4) carrying an
// NFSv4 NULL call (RFC 5531): xid, vers 1, credits 32, RDMA_MSG, three
// empty chunk lists; then xid, CALL, rpcvers 2, prog 100003, vers 4,
// proc 0, AUTH_NONE credential and verifier.
func nullCall(xid uint32) []byte {
	var b []byte
	for _, w := range []uint32{xid, 1, 32, 0, 0, 0, 0, xid, 0, 2, 100003, 4, 0, 0, 0, 0, 0} {
		b = binary.BigEndian.AppendUint32(b, w)
	}
	return b
}

// TestKnfsdNullRPC: an NFS NULL call over RPC-over-RDMA to knfsd on
// soft-iWARP, with and without CRC: one Send each way.
func TestKnfsdNullRPC(t *testing.T) {
	k := testpeer.RequireKnfsd(t)
	for _, crc := range []bool{false, true} {
		t.Run(fmt.Sprintf("crc=%v", crc), func(t *testing.T) {
			qp := knfsdDial(t, k, crc)
			bufs := make([][]byte, 4)
			wrs := make([]verbs.RecvWR, len(bufs))
			for i := range bufs {
				bufs[i] = make([]byte, 4096)
				var err error
				if wrs[i], err = recvWR(qp.PD(), uint64(i), bufs[i]); err != nil {
					t.Fatal(err)
				}
				if err := qp.PostRecv(wrs[i]); err != nil {
					t.Fatal(err)
				}
			}
			for i, xid := range []uint32{0x1234abcd, 0x1234abce} {
				if err := qp.PostSend(verbs.SendWR{WRID: uint64(100 + i), Opcode: verbs.OpSend, SGL: gather(t, qp.PD(), nullCall(xid))}); err != nil {
					t.Fatal(err)
				}
				expect(t, pollOne(t, qp.SendCQ()), uint64(100+i), verbs.StatusSuccess, verbs.OpSend)
				wc := pollOne(t, qp.RecvCQ())
				if wc.Status != verbs.StatusSuccess || wc.Opcode != verbs.OpRecv {
					t.Fatalf("receive %+v (qp error %v)", wc, qp.Err())
				}
				r := bufs[wc.WRID][:wc.ByteLen]
				if len(r) < 7*4+6*4 {
					t.Fatalf("reply of %d bytes: %x", len(r), r)
				}
				w := func(i int) uint32 { return binary.BigEndian.Uint32(r[4*i:]) }
				// RPC-over-RDMA header: xid, vers, credits, RDMA_MSG,
				// no chunks; RPC reply: xid, REPLY, MSG_ACCEPTED,
				// AUTH_NONE verifier, SUCCESS.
				if w(0) != xid || w(1) != 1 || w(2) == 0 || w(3) != 0 || w(4) != 0 || w(5) != 0 || w(6) != 0 {
					t.Fatalf("RPC-over-RDMA header %x", r[:28])
				}
				if w(7) != xid || w(8) != 1 || w(9) != 0 || w(10) != 0 || w(11) != 0 || w(12) != 0 {
					t.Fatalf("RPC reply %x", r[28:])
				}
				t.Logf("knfsd NULL reply: %d bytes, credits %d (kicks %d)", len(r), w(2), qp.kicks.Load())
				qp.PostRecv(wrs[wc.WRID])
			}
			if err := qp.Err(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// rdmaHeader builds an RPC-over-RDMA v1 transport header (RFC 8166 s4):
// xid, vers 1, credits 32, proc, then the chunk lists as given words.
func rdmaHeader(xid, proc uint32, chunks ...uint32) []byte {
	var b []byte
	for _, w := range append([]uint32{xid, 1, 32, proc}, chunks...) {
		b = binary.BigEndian.AppendUint32(b, w)
	}
	return b
}

// rpcNull is the RPC NULL call of nullCall without the transport header.
func rpcNull(xid uint32) []byte { return nullCall(xid)[28:] }

// checkNullReply checks an RPC reply (xid, REPLY, MSG_ACCEPTED, AUTH_NONE
// verifier, SUCCESS).
func checkNullReply(t *testing.T, r []byte, xid uint32) {
	t.Helper()
	if len(r) < 24 {
		t.Fatalf("RPC reply of %d bytes: %x", len(r), r)
	}
	for i, want := range []uint32{xid, 1, 0, 0, 0, 0} {
		if got := binary.BigEndian.Uint32(r[4*i:]); got != want {
			t.Fatalf("RPC reply word %d is %d, want %d: %x", i, got, want, r)
		}
	}
}

// TestKnfsdReplyChunkWrite: knfsd places the reply of a call that offers
// a Reply chunk with RDMA Write into our registered region (tagged
// placement from Linux siw), then Sends RDMA_NOMSG. With the RFC 8797
// remote-invalidation flag it ends with Send With Invalidate of our STag.
func TestKnfsdReplyChunkWrite(t *testing.T) {
	k := testpeer.RequireKnfsd(t)
	for _, inv := range []bool{false, true} {
		t.Run(fmt.Sprintf("invalidate=%v", inv), func(t *testing.T) {
			var flags byte
			if inv {
				flags = 1 // RFC 8797 s4.2: we accept Send With Invalidate
			}
			knfsdDmesgOnFailure(t, k)
			qp, err := Dial(testCtx(t), k.RDMAAddr, &verbs.ConnParams{CRC: true, PrivateData: cmPrivateData(flags, 4096, 4096)})
			if err != nil {
				t.Fatal(err)
			}
			defer qp.Close()
			buf := make([]byte, 4096)
			postRecv(qp, 1, buf)
			backing := make([]byte, 2048)
			mr, err := qp.PD().RegisterMemory(backing[512:1536], verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			const xid = 0x51525354
			// Read list empty, Write list empty, Reply chunk with one
			// segment: handle, length 1024, offset 0.
			call := append(rdmaHeader(xid, 0, 0, 0, 1, 1, mr.STag(), 1024, 0, 0), rpcNull(xid)...)
			qp.PostSend(verbs.SendWR{WRID: 2, Opcode: verbs.OpSend, SGL: gather(t, qp.PD(), call)})
			expect(t, pollOne(t, qp.SendCQ()), 2, verbs.StatusSuccess, verbs.OpSend)
			wc := pollOne(t, qp.RecvCQ())
			if wc.Status != verbs.StatusSuccess {
				t.Fatalf("receive %+v: %v", wc, qp.Err())
			}
			h := buf[:wc.ByteLen]
			w := func(i int) uint32 { return binary.BigEndian.Uint32(h[4*i:]) }
			// xid, vers, credits, RDMA_NOMSG, no read list, no write
			// list, reply chunk: 1 segment, handle, written length.
			if len(h) < 4*10 || w(0) != xid || w(3) != 1 || w(4) != 0 || w(5) != 0 || w(6) != 1 || w(7) != 1 || w(8) != mr.STag() {
				t.Fatalf("transport header %x", h)
			}
			n := w(9)
			t.Logf("knfsd wrote %d bytes into the reply chunk; receive %v invalidated %#x", n, wc.Opcode, wc.InvalidatedSTag)
			checkNullReply(t, backing[512:512+n], xid)
			for i, b := range backing {
				if (i < 512 || i >= 1536) && b != 0 {
					t.Fatalf("byte %d outside the region written", i)
				}
			}
			if inv {
				if wc.Opcode != verbs.OpRecvWithInvalidate || wc.InvalidatedSTag != mr.STag() || mr.Valid() {
					t.Fatalf("no remote invalidation: %+v valid %v", wc, mr.Valid())
				}
			} else if wc.Opcode != verbs.OpRecv || !mr.Valid() {
				t.Fatalf("unexpected invalidation: %+v", wc)
			}
			mr.Invalidate()
			if n := qp.PD().LiveRemoteRegions(); n != 0 {
				t.Fatalf("%d live remote regions", n)
			}
		})
	}
}

// TestKnfsdPositionZeroReadChunk: knfsd pulls an RDMA_NOMSG call from a
// Position-Zero Read chunk with RDMA Read (our Read Responses to Linux
// siw, several 64 KiB FPDUs for the large case) and answers inline. The
// NULL procedure ignores the padding after the call header.
func TestKnfsdPositionZeroReadChunk(t *testing.T) {
	k := testpeer.RequireKnfsd(t)
	for _, tc := range []struct {
		crc bool
		pad int
		seg int
	}{{false, 0, 0}, {true, 0, 0}, {false, 100000, 0}, {true, 100000, 0}, {true, 30000, 1460}} {
		t.Run(fmt.Sprintf("crc=%v/pad=%d/seg=%d", tc.crc, tc.pad, tc.seg), func(t *testing.T) {
			qp := knfsdDialSeg(t, k, tc.crc, tc.seg)
			buf := make([]byte, 4096)
			postRecv(qp, 1, buf)
			const xid = 0x61626364
			body := append(rpcNull(xid), make([]byte, tc.pad)...)
			mr, err := qp.PD().RegisterMemory(body, verbs.AccessRemoteRead)
			if err != nil {
				t.Fatal(err)
			}
			// Read list: one entry at position 0 (handle, length,
			// offset), end of list; no Write list, no Reply chunk.
			hdr := rdmaHeader(xid, 1, 1, 0, mr.STag(), uint32(len(body)), 0, 0, 0, 0, 0)
			qp.PostSend(verbs.SendWR{WRID: 2, Opcode: verbs.OpSend, SGL: gather(t, qp.PD(), hdr)})
			expect(t, pollOne(t, qp.SendCQ()), 2, verbs.StatusSuccess, verbs.OpSend)
			wc := pollOne(t, qp.RecvCQ())
			if wc.Status != verbs.StatusSuccess {
				t.Fatalf("receive %+v: %v", wc, qp.Err())
			}
			r := buf[:wc.ByteLen]
			if len(r) < 28 || binary.BigEndian.Uint32(r) != xid || binary.BigEndian.Uint32(r[12:]) != 0 {
				t.Fatalf("reply %x", r)
			}
			checkNullReply(t, r[28:], xid)
			if qp.maxIRQ.Load() < 1 {
				t.Fatalf("knfsd did not read the chunk")
			}
			mr.Invalidate()
		})
	}
}
