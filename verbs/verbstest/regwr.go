package verbstest

import (
	"encoding/binary"
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

// postBinding posts a registration work request (verbs.OpFastRegister or
// OpBindWindow) that binds a new fast-registration region to [off,
// off+n) of target with access, and returns the region; its STag is the
// new one once the post returned.
func postBinding(t testing.TB, qp verbs.QueuePair, op verbs.Opcode, wrid uint64, target *verbs.MemoryRegion, off uint64, n int, access verbs.Access) *verbs.MemoryRegion {
	t.Helper()
	w, err := target.PD().AllocFastReg()
	if err != nil {
		t.Fatalf("alloc fast registration: %v", err)
	}
	t.Cleanup(func() { _ = w.Deregister() })
	postSend(t, qp, verbs.SendWR{WRID: wrid, Opcode: op,
		Binding: verbs.MemoryBinding{MR: w, Target: target, Offset: off, Length: n, Access: access}})
	return w
}

// bindWR binds a region with a work request of op and waits for its
// completion.
func bindWR(t testing.TB, qp verbs.QueuePair, op verbs.Opcode, target *verbs.MemoryRegion, off uint64, n int, access verbs.Access) *verbs.MemoryRegion {
	t.Helper()
	w := postBinding(t, qp, op, 60, target, off, n, access)
	Expect(t, PollOne(t, qp.SendCQ()), 60, verbs.StatusSuccess, op)
	if !w.Valid() {
		t.Fatalf("%v completed, region not valid", op)
	}
	return w
}

// invalidateWR invalidates mr with a local-invalidate work request and
// waits for its completion: the key is then invalid.
func invalidateWR(t testing.TB, qp verbs.QueuePair, mr *verbs.MemoryRegion) {
	t.Helper()
	postSend(t, qp, verbs.SendWR{WRID: 61, Opcode: verbs.OpLocalInvalidate, Binding: verbs.MemoryBinding{MR: mr}})
	Expect(t, PollOne(t, qp.SendCQ()), 61, verbs.StatusSuccess, verbs.OpLocalInvalidate)
	if mr.Valid() {
		t.Fatal("local invalidate completed, region still valid")
	}
}

// testRegistrationWR: a fast-register (or bind) work request posted
// before a Send is in effect when the peer sees the Send (IB spec vol. 1
// s10.7.2.3; RFC 5040 s5.1): the peer writes and reads the bytes through
// the STag the Send carries, and nothing around them; the send queue
// completes in posting order; after a local-invalidate work request
// completed the peer's access with the key is refused.
func testRegistrationWR(t *testing.T, tg *Target) {
	for _, op := range []verbs.Opcode{verbs.OpFastRegister, verbs.OpBindWindow} {
		t.Run(op.String(), func(t *testing.T) {
			c, s := tg.connect(t, nil, nil)
			target, tbuf := region(t, s.PD(), 2*4096, guard, lw)
			offer, obuf := region(t, s.PD(), 16, 0, 0)
			crecv, cbuf := region(t, c.PD(), 4096, 0, lw)
			src, sbuf := region(t, c.PD(), 1000, 0, 0)
			sink, kbuf := region(t, c.PD(), 1000, 0, lw)
			pattern(sbuf, 11)

			postRecv(t, c, 1, crecv, 0, 16)
			w := postBinding(t, s, op, 2, target, 100, 1000, all)
			binary.BigEndian.PutUint32(obuf, w.STag())
			binary.BigEndian.PutUint64(obuf[4:], w.RemoteAddr())
			postSend(t, s, verbs.SendWR{WRID: 3, Opcode: verbs.OpSend, SGL: []verbs.SGE{{MR: offer, Length: 12}}})
			done := PollN(t, s.SendCQ(), 2)
			Expect(t, done[0], 2, verbs.StatusSuccess, op)
			Expect(t, done[1], 3, verbs.StatusSuccess, verbs.OpSend)
			expectLen(t, PollOne(t, c.RecvCQ()), 1, verbs.OpRecv, 12)

			stag, addr := binary.BigEndian.Uint32(cbuf), binary.BigEndian.Uint64(cbuf[4:])
			postSend(t, c, verbs.SendWR{WRID: 4, Opcode: verbs.OpRDMAWrite, SGL: []verbs.SGE{{MR: src, Length: 1000}}, RemoteSTag: stag, RemoteOffset: addr})
			expectLen(t, PollOne(t, c.SendCQ()), 4, verbs.OpRDMAWrite, 1000)
			postSend(t, c, verbs.SendWR{WRID: 5, Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{{MR: sink, Length: 1000}}, Length: 1000, RemoteSTag: stag, RemoteOffset: addr})
			expectLen(t, PollOne(t, c.SendCQ()), 5, verbs.OpRDMARead, 1000)
			sameBytes(t, "read back through the registration", kbuf[:1000], sbuf[:1000])
			sameBytes(t, "bytes written through the registration", tbuf[100:1100], sbuf[:1000])
			allBytes(t, "memory before the registration", tbuf[:100], guard)
			allBytes(t, "memory after the registration", tbuf[1100:], guard)

			invalidateWR(t, s, w)
			e := &denyEnv{t: t, c: c, s: s}
			e.recv, _ = region(t, s.PD(), 4096, 0, lw)
			deny(t, tg, e, access{false, stag, addr, 8, nil})
		})
	}
}

// testRegistrationWRErrors: a registration work request that cannot be
// carried out is refused at post time and leaves the region as it was.
func testRegistrationWRErrors(t *testing.T, tg *Target) {
	c, s := tg.connect(t, nil, nil)
	target, _ := region(t, s.PD(), 4096, 0, lw)
	other, _ := region(t, c.PD(), 4096, 0, lw)
	w := bindWR(t, s, verbs.OpFastRegister, target, 0, 64, all)
	stag := w.STag()
	for _, bad := range []struct {
		what string
		wr   verbs.SendWR
	}{
		{"bind a bound region", verbs.SendWR{Opcode: verbs.OpFastRegister,
			Binding: verbs.MemoryBinding{MR: w, Target: target, Length: 64, Access: all}}},
		{"bind past the target's end", verbs.SendWR{Opcode: verbs.OpFastRegister,
			Binding: verbs.MemoryBinding{MR: w, Target: target, Offset: 4000, Length: 200, Access: all}}},
		{"target of another domain", verbs.SendWR{Opcode: verbs.OpBindWindow,
			Binding: verbs.MemoryBinding{MR: w, Target: other, Length: 64, Access: all}}},
		{"invalidate a region of another domain", verbs.SendWR{Opcode: verbs.OpLocalInvalidate,
			Binding: verbs.MemoryBinding{MR: other}}},
		{"invalidate no region", verbs.SendWR{Opcode: verbs.OpLocalInvalidate}},
		{"with a gather list", verbs.SendWR{Opcode: verbs.OpLocalInvalidate, Binding: verbs.MemoryBinding{MR: w},
			SGL: []verbs.SGE{{MR: target, Length: 1}}}},
	} {
		if err := s.PostSend(bad.wr); err == nil {
			t.Fatalf("%s: posted", bad.what)
		}
	}
	if !w.Valid() || w.STag() != stag {
		t.Fatalf("refused requests changed the region: valid %v, STag %#x (was %#x)", w.Valid(), w.STag(), stag)
	}
	invalidateWR(t, s, w)
	if n := s.PD().LiveRemoteRegions(); n != 0 {
		t.Fatalf("%d remotely accessible regions left", n)
	}
}
