package iwarp

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

// sendSeg is one DDP segment of an untagged Send (RFC 5041 s4.3): its
// message offset, payload and Last flag.
type sendSeg struct {
	mo      uint32
	payload []byte
	last    bool
}

// sendFPDU frames one Send segment of message msn.
func sendFPDU(msn uint32, s sendSeg) []byte {
	var h [untaggedHdrLen]byte
	putUntagged(h[:], s.last, opSend, 0, qnSend, msn, s.mo)
	return fpdu(append(h[:], s.payload...))
}

// staleMarker fills receive buffers before use: a byte of it in a
// completed message is a byte the peer did not send for that message.
const staleMarker = 0xa5

// TestHostileGappedSend: a Send whose DDP segments do not follow one
// another (a gap, an overlap, a first segment past offset 0) never
// completes: the receiver terminates with the untagged buffer error
// Invalid MO (RFC 5041 s5.4, s7.2) and the receive buffer, full of a
// marker, is flushed without a byte handed up as data. A Send cut into
// contiguous segments still arrives whole.
func TestHostileGappedSend(t *testing.T) {
	a, b := bytes.Repeat([]byte("A"), 16), bytes.Repeat([]byte("B"), 16)
	tests := []struct {
		name string
		segs []sendSeg
		want []byte // nil: refused
	}{
		{"contiguous", []sendSeg{{0, a, false}, {16, b, false}, {32, a, true}}, append(append(append([]byte(nil), a...), b...), a...)},
		{"gap", []sendSeg{{0, a, false}, {3988, b, true}}, nil},
		{"gap in the middle", []sendSeg{{0, a, false}, {16, b, false}, {40, a, true}}, nil},
		{"first segment past 0", []sendSeg{{4, a, true}}, nil},
		{"overlap", []sendSeg{{0, a, false}, {8, b, true}}, nil},
		{"rewind", []sendSeg{{0, a, false}, {16, b, false}, {0, a, true}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testCtx(t)
			pd := NewProtectionDomain()
			buf := bytes.Repeat([]byte{staleMarker}, 4096)
			qp, peer := newScriptPeer(t, &verbs.ConnParams{PD: pd, Setup: func(qp verbs.QueuePair) error {
				return postRecv(qp, 7, buf)
			}})
			var wire []byte
			for _, s := range tt.segs {
				wire = append(wire, sendFPDU(1, s)...)
			}
			peer.mustWrite(wire)
			var wc [1]verbs.Completion
			n, err := qp.RecvCQ().Poll(ctx, wc[:])
			if err != nil || n != 1 {
				t.Fatalf("receive completion: %d, %v", n, err)
			}
			c := wc[0]
			if tt.want != nil {
				if c.Status != verbs.StatusSuccess || !bytes.Equal(buf[:c.ByteLen], tt.want) {
					t.Fatalf("completion %+v, data %q, want %q", c, buf[:c.ByteLen], tt.want)
				}
				return
			}
			if c.Status == verbs.StatusSuccess {
				t.Fatalf("gapped Send completed: %d bytes handed up, %d of them the buffer's old contents",
					c.ByteLen, bytes.Count(buf[:c.ByteLen], []byte{staleMarker}))
			}
			term, err := peer.terminate(nil)
			if err != nil {
				t.Fatal(err)
			}
			if term.Layer != LayerDDP || term.EType != DDPEtypeUntaggedBuf || term.Code != DDPCodeUInvalidMO {
				t.Fatalf("Terminate %v, want DDP untagged buffer error Invalid MO", &term)
			}
		})
	}
}

// FuzzUntaggedReassembly cuts Sends into segments at offsets the fuzzer
// picks (gaps, overlaps, rewinds, Last flags anywhere, MSNs out of
// order) and feeds them to the receive path with receive buffers full of
// a marker. Whatever the stream, the messages that complete are exactly
// those sent whole, in order, each holding the bytes its segments placed
// one after the other from offset 0 (RFC 5041 s5.4): no marker, no byte
// of another message. A stream with a bad segment ends in a Terminate.
func FuzzUntaggedReassembly(f *testing.F) {
	f.Add([]byte{0x0f, 0x8f})
	f.Add([]byte{0x0f, 0x1f, 0x8f})
	f.Add([]byte{0x08, 0x38, 0x98, 0x88})
	f.Add([]byte{0x0f, 0x80, 0x44, 0xd0, 0x8f})
	f.Fuzz(func(t *testing.T, ops []byte) {
		// Each op is a segment: bits 0-3 its payload length, bit 4
		// makes it misplaced (bits 5-6: a gap, an overlap, a rewind to
		// offset 0, the next MSN), bit 7 its Last flag.
		const bufSize, nbufs = 64, 8
		var (
			wire  []byte
			want  [][]byte // messages sent whole, in order
			cur   []byte
			fault bool // a segment the receiver must refuse was sent
			mo    uint32
			msn   = uint32(1)
			fill  = byte(1)
		)
		for _, op := range ops {
			if fault || len(want) == nbufs || len(wire) > 64<<10 {
				break
			}
			p := make([]byte, op&15)
			for k := range p {
				p[k] = fill
				if fill++; fill == staleMarker || fill == 0 {
					fill = 1
				}
			}
			segMO, segMSN := mo, msn
			if op&0x10 != 0 {
				switch op >> 5 & 3 {
				case 0:
					segMO += 4
				case 1:
					segMO -= min(mo, 3)
				case 2:
					segMO = 0
				case 3:
					segMSN++
				}
			}
			last := op&0x80 != 0
			wire = append(wire, sendFPDU(segMSN, sendSeg{segMO, p, last})...)
			cur = append(cur, p...)
			if fault = segMO != mo || segMSN != msn || len(cur) > bufSize; fault {
				break
			}
			mo += uint32(len(p))
			if last {
				want = append(want, cur)
				cur, mo, msn = nil, 0, msn+1
			}
		}
		q := &QP{br: bufio.NewReader(bytes.NewReader(wire)), pd: TableOf(NewProtectionDomain()), ird: 1,
			scq: verbs.NewSoftCQ(), rcq: verbs.NewSoftCQ(), irq: make(chan readRequest, 1)}
		q.cond.L = &q.mu
		bufs := make([][]byte, nbufs)
		for i := range bufs {
			bufs[i] = bytes.Repeat([]byte{staleMarker}, bufSize)
			q.rq.push(recvEntry{wrid: uint64(i), buf: bufs[i]})
		}
		err := q.receive(&rxState{sendMSN: 1, readMSN: 1})
		var rf *rxFault
		switch {
		case fault && !errors.As(err, &rf):
			t.Fatalf("receive: %v, want a Terminate for the misplaced segment", err)
		case !fault && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF):
			t.Fatalf("receive: %v, want the end of the stream", err)
		}
		k := 0
		for _, c := range drainCQ(t, q.rcq) {
			if c.Status != verbs.StatusSuccess {
				continue
			}
			if k == len(want) {
				t.Fatalf("a message completed (%d bytes) after the %d sent whole", c.ByteLen, len(want))
			}
			if data := bufs[c.WRID][:c.ByteLen]; !bytes.Equal(data, want[k]) {
				t.Fatalf("message %d: %x, sent %x", k, data, want[k])
			}
			k++
		}
		if k != len(want) {
			t.Fatalf("%d of the %d messages sent whole completed", k, len(want))
		}
	})
}
