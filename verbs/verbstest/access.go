package verbstest

import (
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

// denyEnv is what a refused-access case works with.
type denyEnv struct {
	t        *testing.T
	c, s     verbs.QueuePair
	recv     *verbs.MemoryRegion // server receive buffers (for fences)
	warm     *verbs.MemoryRegion // client bytes equal to the guard
	warmSink *verbs.MemoryRegion
}

// guard is the value of every byte a refused access must not change.
const guard = 0xc3

// access is one refused remote access: the operation, the STag and
// address it names, its length, and the memory that must stay untouched
// (the target's for a Write, the initiator's sink for a Read).
type access struct {
	write   bool
	stag    uint32
	addr    uint64
	n       int
	backing []byte
}

// warmWrite does an RDMA Write the target accepts, of guard bytes, and
// waits until it is placed: the access that is refused afterwards then
// follows a working one.
func (e *denyEnv) warmWrite(stag uint32, addr uint64, n int) {
	e.t.Helper()
	postSend(e.t, e.c, verbs.SendWR{WRID: 50, Opcode: verbs.OpRDMAWrite, SGL: []verbs.SGE{{MR: e.warm, Length: uint32(n)}}, RemoteSTag: stag, RemoteOffset: addr})
	expectLen(e.t, PollOne(e.t, e.c.SendCQ()), 50, verbs.OpRDMAWrite, n)
	fence(e.t, e.c, e.s, e.recv, 51)
}

// warmRead does an RDMA Read the target accepts.
func (e *denyEnv) warmRead(stag uint32, addr uint64, n int) {
	e.t.Helper()
	postSend(e.t, e.c, verbs.SendWR{WRID: 52, Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{{MR: e.warmSink, Length: uint32(n)}}, Length: uint32(n), RemoteSTag: stag, RemoteOffset: addr})
	expectLen(e.t, PollOne(e.t, e.c.SendCQ()), 52, verbs.OpRDMARead, n)
}

// badKey returns stag with another key byte: a key never issued.
func badKey(stag uint32) uint32 { return stag&^0xff | (stag+0x35)&0xff }

// denyCase is one refused remote access of testRemoteAccessDenied.
type denyCase struct {
	name    string
	prepare func(e *denyEnv) access
	served  func(c Caps) bool // the device serves the access (a documented gap)
}

// testRemoteAccessDenied: an RDMA Write or Read outside a registration
// (past its end, before a window's start, without the right, under a key
// never issued, or after the region was invalidated or deregistered)
// never touches memory; the initiator's request completes with the
// provider's refusal status, both queue pairs break, posted receives and
// later work requests complete as flushed.
func testRemoteAccessDenied(t *testing.T, tg *Target) {
	var cases []denyCase
	cases = append(cases, boundsDenied()...)
	cases = append(cases, rightsDenied()...)
	cases = append(cases, invalidatedDenied()...)
	for _, cs := range cases {
		t.Run(cs.name, func(t *testing.T) {
			c, s := tg.connect(t, nil, nil)
			e := &denyEnv{t: t, c: c, s: s}
			e.recv, _ = region(t, s.PD(), 4096, 0, lw)
			e.warm, _ = region(t, c.PD(), 4096, guard, 0)
			e.warmSink, _ = region(t, c.PD(), 4096, 0, lw)
			a := cs.prepare(e)
			if cs.served != nil && cs.served(tg.Caps) {
				t.Logf("the provider serves this access (Caps: %+v)", tg.Caps)
				e.warmRead(a.stag, a.addr, a.n)
				return
			}
			deny(t, tg, e, a)
		})
	}
}

// boundsDenied are accesses outside a region's or window's bytes.
func boundsDenied() []denyCase {
	return []denyCase{
		{"WritePastEnd", func(e *denyEnv) access {
			mr, b := region(e.t, e.s.PD(), 4096, guard, lw|rw)
			return access{true, mr.STag(), mr.RemoteAddr() + 4095, 2, b}
		}, nil},
		{"WriteFarBeyondEnd", func(e *denyEnv) access {
			mr, b := region(e.t, e.s.PD(), 4096, guard, lw|rw)
			return access{true, mr.STag(), mr.RemoteAddr() + 1<<40, 1, b}
		}, nil},
		{"ReadPastEnd", func(e *denyEnv) access {
			mr, _ := region(e.t, e.s.PD(), 4096, guard, rr)
			return access{false, mr.STag(), mr.RemoteAddr() + 4095, 2, nil}
		}, nil},
		{"WritePastWindow", func(e *denyEnv) access {
			target, b := region(e.t, e.s.PD(), 2*4096, guard, lw)
			w := window(e.t, e.s, target, 100, 1000, lw|rw)
			return access{true, w.STag(), w.RemoteAddr(), 1001, b}
		}, nil},
		{"WriteBeforeWindow", func(e *denyEnv) access {
			target, b := region(e.t, e.s.PD(), 2*4096, guard, lw)
			w := window(e.t, e.s, target, 100, 1000, lw|rw)
			return access{true, w.STag(), w.RemoteAddr() - 1, 2, b}
		}, nil},
		{"ReadPastWindow", func(e *denyEnv) access {
			target, _ := region(e.t, e.s.PD(), 2*4096, guard, lw)
			w := window(e.t, e.s, target, 100, 1000, rr)
			return access{false, w.STag(), w.RemoteAddr() + 999, 2, nil}
		}, nil},
	}
}

// rightsDenied are accesses without the right, or under a key never
// issued.
func rightsDenied() []denyCase {
	return []denyCase{
		{"WriteWithoutRight", func(e *denyEnv) access {
			mr, b := region(e.t, e.s.PD(), 4096, guard, lw|rr)
			return access{true, mr.STag(), mr.RemoteAddr(), 8, b}
		}, nil},
		{"ReadWithoutRight", func(e *denyEnv) access {
			mr, _ := region(e.t, e.s.PD(), 4096, guard, lw|rw)
			return access{false, mr.STag(), mr.RemoteAddr(), 8, nil}
		}, func(c Caps) bool { return c.ReadRightUnchecked }},
		{"WriteUnknownKey", func(e *denyEnv) access {
			mr, b := region(e.t, e.s.PD(), 4096, guard, lw|rw)
			return access{true, badKey(mr.STag()), mr.RemoteAddr(), 8, b}
		}, nil},
		{"ReadUnknownKey", func(e *denyEnv) access {
			mr, _ := region(e.t, e.s.PD(), 4096, guard, rr)
			return access{false, badKey(mr.STag()), mr.RemoteAddr(), 8, nil}
		}, nil},
	}
}

// invalidatedDenied are accesses after the region was invalidated (by
// the synchronous call or a local-invalidate work request) or
// deregistered.
func invalidatedDenied() []denyCase {
	return []denyCase{
		{"WriteAfterInvalidate", func(e *denyEnv) access {
			mr, b := region(e.t, e.s.PD(), 4096, guard, lw|rw)
			stag, addr := mr.STag(), mr.RemoteAddr()
			e.warmWrite(stag, addr, 64)
			if err := mr.Invalidate(); err != nil || mr.Valid() {
				e.t.Fatalf("invalidate: %v (valid %v)", err, mr.Valid())
			}
			return access{true, stag, addr, 8, b}
		}, nil},
		{"WriteAfterWindowInvalidate", func(e *denyEnv) access {
			target, b := region(e.t, e.s.PD(), 2*4096, guard, lw)
			w := window(e.t, e.s, target, 100, 1000, lw|rw)
			stag, addr := w.STag(), w.RemoteAddr()
			e.warmWrite(stag, addr, 1000)
			if err := w.Invalidate(); err != nil {
				e.t.Fatalf("invalidate window: %v", err)
			}
			return access{true, stag, addr, 8, b}
		}, nil},
		{"ReadAfterWindowInvalidate", func(e *denyEnv) access {
			target, _ := region(e.t, e.s.PD(), 2*4096, guard, lw)
			w := window(e.t, e.s, target, 100, 1000, rr)
			stag, addr := w.STag(), w.RemoteAddr()
			e.warmRead(stag, addr, 1000)
			if err := w.Invalidate(); err != nil {
				e.t.Fatalf("invalidate window: %v", err)
			}
			return access{false, stag, addr, 8, nil}
		}, nil},
		{"ReadAfterDeregister", func(e *denyEnv) access {
			mr, _ := region(e.t, e.s.PD(), 4096, guard, rr)
			stag, addr := mr.STag(), mr.RemoteAddr()
			e.warmRead(stag, addr, 100)
			if err := mr.Deregister(); err != nil {
				e.t.Fatalf("deregister: %v", err)
			}
			return access{false, stag, addr, 8, nil}
		}, nil},
		{"WriteAfterLocalInvalidateWR", func(e *denyEnv) access {
			target, b := region(e.t, e.s.PD(), 2*4096, guard, lw)
			w := bindWR(e.t, e.s, verbs.OpFastRegister, target, 100, 1000, lw|rw)
			stag, addr := w.STag(), w.RemoteAddr()
			e.warmWrite(stag, addr, 1000)
			invalidateWR(e.t, e.s, w)
			return access{true, stag, addr, 8, b}
		}, nil},
		{"ReadAfterLocalInvalidateWR", func(e *denyEnv) access {
			mr, _ := region(e.t, e.s.PD(), 4096, guard, rr)
			stag, addr := mr.STag(), mr.RemoteAddr()
			e.warmRead(stag, addr, 100)
			invalidateWR(e.t, e.s, mr)
			return access{false, stag, addr, 8, nil}
		}, nil},
	}
}

// deny runs the refused access a on e and checks its aftermath.
func deny(t *testing.T, tg *Target, e *denyEnv, a access) {
	t.Helper()
	c, s := e.c, e.s
	crecv, _ := region(t, c.PD(), 4096, 0, lw)
	postRecv(t, s, 1, e.recv, 0, 16)
	postRecv(t, c, 2, crecv, 0, 16)
	if a.write {
		src, _ := region(t, c.PD(), a.n, 0x11, 0)
		postSend(t, c, verbs.SendWR{WRID: 10, Opcode: verbs.OpRDMAWrite, SGL: []verbs.SGE{{MR: src, Length: uint32(a.n)}}, RemoteSTag: a.stag, RemoteOffset: a.addr})
		Expect(t, PollOne(t, c.SendCQ()), 10, tg.Caps.WriteRefused, verbs.OpRDMAWrite)
	} else {
		sink, sbuf := region(t, c.PD(), a.n, guard, lw)
		a.backing = sbuf
		postSend(t, c, verbs.SendWR{WRID: 10, Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{{MR: sink, Length: uint32(a.n)}}, Length: uint32(a.n), RemoteSTag: a.stag, RemoteOffset: a.addr})
		Expect(t, PollOne(t, c.SendCQ()), 10, tg.Caps.ReadRefused, verbs.OpRDMARead)
	}
	broken(t, s, "target")
	broken(t, c, "initiator")
	Expect(t, PollOne(t, s.RecvCQ()), 1, verbs.StatusFlushed, verbs.OpRecv)
	Expect(t, PollOne(t, c.RecvCQ()), 2, verbs.StatusFlushed, verbs.OpRecv)
	allBytes(t, "memory of the refused access", a.backing, guard)
	flushedAfter(t, c, crecv)
	flushedAfter(t, s, e.recv)
}

// testReregister: Reregister gives the region a new STag that works,
// and the old one is refused.
func testReregister(t *testing.T, tg *Target) {
	c, s := tg.connect(t, nil, nil)
	e := &denyEnv{t: t, c: c, s: s}
	e.recv, _ = region(t, s.PD(), 4096, 0, lw)
	e.warm, _ = region(t, c.PD(), 4096, guard, 0)
	mr, b := region(t, s.PD(), 4096, guard, lw|rw)
	old, addr := mr.STag(), mr.RemoteAddr()
	e.warmWrite(old, addr, 100)
	nw, err := mr.Reregister(lw | rw)
	if err != nil {
		t.Fatalf("reregister: %v", err)
	}
	if nw == old || mr.STag() != nw || !mr.Valid() {
		t.Fatalf("reregistered STag %#x (was %#x, STag() %#x, valid %v)", nw, old, mr.STag(), mr.Valid())
	}
	e.warmWrite(nw, mr.RemoteAddr(), 100)
	deny(t, tg, e, access{true, old, addr + 200, 8, b})
}

// testSendWithInvalidate: a Send With Invalidate naming an STag the
// receiver exposed invalidates it before the receive completes (RFC 5040
// s5.3, RFC 8166 s3.4.4 uses it): the receive reports the STag, the
// region is invalid and the peer's later access to it is refused. Where
// the device cannot invalidate such regions (Caps.RemoteInvalidate
// false), the receive fails with Caps.SendInvRefused and the region stays
// valid.
func testSendWithInvalidate(t *testing.T, tg *Target) {
	c, s := tg.connect(t, nil, nil)
	e := &denyEnv{t: t, c: c, s: s}
	e.recv, _ = region(t, s.PD(), 4096, 0, lw)
	rbuf, rb := region(t, s.PD(), 4096, 0, lw)
	target, tb := region(t, s.PD(), 2*4096, guard, lw)
	w := window(t, s, target, 100, 1000, lw|rw)
	plain, _ := region(t, s.PD(), 4096, guard, lw|rw)
	src, sbuf := region(t, c.PD(), 4096, 0, 0)
	copy(sbuf, "reply")
	if n := s.PD().LiveRemoteRegions(); n != 2 {
		t.Fatalf("%d remotely accessible regions, want 2", n)
	}
	stag, addr := w.STag(), w.RemoteAddr()
	postRecv(t, s, 1, rbuf, 0, 64)
	postSend(t, c, verbs.SendWR{WRID: 1, Opcode: verbs.OpSendWithInvalidate, InvalidateSTag: stag, SGL: []verbs.SGE{{MR: src, Length: 5}}})
	if !tg.Caps.RemoteInvalidate && !tg.Caps.WindowInvalidate {
		rc := PollOne(t, s.RecvCQ())
		Expect(t, rc, 1, tg.Caps.SendInvRefused, verbs.OpRecv)
		broken(t, s, "receiver")
		if !w.Valid() {
			t.Fatal("the window was invalidated although the provider says it cannot be")
		}
		return
	}
	expectLen(t, PollOne(t, c.SendCQ()), 1, verbs.OpSendWithInvalidate, 5)
	rc := PollOne(t, s.RecvCQ())
	if tg.Caps.InvalidationUnreported {
		expectLen(t, rc, 1, verbs.OpRecv, 5)
		if string(rb[:5]) != "reply" || !w.Valid() {
			t.Fatalf("receive %+v, data %q, window valid %v", rc, rb[:5], w.Valid())
		}
		// The device did invalidate the key: the peer's access with
		// it is refused.
		deny(t, tg, e, access{true, stag, addr, 8, tb})
		return
	}
	expectLen(t, rc, 1, verbs.OpRecvWithInvalidate, 5)
	if rc.InvalidatedSTag != stag || string(rb[:5]) != "reply" {
		t.Fatalf("receive %+v, data %q: want invalidated STag %#x and \"reply\"", rc, rb[:5], stag)
	}
	if w.Valid() || s.PD().LiveRemoteRegions() != 1 {
		t.Fatalf("window valid %v after remote invalidation, %d live remote regions", w.Valid(), s.PD().LiveRemoteRegions())
	}
	if !tg.Caps.RemoteInvalidate {
		// Windows only: registered memory is refused.
		postRecv(t, s, 2, rbuf, 0, 64)
		postSend(t, c, verbs.SendWR{WRID: 2, Opcode: verbs.OpSendWithInvalidate, InvalidateSTag: plain.STag(), SGL: []verbs.SGE{{MR: src, Length: 1}}})
		Expect(t, PollOne(t, s.RecvCQ()), 2, tg.Caps.SendInvRefused, verbs.OpRecv)
		broken(t, s, "receiver")
		if !plain.Valid() {
			t.Fatal("registered memory was invalidated although the provider says it cannot be")
		}
		return
	}
	// The solicited form, for a region of registered memory.
	postRecv(t, s, 2, rbuf, 0, 64)
	postSend(t, c, verbs.SendWR{WRID: 2, Opcode: verbs.OpSendWithInvalidate, InvalidateSTag: plain.STag(), Solicited: true, SGL: []verbs.SGE{{MR: src, Length: 1}}})
	expectLen(t, PollOne(t, c.SendCQ()), 2, verbs.OpSendWithInvalidate, 1)
	rc = PollOne(t, s.RecvCQ())
	expectLen(t, rc, 2, verbs.OpRecvWithInvalidate, 1)
	if rc.InvalidatedSTag != plain.STag() || plain.Valid() || s.PD().LiveRemoteRegions() != 0 {
		t.Fatalf("receive %+v: region valid %v, %d live remote regions", rc, plain.Valid(), s.PD().LiveRemoteRegions())
	}
	deny(t, tg, e, access{true, stag, addr, 8, tb})
}

// testInvalidateNotOffered: a Send With Invalidate naming a key the
// receiver never exposed (a region with local access only) is not
// honoured: the receive does not complete successfully, the receiver's
// queue pair breaks and the region stays valid.
func testInvalidateNotOffered(t *testing.T, tg *Target) {
	c, s := tg.connect(t, nil, nil)
	rbuf, _ := region(t, s.PD(), 4096, 0, lw)
	local, _ := region(t, s.PD(), 4096, 0, lw)
	src, _ := region(t, c.PD(), 4096, 0, 0)
	postRecv(t, s, 1, rbuf, 0, 64)
	postSend(t, c, verbs.SendWR{WRID: 1, Opcode: verbs.OpSendWithInvalidate, InvalidateSTag: local.STag(), SGL: []verbs.SGE{{MR: src, Length: 5}}})
	rc := PollOne(t, s.RecvCQ())
	if tg.Caps.InvalidationUnreported {
		// The provider is not told, so it cannot refuse.
		expectLen(t, rc, 1, verbs.OpRecv, 5)
		t.Logf("the device invalidated a key never offered without reporting it (Caps.InvalidationUnreported)")
		return
	}
	if rc.WRID != 1 || rc.Status == verbs.StatusSuccess {
		t.Fatalf("receive %+v: a Send With Invalidate of a key never offered completed", rc)
	}
	broken(t, s, "receiver")
	if !local.Valid() {
		t.Fatal("a region with local access only was invalidated by the peer")
	}
	flushedAfter(t, s, rbuf)
}

// testMessageTooLong: a Send longer than the posted buffer completes the
// receive with Caps.RecvTooLong, the sender's request with
// Caps.SendRefused, and breaks both queue pairs; nothing outside the
// buffer is written.
func testMessageTooLong(t *testing.T, tg *Target) {
	c, s := tg.connect(t, nil, nil)
	rbuf, rb := region(t, s.PD(), 4096, guard, lw)
	src, _ := region(t, c.PD(), 4096, 0x11, 0)
	postRecv(t, s, 1, rbuf, 100, 10)
	postSend(t, c, verbs.SendWR{WRID: 1, Opcode: verbs.OpSend, SGL: []verbs.SGE{{MR: src, Length: 11}}})
	if rc := PollOne(t, s.RecvCQ()); rc.WRID != 1 || rc.Status != tg.Caps.RecvTooLong {
		t.Fatalf("receive %+v (%v), want %v; receiver error %v", rc, rc.Status, tg.Caps.RecvTooLong, s.Err())
	}
	Expect(t, PollOne(t, c.SendCQ()), 1, tg.Caps.SendRefused, verbs.OpSend)
	broken(t, s, "receiver")
	broken(t, c, "sender")
	allBytes(t, "memory after the receive buffer", rb[110:], guard)
	allBytes(t, "memory before the receive buffer", rb[:100], guard)
}
