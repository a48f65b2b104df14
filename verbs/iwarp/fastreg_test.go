package iwarp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

// guardByte fills the parent region around a fast-registered window; no
// byte of it may change.
const guardByte = 0xa5

func fillGuard(b []byte) {
	for i := range b {
		b[i] = guardByte
	}
}

// checkGuards fails if a byte of parent outside [lo, hi) changed.
func checkGuards(t *testing.T, parent []byte, lo, hi int) {
	t.Helper()
	for i, b := range parent {
		if (i < lo || i >= hi) && b != guardByte {
			t.Fatalf("byte %d of the parent region, outside the window [%d, %d), was written: %#x", i, lo, hi, b)
		}
	}
}

// TestFastRegWriteDirect: 1 MiB RDMA Writes (default 64 KiB FPDUs) into a
// window fast-registered for each transfer, as rpcrdma exposes a Write
// chunk, land exactly in the window. After the first large FPDU the
// receiver reads payload straight from the socket into the window, so the
// buffered reader copies at most what it held when that FPDU arrived
// (readerSize bytes; see placeData) and nothing in later transfers.
func TestFastRegWriteDirect(t *testing.T) {
	c, s := pair(t, nil, nil)
	const size = 1 << 20
	const guard = 4096
	// A 1 MiB Write is 16 full FPDUs and a small last one, then the
	// Send that publishes it: two small FPDUs per transfer, far from
	// the smallLimit in a row that ends direct reads.
	if maxPayload := defaultMaxULPDU - taggedHdrLen; size/maxPayload < 2 || size%maxPayload >= directMin {
		t.Fatalf("the test's reasoning no longer matches the provider's constants")
	}
	parentBuf := make([]byte, guard+size+guard)
	fillGuard(parentBuf)
	parent := reg(t, s.PD(), parentBuf, verbs.AccessLocalWrite)
	fr, err := s.PD().AllocFastReg()
	if err != nil {
		t.Fatal(err)
	}
	src := make([]byte, size)
	sgl := []verbs.SGE{{MR: reg(t, c.PD(), src, 0), Length: size}}
	var first uint64
	for round := range 5 {
		copy(src, randBytes(size, uint64(round+1)))
		stag, err := fr.FastRegister(parent, guard, size, verbs.AccessRemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		if err := postRecv(s, uint64(round), make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		if err := c.PostSend(verbs.SendWR{WRID: 1, Opcode: verbs.OpRDMAWrite, SGL: sgl, RemoteSTag: stag}); err != nil {
			t.Fatal(err)
		}
		// The Send orders after the Write; its receive completion
		// publishes the placed bytes.
		if err := c.PostSend(verbs.SendWR{WRID: 2, Opcode: verbs.OpSend}); err != nil {
			t.Fatal(err)
		}
		expect(t, pollOne(t, c.SendCQ()), 1, verbs.StatusSuccess, verbs.OpRDMAWrite)
		expect(t, pollOne(t, c.SendCQ()), 2, verbs.StatusSuccess, verbs.OpSend)
		expect(t, pollOne(t, s.RecvCQ()), uint64(round), verbs.StatusSuccess, verbs.OpRecv)
		if err := fr.Invalidate(); err != nil {
			t.Fatal(err)
		}
		mustEqual(t, parentBuf[guard:guard+size], src)
		checkGuards(t, parentBuf, guard, guard+size)
		copied := s.CopiedBytes()
		t.Logf("transfer %d: %d bytes copied by the buffered reader in all", round, copied)
		if round == 0 {
			// Only the first large FPDU finds payload in the
			// buffered reader, at most all of it.
			if copied > readerSize {
				t.Fatalf("first transfer copied %d bytes, more than the %d-byte buffered reader holds", copied, readerSize)
			}
			first = copied
		} else if copied != first {
			t.Fatalf("transfer %d copied %d more bytes; steady state must read straight into place", round, copied-first)
		}
	}
	if c.Err() != nil || s.Err() != nil {
		t.Fatalf("errors: %v %v", c.Err(), s.Err())
	}
}

// TestFastRegWriteOutsideWindow: an RDMA Write that reaches one byte past
// (or before) a fast-registered window is a DDP tagged base/bounds error
// (RFC 5041 s5.3, RFC 5040 s7): the receiver terminates the connection
// and no byte of the parent region outside the window changes, even when
// earlier FPDUs of the same Write were placed straight from the socket.
func TestFastRegWriteOutsideWindow(t *testing.T) {
	maxPayload := defaultMaxULPDU - taggedHdrLen
	for _, tc := range []struct {
		name   string
		window int
		off    uint64 // RemoteOffset of the Write
		n      int    // its length
		badTO  uint64 // TO of the refused segment
	}{
		{"one byte past the end", 4096, 0, 4097, 0},
		{"the byte after the window", 4096, 4096, 1, 4096},
		{"the byte before the window", 4096, 1<<64 - 1, 2, 1<<64 - 1},
		// Three FPDUs land in the window (direct placement), the
		// fourth reaches one byte past it.
		{"last FPDU one byte past the end", 3*maxPayload + 5000, 0, 3*maxPayload + 5001, uint64(3 * maxPayload)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := pair(t, nil, nil)
			const guard = 1000
			parentBuf := make([]byte, guard+tc.window+guard)
			fillGuard(parentBuf)
			parent := reg(t, s.PD(), parentBuf, verbs.AccessLocalWrite)
			fr, err := s.PD().AllocFastReg()
			if err != nil {
				t.Fatal(err)
			}
			stag, err := fr.FastRegister(parent, guard, tc.window, verbs.AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			postRecv(s, 1, make([]byte, 16))
			data := randBytes(tc.n, 7)
			for i, b := range data {
				if b == guardByte {
					data[i] = ^b
				}
			}
			if err := c.PostSend(verbs.SendWR{WRID: 10, Opcode: verbs.OpRDMAWrite, SGL: gather(t, c.PD(), data), RemoteSTag: stag, RemoteOffset: tc.off}); err != nil {
				t.Fatal(err)
			}
			expect(t, pollOne(t, c.SendCQ()), 10, verbs.StatusSuccess, verbs.OpRDMAWrite)
			st, rt := termOf(t, s), termOf(t, c)
			if !st.Sent || rt.Sent {
				t.Fatalf("sent flags: %v %v", st.Sent, rt.Sent)
			}
			if rt.Layer != LayerDDP || rt.EType != DDPEtypeTaggedBuf || rt.Code != DDPCodeTBaseBounds {
				t.Fatalf("peer received %v, want DDP tagged base/bounds (cause %v)", &rt.Terminate, st.Cause)
			}
			// The Terminate carries the refused segment's header.
			if h := rt.DDPHeader; len(h) != taggedHdrLen || binary.BigEndian.Uint32(h[2:]) != stag || binary.BigEndian.Uint64(h[6:]) != tc.badTO {
				t.Fatalf("terminate names DDP header %x, want STag %#x TO %d", h, stag, tc.badTO)
			}
			expect(t, pollOne(t, s.RecvCQ()), 1, verbs.StatusFlushed, verbs.OpRecv)
			// Once the server's goroutines are gone nothing can
			// be placed any more; then look at the memory.
			s.Close()
			if err := fr.Invalidate(); err != nil {
				t.Fatal(err)
			}
			checkGuards(t, parentBuf, guard, guard+tc.window)
			if tc.badTO != 0 && tc.off == 0 {
				// The segments before the refused one landed.
				mustEqual(t, parentBuf[guard:guard+int(tc.badTO)], data[:tc.badTO])
			}
		})
	}
}

// TestSendAllocs: posting a Send of a registered buffer and polling its
// completions (send and receive side, receive buffer reposted) allocates
// nothing in steady state, counting every goroutine of both providers.
func TestSendAllocs(t *testing.T) {
	for _, size := range []int{64, 4096} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			c, s := pair(t, nil, nil)
			ctx := testCtx(t)
			sgl := []verbs.SGE{{MR: reg(t, c.PD(), randBytes(size, 3), 0), Length: uint32(size)}}
			rwr, err := recvWR(s.PD(), 0, make([]byte, size))
			if err != nil {
				t.Fatal(err)
			}
			// The server speaks first, so the client's kick loop
			// (kick.go) ends without kicking.
			if err := postRecv(c, 9, make([]byte, 8)); err != nil {
				t.Fatal(err)
			}
			s.PostSend(verbs.SendWR{WRID: 9, Opcode: verbs.OpSend, SGL: gather(t, s.PD(), []byte("hello"))})
			expect(t, pollOne(t, c.RecvCQ()), 9, verbs.StatusSuccess, verbs.OpRecv)
			expect(t, pollOne(t, s.SendCQ()), 9, verbs.StatusSuccess, verbs.OpSend)
			wc := make([]verbs.Completion, 1)
			round := func() {
				if err := s.PostRecv(rwr); err != nil {
					t.Fatal(err)
				}
				if err := c.PostSend(verbs.SendWR{WRID: 1, Opcode: verbs.OpSend, SGL: sgl}); err != nil {
					t.Fatal(err)
				}
				if _, err := c.SendCQ().Poll(ctx, wc); err != nil || wc[0].Status != verbs.StatusSuccess {
					t.Fatalf("send completion %+v: %v", wc[0], err)
				}
				if _, err := s.RecvCQ().Poll(ctx, wc); err != nil || wc[0].Status != verbs.StatusSuccess || wc[0].ByteLen != uint32(size) {
					t.Fatalf("receive completion %+v: %v", wc[0], err)
				}
			}
			// Warm up: the rings and the completion queues reach
			// their steady size.
			for range 100 {
				round()
			}
			allocs := testing.AllocsPerRun(500, round)
			t.Logf("%v allocations per Send of %d bytes", allocs, size)
			if allocs != 0 {
				t.Fatalf("%v allocations per PostSend and completion poll of a %d-byte Send, want 0", allocs, size)
			}
		})
	}
}

