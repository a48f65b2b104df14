package iwarp

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/verbs"
)

// holdAsPoster holds qp's writer as a direct poster does (PostSend,
// postDirect), with write run under it, until the returned function,
// which ends the posting as postDirect does.
func holdAsPoster(qp *QP, write func()) (release func()) {
	qp.w.mu.Lock()
	qp.startPosting()
	if write != nil {
		write()
	}
	return func() {
		kick, err := qp.endPostingLocked(true)
		qp.w.mu.Unlock()
		qp.afterRespond(kick, err)
	}
}

// waitCount waits until c reports n.
func waitCount(ctx context.Context, t *testing.T, qp *QP, c func() int32, n int32, what string) {
	t.Helper()
	for c() < n {
		if ctx.Err() != nil {
			t.Fatalf("%s: %d, want %d (queue pair: %v)", what, c(), n, qp.Err())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestParkedRead: a Read Request that arrives while a poster holds the
// writer is left to the poster (parkRead), which answers it before it
// lets go; one that arrives after it goes to the responder goroutine
// and is answered after it (RFC 5040 s5: responses in request order).
// When the post left part of its write, the responder goroutine writes
// that and then the parked request's response. A parked request whose
// region is not readable, or was invalidated while parked, gets a
// Terminate and none of the region's bytes (RFC 8166 s8.1.3).
func TestParkedRead(t *testing.T) {
	for _, tc := range []struct {
		name       string
		rest       bool // the post leaves part of its write
		size       uint32
		badSTag    bool
		invalidate bool // the region is invalidated while the request is parked
	}{
		{name: "answered", size: 300 << 10},
		{name: "after the post's rest", rest: true, size: 300 << 10},
		{name: "zero-length after the post's rest", rest: true},
		{name: "invalid STag", size: 4096, badSTag: true},
		{name: "invalidated while parked", size: 4096, invalidate: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			pd := NewProtectionDomain()
			qp, peer := newScriptPeer(t, scriptParams(pd, 0, 0))
			const regionSize = 1 << 20
			data := randBytes(regionSize, 31)
			parent := reg(t, pd, data, verbs.AccessLocalWrite)
			fr, err := pd.AllocFastReg()
			if err != nil {
				t.Fatal(err)
			}
			stag, err := fr.FastRegister(parent, 0, regionSize, verbs.AccessRemoteRead)
			if err != nil {
				t.Fatal(err)
			}
			// The post's write: RDMA Write FPDUs to an STag of the
			// peer, more than the socket takes when rest is set.
			var write func()
			const restSTag, restFPDUs, restLen = 0x77, maxBatch, 60000
			if tc.rest {
				if err := qp.conn.(*net.TCPConn).SetWriteBuffer(4096); err != nil {
					t.Fatal(err)
				}
				payload := make([]byte, restLen)
				write = func() {
					var hb [taggedHdrLen]byte
					err := qp.w.startLocked()
					for i := 0; i < restFPDUs && err == nil; i++ {
						putTagged(hb[:], i == restFPDUs-1, opWrite, restSTag, uint64(i*restLen))
						err = qp.w.addLocked(hb[:], [][]byte{payload})
					}
					if err == nil {
						err = qp.w.tryFlushLocked()
					}
					if err != nil || !qp.w.pending() {
						t.Errorf("the post's write: %v, pending %v, want a rest", err, qp.w.pending())
					}
				}
			}
			release := holdAsPoster(qp, write)
			released := false
			defer func() {
				if !released {
					release()
				}
			}()

			rr1 := readRequest{sinkSTag: 0x4201, size: tc.size, srcSTag: stag, srcTO: 5}
			if tc.badSTag {
				rr1.srcSTag = stag ^ 0xff00
			}
			peer.mustWrite(peer.readRequestFPDU(rr1))
			waitCount(ctx, t, qp, qp.respParked.Load, 1, "parked Read Requests")
			rr2 := readRequest{sinkSTag: 0x4202, size: 4096, srcSTag: stag, srcTO: 100}
			fault := tc.badSTag || tc.invalidate
			if !fault {
				peer.mustWrite(peer.readRequestFPDU(rr2))
				waitCount(ctx, t, qp, qp.respQueued.Load, 1, "Read Requests queued for the responder")
			}
			if tc.invalidate {
				// Nothing reads the region yet: the invalidation
				// does not wait.
				if err := fr.InvalidateContext(ctx); err != nil {
					t.Fatalf("invalidate while parked: %v", err)
				}
			}
			release()
			released = true

			if fault {
				term, err := peer.terminate(func(h ddpHeader, b []byte) {
					if h.tagged() && h.opcode() == opReadResp {
						t.Fatalf("Read Response FPDU %+v for a request whose region is not readable", h)
					}
				})
				if err != nil {
					t.Fatal(err)
				}
				wantCode := byte(RDMAPCodeInvalidSTag)
				if term.Layer != LayerRDMAP || term.EType != RDMAPEtypeRemoteProtection || term.Code != wantCode || len(term.ReadRequest) != readReqLen {
					t.Fatalf("peer received %v, want RDMAP remote protection Invalid STag with the Read Request", &term)
				}
				if got, _ := parseReadRequest(term.ReadRequest); got != rr1 {
					t.Fatalf("Terminate names Read Request %+v, want %+v", got, rr1)
				}
				return
			}
			rest := 0
			for i, rr := range []readRequest{rr1, rr2} {
				off := 0
				for {
					h, payload, err := peer.next()
					if err != nil {
						t.Fatalf("read %d at %d: %v (queue pair: %v)", i, off, err, qp.Err())
					}
					if h.tagged() && h.opcode() == opWrite && h.stag == restSTag {
						if i > 0 || off > 0 {
							t.Fatalf("the post's write after Read Response bytes (read %d at %d)", i, off)
						}
						rest += len(payload)
						continue
					}
					if !h.tagged() || h.opcode() != opReadResp || h.stag != rr.sinkSTag || h.to != rr.sinkTO+uint64(off) {
						t.Fatalf("read %d at %d: FPDU %+v", i, off, h)
					}
					if !bytes.Equal(payload, data[rr.srcTO+uint64(off):rr.srcTO+uint64(off+len(payload))]) {
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
			if tc.rest && rest != restFPDUs*restLen {
				t.Fatalf("%d bytes of the post's write, want %d", rest, restFPDUs*restLen)
			}
			if qp.Err() != nil {
				t.Fatal(qp.Err())
			}
			// Every access has ended: the region can be invalidated
			// without waiting.
			if err := fr.InvalidateContext(ctx); err != nil {
				t.Fatalf("invalidate after the responses: %v", err)
			}
		})
	}
}
