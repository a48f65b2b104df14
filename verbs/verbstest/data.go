package verbstest

import (
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

const (
	lw  = verbs.AccessLocalWrite
	rw  = verbs.AccessRemoteWrite
	rr  = verbs.AccessRemoteRead
	all = lw | rw | rr
)

// testSendRecv: Sends of many sizes, each a gather list over two regions,
// arrive whole in the posted buffer with their length; the send
// completion reports the bytes sent. An empty Send and a solicited one
// arrive too.
func testSendRecv(t *testing.T, tg *Target) {
	c, s := tg.connect(t, nil, nil)
	const maxSize = 1 << 20
	rmr, rbuf := region(t, s.PD(), maxSize+4096, 0xee, lw)
	a, abuf := region(t, c.PD(), maxSize, 0, 0)
	b, bbuf := region(t, c.PD(), maxSize, 0, 0)
	pattern(abuf, 1)
	pattern(bbuf, 2)
	for i, n := range []int{0, 1, 7, 100, 4096, 65537, maxSize} {
		wrid := uint64(i + 1)
		postRecv(t, s, wrid, rmr, 0, len(rbuf))
		// The first half from a at offset 3, the rest from b.
		var sgl []verbs.SGE
		if n > 0 {
			h := (n + 1) / 2
			sgl = append(sgl, verbs.SGE{MR: a, Offset: 3, Length: uint32(h)})
			if n-h > 0 {
				sgl = append(sgl, verbs.SGE{MR: b, Offset: 0, Length: uint32(n - h)})
			}
		}
		postSend(t, c, verbs.SendWR{WRID: wrid, Opcode: verbs.OpSend, SGL: sgl, Solicited: i%2 == 1})
		expectLen(t, PollOne(t, c.SendCQ()), wrid, verbs.OpSend, n)
		expectLen(t, PollOne(t, s.RecvCQ()), wrid, verbs.OpRecv, n)
		sameBytes(t, name("Send of %d bytes", n), rbuf[:n], gatherBytes(sgl))
	}
	if c.Err() != nil || s.Err() != nil {
		t.Fatalf("queue pairs broke: %v, %v", c.Err(), s.Err())
	}
}

// gatherBytes returns the concatenation of what sgl names.
func gatherBytes(sgl []verbs.SGE) []byte {
	var out []byte
	for _, e := range sgl {
		out = append(out, e.MR.Bytes()[e.Offset:e.Offset+uint64(e.Length)]...)
	}
	return out
}

// testGatherScatter: a Send gathered from SendSGEs elements (in an order
// unlike memory order) is their concatenation; one element more is
// refused at post time. A receive with RecvSGEs elements scatters the
// message across them in order; one element more is refused.
func testGatherScatter(t *testing.T, tg *Target) {
	c, s := tg.connect(t, nil, nil)
	src, sbuf := region(t, c.PD(), 4096, 0, 0)
	pattern(sbuf, 3)
	rmr, rbuf := region(t, s.PD(), 8192, 0xee, lw)

	k := tg.Caps.SendSGEs
	sgl := make([]verbs.SGE, k)
	var want []byte
	for i := range sgl {
		off := uint64(100 * (k - i)) // descending offsets
		sgl[i] = verbs.SGE{MR: src, Offset: off, Length: uint32(10 + i)}
		want = append(want, sbuf[off:off+uint64(10+i)]...)
	}
	postRecv(t, s, 1, rmr, 0, 4096)
	postSend(t, c, verbs.SendWR{WRID: 1, Opcode: verbs.OpSend, SGL: sgl})
	expectLen(t, PollOne(t, c.SendCQ()), 1, verbs.OpSend, len(want))
	expectLen(t, PollOne(t, s.RecvCQ()), 1, verbs.OpRecv, len(want))
	sameBytes(t, "gathered Send", rbuf[:len(want)], want)
	over := append(append([]verbs.SGE(nil), sgl...), verbs.SGE{MR: src, Length: 1})
	if err := c.PostSend(verbs.SendWR{WRID: 2, Opcode: verbs.OpSend, SGL: over}); !isInvalidWR(err) {
		t.Fatalf("Send with %d SGEs (provider limit %d): %v, want ErrInvalidWR", len(over), k, err)
	}

	// Scatter: element i is 5+i bytes at descending offsets.
	r := tg.Caps.RecvSGEs
	rsgl := make([]verbs.SGE, r)
	total := 0
	for i := range rsgl {
		rsgl[i] = verbs.SGE{MR: rmr, Offset: uint64(4096 + 200*(r-i)), Length: uint32(5 + i)}
		total += 5 + i
	}
	msg := sbuf[:total]
	if err := s.PostRecv(verbs.RecvWR{WRID: 3, SGL: rsgl}); err != nil {
		t.Fatalf("receive with %d SGEs: %v", r, err)
	}
	postSend(t, c, verbs.SendWR{WRID: 3, Opcode: verbs.OpSend, SGL: []verbs.SGE{{MR: src, Length: uint32(total)}}})
	expectLen(t, PollOne(t, c.SendCQ()), 3, verbs.OpSend, total)
	expectLen(t, PollOne(t, s.RecvCQ()), 3, verbs.OpRecv, total)
	sameBytes(t, "scattered receive", gatherBytes(rsgl), msg)
	rover := append(append([]verbs.SGE(nil), rsgl...), verbs.SGE{MR: rmr, Length: 1})
	if err := s.PostRecv(verbs.RecvWR{WRID: 4, SGL: rover}); !isInvalidWR(err) {
		t.Fatalf("receive with %d SGEs (provider limit %d): %v, want ErrInvalidWR", len(rover), r, err)
	}
	if c.Err() != nil || s.Err() != nil {
		t.Fatalf("queue pairs broke: %v, %v", c.Err(), s.Err())
	}
}

// testWriteRead: RDMA Writes land exactly at their offset, up to the last
// byte of the region and no further; an RDMA Read after a Write returns
// the written bytes (reads and writes are ordered on a queue pair); the
// bytes around each access keep their value.
func testWriteRead(t *testing.T, tg *Target) {
	c, s := tg.connect(t, nil, nil)
	const size = 3 * 4096
	const guard = 0xa5
	rmr, rbuf := region(t, s.PD(), size, guard, all)
	src, sbuf := region(t, c.PD(), 4<<20, 0, 0)
	sink, kbuf := region(t, c.PD(), 4<<20, 0, lw)
	big, bbuf := region(t, s.PD(), 4<<20, guard, all)
	for i, cs := range []struct {
		mr       *verbs.MemoryRegion
		buf      []byte
		off, n   int
		sgl      int // gather elements of the Write
		readSGEs int // scatter elements of the Read's sink
	}{
		{rmr, rbuf, 0, 1, 1, 1},
		{rmr, rbuf, 13, 4097, 3, tg.Caps.ReadSinkSGEs},
		{rmr, rbuf, size - 5000, 5000, 2, 1}, // ends on the region's last byte
		{rmr, rbuf, 0, size, tg.Caps.SendSGEs, tg.Caps.ReadSinkSGEs},
		{big, bbuf, 1, 4<<20 - 1, 2, 1},
	} {
		wrid := uint64(10 * (i + 1))
		for j := range cs.buf {
			cs.buf[j] = guard
		}
		data := sbuf[:cs.n]
		pattern(data, uint64(i+10))
		raddr := cs.mr.RemoteAddr() + uint64(cs.off)
		postSend(t, c, verbs.SendWR{WRID: wrid, Opcode: verbs.OpRDMAWrite, SGL: split(src, 0, cs.n, cs.sgl),
			RemoteSTag: cs.mr.STag(), RemoteOffset: raddr})
		expectLen(t, PollOne(t, c.SendCQ()), wrid, verbs.OpRDMAWrite, cs.n)
		for j := range kbuf[:cs.n] {
			kbuf[j] = 0
		}
		postSend(t, c, verbs.SendWR{WRID: wrid + 1, Opcode: verbs.OpRDMARead, SGL: split(sink, 0, cs.n, cs.readSGEs),
			Length: uint32(cs.n), RemoteSTag: cs.mr.STag(), RemoteOffset: raddr})
		expectLen(t, PollOne(t, c.SendCQ()), wrid+1, verbs.OpRDMARead, cs.n)
		sameBytes(t, name("RDMA Read of %d bytes at %d", cs.n, cs.off), kbuf[:cs.n], data)
		fence(t, c, s, rmr, wrid+2)
		sameBytes(t, name("RDMA Write of %d bytes at %d", cs.n, cs.off), cs.buf[cs.off:cs.off+cs.n], data)
		allBytes(t, "before the Write", cs.buf[:cs.off], guard)
		allBytes(t, "after the Write", cs.buf[cs.off+cs.n:], guard)
	}
	// A Read sink of one element more than the provider takes is
	// refused at post time.
	k := tg.Caps.ReadSinkSGEs + 1
	if err := c.PostSend(verbs.SendWR{WRID: 99, Opcode: verbs.OpRDMARead, SGL: split(sink, 0, k, k), Length: uint32(k),
		RemoteSTag: rmr.STag(), RemoteOffset: rmr.RemoteAddr()}); !isInvalidWR(err) {
		t.Fatalf("RDMA Read into %d SGEs (provider limit %d): %v, want ErrInvalidWR", k, k-1, err)
	}
	if c.Err() != nil || s.Err() != nil {
		t.Fatalf("queue pairs broke: %v, %v", c.Err(), s.Err())
	}
}

// testFastRegWindow: a fast-registration region exposes exactly the bytes
// it is bound to (RFC 8166 s8.1 relies on it): Writes and Reads reach the
// window's first and last byte, the rest of the registered memory around
// it is untouched, and binding it again after an invalidation gives a new
// STag for the new bytes.
func testFastRegWindow(t *testing.T, tg *Target) {
	c, s := tg.connect(t, nil, nil)
	const guard = 0x5a
	target, tbuf := region(t, s.PD(), 2*4096, guard, lw)
	recv, _ := region(t, s.PD(), 4096, 0, lw)
	src, sbuf := region(t, c.PD(), 4096, 0, 0)
	sink, kbuf := region(t, c.PD(), 4096, 0, lw)
	pattern(sbuf, 7)
	for i, b := range []struct{ off, n int }{{100, 1000}, {4000, 200}, {0, 8192}, {8191, 1}} {
		wrid := uint64(10 * (i + 1))
		for j := range tbuf {
			tbuf[j] = guard
		}
		w := window(t, s, target, uint64(b.off), b.n, all)
		n := min(b.n, len(sbuf))
		// Write the window's last n bytes, read them back.
		at := w.RemoteAddr() + uint64(b.n-n)
		postSend(t, c, verbs.SendWR{WRID: wrid, Opcode: verbs.OpRDMAWrite, SGL: split(src, 0, n, 2), RemoteSTag: w.STag(), RemoteOffset: at})
		expectLen(t, PollOne(t, c.SendCQ()), wrid, verbs.OpRDMAWrite, n)
		postSend(t, c, verbs.SendWR{WRID: wrid + 1, Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{{MR: sink, Length: uint32(n)}},
			Length: uint32(n), RemoteSTag: w.STag(), RemoteOffset: at})
		expectLen(t, PollOne(t, c.SendCQ()), wrid+1, verbs.OpRDMARead, n)
		fence(t, c, s, recv, wrid+2)
		end := b.off + b.n
		sameBytes(t, name("window [%d, +%d)", b.off, b.n), tbuf[end-n:end], sbuf[:n])
		sameBytes(t, "read back from the window", kbuf[:n], sbuf[:n])
		allBytes(t, "registered memory before the window", tbuf[:end-n], guard)
		allBytes(t, "registered memory after the window", tbuf[end:], guard)
		old := w.STag()
		if err := w.Invalidate(); err != nil {
			t.Fatalf("invalidate window: %v", err)
		}
		if w.Valid() {
			t.Fatal("window valid after Invalidate")
		}
		nw, err := w.FastRegister(target, 0, 64, all)
		if err != nil {
			t.Fatalf("bind the window again: %v", err)
		}
		if nw == old {
			t.Fatalf("bound again under the same STag %#x", old)
		}
		if err := w.Invalidate(); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.PD().LiveRemoteRegions(); n != 0 {
		t.Fatalf("%d remotely accessible regions left after invalidating every window", n)
	}
}

// testReadDepth: more RDMA Reads than the ORD are queued, not refused;
// each completes once, in posting order, with its own bytes.
func testReadDepth(t *testing.T, tg *Target) {
	c, s := tg.connect(t, &verbs.ConnParams{ORD: 2}, &verbs.ConnParams{IRD: 2})
	const reads, each = 40, 3000
	src, sbuf := region(t, s.PD(), reads*each, 0, rr)
	pattern(sbuf, 11)
	sink, kbuf := region(t, c.PD(), reads*each, 0, lw)
	for i := range reads {
		postSend(t, c, verbs.SendWR{WRID: uint64(i), Opcode: verbs.OpRDMARead,
			SGL:    []verbs.SGE{{MR: sink, Offset: uint64(i * each), Length: each}},
			Length: each, RemoteSTag: src.STag(), RemoteOffset: src.RemoteAddr() + uint64((reads-1-i)*each)})
	}
	for i, wc := range PollN(t, c.SendCQ(), reads) {
		expectLen(t, wc, uint64(i), verbs.OpRDMARead, each)
	}
	for i := range reads {
		sameBytes(t, name("read %d", i), kbuf[i*each:(i+1)*each], sbuf[(reads-1-i)*each:(reads-i)*each])
	}
	if c.Err() != nil || s.Err() != nil {
		t.Fatalf("queue pairs broke: %v, %v", c.Err(), s.Err())
	}
}