// TestFastRegWindowExact: a scripted peer given a 4 KiB fast-registered
// window of a larger region can RDMA Write and Read exactly the window;
// one byte before or after it, or the window's STag once the region was
// invalidated or bound again to another range (same index, new key), is
// refused with the RFC 5040 s7 Terminate, no byte of the parent outside
// the window changes and no byte of it is sent (RFC 8166 s8.1).
func TestFastRegWindowExact(t *testing.T) {
	const guard, window = 8192, 4096
	type access struct {
		write bool
		off   uint64 // from the window's start; 1<<64-1 is the byte before
		n     int
	}
	for _, tc := range []struct {
		name  string
		a     access
		stale string // "", "invalidated" or "rebound"
		code  byte   // Terminate code; 0xff: none, the access succeeds
	}{
		{"write the window", access{true, 0, window}, "", 0xff},
		{"read the window", access{false, 0, window}, "", 0xff},
		{"write the byte before", access{true, 1<<64 - 1, 1}, "", DDPCodeTBaseBounds},
		{"write the byte after", access{true, window, 1}, "", DDPCodeTBaseBounds},
		{"write one byte too many", access{true, 0, window + 1}, "", DDPCodeTBaseBounds},
		{"read the byte before", access{false, 1<<64 - 1, 1}, "", RDMAPCodeBaseBounds},
		{"read the byte after", access{false, window, 1}, "", RDMAPCodeBaseBounds},
		{"read one byte too many", access{false, 0, window + 1}, "", RDMAPCodeBaseBounds},
		{"write after invalidation", access{true, 0, 1}, "invalidated", DDPCodeTInvalidSTag},
		{"read after invalidation", access{false, 0, 1}, "invalidated", RDMAPCodeInvalidSTag},
		{"write after rebinding", access{true, 0, 1}, "rebound", DDPCodeTInvalidSTag},
		{"read after rebinding", access{false, 0, 1}, "rebound", RDMAPCodeInvalidSTag},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pd := NewProtectionDomain()
			qp, peer := newScriptPeer(t, &verbs.ConnParams{PD: pd})
			parentBuf := make([]byte, guard+window+guard)
			fillGuard(parentBuf)
			parent := reg(t, pd, parentBuf, verbs.AccessLocalWrite)
			fr, err := pd.AllocFastReg()
			if err != nil {
				t.Fatal(err)
			}
			stag, err := fr.FastRegister(parent, guard, window, verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			switch tc.stale {
			case "invalidated":
				err = fr.Invalidate()
			case "rebound":
				// The bytes after the window, under a new key.
				if err = fr.Invalidate(); err == nil {
					var s2 uint32
					s2, err = fr.FastRegister(parent, guard+window, window, verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
					if err == nil && (s2>>8 != stag>>8 || s2 == stag) {
						t.Fatalf("rebinding: STag %#x after %#x", s2, stag)
					}
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			const data = 0x5a
			if tc.a.write {
				peer.mustWrite(taggedFPDU(opWrite, true, stag, tc.a.off, bytes.Repeat([]byte{data}, tc.a.n)))
			}
			if !tc.a.write || tc.code == 0xff {
				// A Read of the window (after a Write: it is served
				// once the Write was placed, RFC 5040 s5.5).
				a := tc.a
				if a.write {
					a = access{false, 0, window}
				}
				peer.mustWrite(peer.readRequestFPDU(readRequest{sinkSTag: 0x4200, size: uint32(a.n), srcSTag: stag, srcTO: a.off}))
			}
			if tc.code == 0xff {
				got := 0
				for got < window {
					h, b, err := peer.next()
					if err != nil || !h.tagged() || h.opcode() != opReadResp {
						t.Fatalf("Read Response: %+v, %v", h, err)
					}
					want := byte(guardByte)
					if tc.a.write {
						want = data
					}
					if !bytes.Equal(b, bytes.Repeat([]byte{want}, len(b))) {
						t.Fatalf("Read Response bytes at %d are not the window's", got)
					}
					got += len(b)
				}
				if qp.Err() != nil {
					t.Fatal(qp.Err())
				}
			} else {
				term, err := peer.terminate(func(h ddpHeader, _ []byte) {
					t.Fatalf("the refused access sent %+v", h)
				})
				if err != nil {
					t.Fatal(err)
				}
				layer, etype := byte(LayerDDP), byte(DDPEtypeTaggedBuf)
				if !tc.a.write {
					layer, etype = LayerRDMAP, RDMAPEtypeRemoteProtection
				}
				if term.Layer != layer || term.EType != etype || term.Code != tc.code {
					t.Fatalf("peer received %v, want layer %d etype %d code %#x", &term, layer, etype, tc.code)
				}
				peer.conn.Close()
			}
			qp.Close()
			lo, hi := guard, guard+window
			if tc.code != 0xff {
				lo = hi // nothing may land
			}
			checkGuards(t, parentBuf, lo, hi)
		})
	}
}
