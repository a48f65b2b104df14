package iwarp

import (
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

// TestLocalInvalidateWaitsForAccess: a local-invalidate work request
// makes the key invalid when it is posted, but completes only after the
// table's access in progress ended (RFC 8166 s8.1), and a Send posted
// after it completes after it (the send queue completes in order).
func TestLocalInvalidateWaitsForAccess(t *testing.T) {
	c, s := pair(t, nil, nil)
	mr := reg(t, s.PD(), make([]byte, 4096), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	_, r, err := TableOf(s.PD()).Begin(mr.STag(), verbs.AccessRemoteWrite, 0, 8)
	if err != nil {
		t.Fatal(err)
	}
	if err := postRecv(c, 1, make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	if err := s.PostSend(verbs.SendWR{WRID: 2, Opcode: verbs.OpLocalInvalidate, Binding: verbs.MemoryBinding{MR: mr}}); err != nil {
		t.Fatal(err)
	}
	if mr.Valid() {
		t.Fatal("region valid after its local invalidation was posted")
	}
	if err := s.PostSend(verbs.SendWR{WRID: 3, Opcode: verbs.OpSend}); err != nil {
		t.Fatal(err)
	}
	expect(t, pollOne(t, c.RecvCQ()), 1, verbs.StatusSuccess, verbs.OpRecv)
	var wc [2]verbs.Completion
	if n := s.SendCQ().TryPoll(wc[:]); n != 0 {
		t.Fatalf("completions %+v while the invalidated region is still accessed", wc[:n])
	}
	r.End()
	done := pollN(t, s.SendCQ(), 2)
	expect(t, done[0], 2, verbs.StatusSuccess, verbs.OpLocalInvalidate)
	expect(t, done[1], 3, verbs.StatusSuccess, verbs.OpSend)
}

// TestRegistrationFlushedOnBrokenQP: a registration work request posted
// on a broken queue pair completes as flushed and changes nothing.
func TestRegistrationFlushedOnBrokenQP(t *testing.T) {
	c, s := pair(t, nil, nil)
	target := reg(t, s.PD(), make([]byte, 4096), verbs.AccessLocalWrite)
	w, err := s.PD().AllocFastReg()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
	case <-testCtx(t).Done():
		t.Fatal("server queue pair still up after the client closed")
	}
	wr := verbs.SendWR{WRID: 4, Opcode: verbs.OpFastRegister,
		Binding: verbs.MemoryBinding{MR: w, Target: target, Length: 64, Access: verbs.AccessRemoteRead}}
	if err := s.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	expect(t, pollOne(t, s.SendCQ()), 4, verbs.StatusFlushed, verbs.OpFastRegister)
	if w.Valid() {
		t.Fatal("a flushed fast-register bound the region")
	}
}
