package verbstest

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

// isInvalidWR reports whether err is a refusal at post time.
func isInvalidWR(err error) bool { return errors.Is(err, verbs.ErrInvalidWR) }

// newPD makes a protection domain the way a transport does.
func newPD(tg *Target) *verbs.ProtectionDomain {
	if dp, ok := tg.Provider.(verbs.DomainProvider); ok {
		return dp.NewProtectionDomain()
	}
	return verbs.NewProtectionDomain()
}

// testPostErrors: malformed work requests, and elements that name no
// usable local memory (no region, outside it, deregistered, a
// fast-registration region, without local write for data placed
// locally, of another protection domain for a sink), are refused at post
// time with ErrInvalidWR; they leave no completion and the queue pair
// keeps working.
func testPostErrors(t *testing.T, tg *Target) {
	c, s := tg.connect(t, nil, nil)
	own, ob := region(t, c.PD(), 4096, 0, lw)
	noWrite, _ := region(t, c.PD(), 4096, 0, rr)
	other, _ := region(t, newPD(tg), 4096, 0, lw)
	dead, _ := region(t, c.PD(), 4096, 0, lw)
	if err := dead.Deregister(); err != nil {
		t.Fatal(err)
	}
	fast := window(t, c, own, 0, 8, lw|rw)
	sge := func(mr *verbs.MemoryRegion, off uint64, n uint32) []verbs.SGE {
		return []verbs.SGE{{MR: mr, Offset: off, Length: n}}
	}
	tooMany := make([]verbs.SGE, verbs.MaxSGE+1)
	for i := range tooMany {
		tooMany[i] = verbs.SGE{MR: own, Offset: uint64(i), Length: 1}
	}
	for _, cs := range []struct {
		what string
		wr   verbs.SendWR
	}{
		{"no opcode", verbs.SendWR{}},
		{"receive opcode", verbs.SendWR{Opcode: verbs.OpRecv}},
		{"receive-with-invalidate opcode", verbs.SendWR{Opcode: verbs.OpRecvWithInvalidate}},
		{"Read without a sink", verbs.SendWR{Opcode: verbs.OpRDMARead, Length: 1}},
		{"Read sink shorter than the Read", verbs.SendWR{Opcode: verbs.OpRDMARead, SGL: sge(own, 0, 4), Length: 5}},
		{"Read sink longer than the Read", verbs.SendWR{Opcode: verbs.OpRDMARead, SGL: sge(own, 0, 5), Length: 4}},
		{"Read sink without local write", verbs.SendWR{Opcode: verbs.OpRDMARead, SGL: sge(noWrite, 0, 1), Length: 1}},
		{"Read sink of another protection domain", verbs.SendWR{Opcode: verbs.OpRDMARead, SGL: sge(other, 0, 1), Length: 1}},
		{"Read sink deregistered", verbs.SendWR{Opcode: verbs.OpRDMARead, SGL: sge(dead, 0, 1), Length: 1}},
		{"Read sink a fast-registration region", verbs.SendWR{Opcode: verbs.OpRDMARead, SGL: sge(fast, 0, 1), Length: 1}},
		{"Read sink leaves its region", verbs.SendWR{Opcode: verbs.OpRDMARead, SGL: sge(own, 4090, 7), Length: 7}},
		{"Send element without a region", verbs.SendWR{Opcode: verbs.OpSend, SGL: sge(nil, 0, 1)}},
		{"Send element leaves its region", verbs.SendWR{Opcode: verbs.OpSend, SGL: append(sge(own, 0, 8), sge(own, 4090, 7)...)}},
		{"Send element of another protection domain", verbs.SendWR{Opcode: verbs.OpSend, SGL: sge(other, 0, 1)}},
		{"Send element beyond its region", verbs.SendWR{Opcode: verbs.OpSend, SGL: sge(own, 5000, 1)}},
		{"Send of more than MaxSGE elements", verbs.SendWR{Opcode: verbs.OpSend, SGL: tooMany}},
		{"Write from a deregistered region", verbs.SendWR{Opcode: verbs.OpRDMAWrite, SGL: sge(dead, 0, 1)}},
		{"Send With Invalidate from a fast-registration region", verbs.SendWR{Opcode: verbs.OpSendWithInvalidate, SGL: sge(fast, 0, 1)}},
	} {
		if err := c.PostSend(cs.wr); !isInvalidWR(err) {
			t.Errorf("%s: %v, want ErrInvalidWR", cs.what, err)
		}
	}
	for _, cs := range []struct {
		what string
		wr   verbs.RecvWR
	}{
		{"without local write", verbs.RecvWR{SGL: sge(noWrite, 0, 8)}},
		{"leaving its region", verbs.RecvWR{SGL: sge(own, 4090, 7)}},
		{"without a region", verbs.RecvWR{SGL: sge(nil, 0, 1)}},
		{"a fast-registration region", verbs.RecvWR{SGL: sge(fast, 0, 8)}},
		{"deregistered", verbs.RecvWR{SGL: sge(dead, 0, 8)}},
		{"of another protection domain", verbs.RecvWR{SGL: sge(other, 0, 8)}},
	} {
		if err := c.PostRecv(cs.wr); !isInvalidWR(err) {
			t.Errorf("receive %s: %v, want ErrInvalidWR", cs.what, err)
		}
	}
	var none [4]verbs.Completion
	if n, m := c.SendCQ().TryPoll(none[:]), c.RecvCQ().TryPoll(none[:]); n != 0 || m != 0 || c.Err() != nil {
		t.Fatalf("refused requests left completions (%d, %d: %+v) or broke the queue pair: %v", n, m, none, c.Err())
	}
	// The queue pair still works.
	copy(ob, "still fine")
	rmr, rb := region(t, s.PD(), 4096, 0, lw)
	postRecv(t, s, 1, rmr, 0, 64)
	postSend(t, c, verbs.SendWR{WRID: 1, Opcode: verbs.OpSend, SGL: sge(own, 0, 10)})
	expectLen(t, PollOne(t, c.SendCQ()), 1, verbs.OpSend, 10)
	expectLen(t, PollOne(t, s.RecvCQ()), 1, verbs.OpRecv, 10)
	sameBytes(t, "Send after refused requests", rb[:10], []byte("still fine"))
}

// testDisconnect: closing one end completes its posted receives as
// flushed with ErrClosed; the other end learns of the disconnect (Done,
// ErrConnectionLost or ErrTerminated) and flushes its own; work posted on
// either afterwards completes as flushed. Either side may close first.
func testDisconnect(t *testing.T, tg *Target) {
	for _, passive := range []bool{false, true} {
		t.Run(map[bool]string{false: "ActiveCloses", true: "PassiveCloses"}[passive], func(t *testing.T) {
			c, s := tg.connect(t, nil, nil)
			cb, _ := region(t, c.PD(), 4096, 0, lw)
			sb, _ := region(t, s.PD(), 4096, 0, lw)
			postRecv(t, c, 1, cb, 0, 64)
			postRecv(t, s, 2, sb, 0, 64)
			closer, closerBuf, other, otherBuf := c, cb, s, sb
			cw, ow := uint64(1), uint64(2)
			if passive {
				closer, closerBuf, other, otherBuf, cw, ow = s, sb, c, cb, 2, 1
			}
			if err := closer.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			if !errors.Is(closer.Err(), verbs.ErrClosed) {
				t.Fatalf("closed queue pair's error %v, want ErrClosed", closer.Err())
			}
			select {
			case <-closer.Done():
			default:
				t.Fatal("Done not closed after Close")
			}
			Expect(t, PollOne(t, closer.RecvCQ()), cw, verbs.StatusFlushed, verbs.OpRecv)
			broken(t, other, "peer of the closed queue pair")
			Expect(t, PollOne(t, other.RecvCQ()), ow, verbs.StatusFlushed, verbs.OpRecv)
			flushedAfter(t, closer, closerBuf)
			flushedAfter(t, other, otherBuf)
			if err := closer.Close(); err != nil {
				t.Fatalf("second close: %v", err)
			}
		})
	}
}

// testCompletionQueue: one queue may take both queues of a queue pair and
// the completions of several queue pairs; each work request completes
// exactly once, send completions in posting order and receives in
// arrival order; TryPoll does not block, Poll moves at most len(out) and
// ends with its context.
func testCompletionQueue(t *testing.T, tg *Target) {
	cq, scq := verbs.NewSoftCQ(), verbs.NewSoftCQ()
	c, s := tg.connect(t, &verbs.ConnParams{SendCQ: cq, RecvCQ: cq}, &verbs.ConnParams{SendCQ: scq, RecvCQ: scq})
	if c.SendCQ() != cq || c.RecvCQ() != cq || s.SendCQ() != scq {
		t.Fatal("queue pair does not use the completion queues it was given")
	}
	var out [8]verbs.Completion
	if n := cq.TryPoll(out[:]); n != 0 {
		t.Fatalf("TryPoll on an empty queue: %d", n)
	}
	if n, err := cq.Poll(context.Background(), nil); n != 0 || err != nil {
		t.Fatalf("Poll into no room: %d, %v", n, err)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if n, err := cq.Poll(done, out[:]); n != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("Poll with an ended context: %d, %v", n, err)
	}

	const n = 100
	csrc, cs := region(t, c.PD(), 8*n, 0, 0)
	ssrc, ss := region(t, s.PD(), 8*n, 0, 0)
	crecv, cr := region(t, c.PD(), 8*n, 0, lw)
	srecv, sr := region(t, s.PD(), 8*n, 0, lw)
	for i := range n {
		binary.BigEndian.PutUint64(cs[8*i:], uint64(i))
		binary.BigEndian.PutUint64(ss[8*i:], uint64(i)<<32)
		postRecv(t, s, uint64(1000+i), srecv, uint64(8*i), 8)
		postRecv(t, c, uint64(2000+i), crecv, uint64(8*i), 8)
	}
	for i := range n {
		postSend(t, c, verbs.SendWR{WRID: uint64(i), Opcode: verbs.OpSend, SGL: []verbs.SGE{{MR: csrc, Offset: uint64(8 * i), Length: 8}}})
		postSend(t, s, verbs.SendWR{WRID: uint64(3000 + i), Opcode: verbs.OpSend, SGL: []verbs.SGE{{MR: ssrc, Offset: uint64(8 * i), Length: 8}}})
	}
	check := func(q verbs.CompletionQueue, sendBase, recvBase uint64, recvBuf []byte, shift uint) {
		t.Helper()
		var nextSend, nextRecv uint64
		ctx := testCtx(t)
		for got := 0; got < 2*n; {
			k, err := q.Poll(ctx, out[:7])
			if err != nil || k < 1 || k > 7 {
				t.Fatalf("Poll: %d, %v after %d completions", k, err, got)
			}
			for _, wc := range out[:k] {
				switch {
				case wc.Opcode == verbs.OpSend && wc.WRID == sendBase+nextSend:
					expectLen(t, wc, wc.WRID, verbs.OpSend, 8)
					nextSend++
				case wc.Opcode == verbs.OpRecv && wc.WRID == recvBase+nextRecv:
					expectLen(t, wc, wc.WRID, verbs.OpRecv, 8)
					if v := binary.BigEndian.Uint64(recvBuf[8*nextRecv:]); v != nextRecv<<shift {
						t.Fatalf("receive %d holds message %#x", nextRecv, v)
					}
					nextRecv++
				default:
					t.Fatalf("completion %+v out of order (next send %d, next receive %d)", wc, sendBase+nextSend, recvBase+nextRecv)
				}
			}
			got += k
		}
	}
	check(cq, 0, 2000, cr, 32)
	check(scq, 3000, 1000, sr, 0)
	if k := cq.TryPoll(out[:]) + scq.TryPoll(out[:]); k != 0 {
		t.Fatalf("%d extra completions", k)
	}

	// A second queue pair shares the client's queue.
	c2, s2 := tg.connect(t, &verbs.ConnParams{SendCQ: cq, RecvCQ: cq}, nil)
	r2, _ := region(t, s2.PD(), 4096, 0, lw)
	postRecv(t, s2, 1, r2, 0, 8)
	postRecv(t, s, 1001, srecv, 0, 8)
	postSend(t, c2, verbs.SendWR{WRID: 77, Opcode: verbs.OpSend})
	postSend(t, c, verbs.SendWR{WRID: 78, Opcode: verbs.OpSend})
	seen := map[uint64]bool{}
	for _, wc := range PollN(t, cq, 2) {
		expectLen(t, wc, wc.WRID, verbs.OpSend, 0)
		seen[wc.WRID] = true
	}
	if !seen[77] || !seen[78] {
		t.Fatalf("completions of two queue pairs on one queue: %v", seen)
	}
}

// foreignCQ is a completion queue no provider made.
type foreignCQ struct{}

func (foreignCQ) Poll(context.Context, []verbs.Completion) (int, error) { return 0, nil }
func (foreignCQ) TryPoll([]verbs.Completion) int                        { return 0 }

// testForeignCQ: a provider refuses completion queues of another kind
// with ErrInvalidWR, on the active side at Dial, on the passive side at
// Listen or by rejecting the connection.
func testForeignCQ(t *testing.T, tg *Target) {
	ctx := testCtx(t)
	ln, err := tg.Provider.Listen(tg.ListenAddr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if qp, err := ln.Accept(ctx); err == nil {
			qp.Close()
		}
	}()
	if qp, err := tg.Provider.Dial(ctx, ln.Addr().String(), &verbs.ConnParams{SendCQ: foreignCQ{}}); !isInvalidWR(err) {
		if err == nil {
			qp.Close()
		}
		t.Fatalf("dial with a foreign completion queue: %v, want ErrInvalidWR", err)
	}
	bad, err := tg.Provider.Listen(tg.ListenAddr, &verbs.ConnParams{RecvCQ: foreignCQ{}})
	if err != nil {
		if !isInvalidWR(err) {
			t.Fatalf("listen with a foreign completion queue: %v, want ErrInvalidWR", err)
		}
		return
	}
	defer bad.Close()
	go func() {
		if qp, err := bad.Accept(ctx); err == nil {
			qp.Close()
		}
	}()
	if qp, err := tg.Provider.Dial(ctx, bad.Addr().String(), nil); err == nil {
		qp.Close()
		t.Fatal("a listener with a foreign completion queue accepted a connection")
	}
}

// samePrivateData compares received private data with what was sent,
// allowing the connection manager's zero padding (Caps.PaddedPrivateData).
func samePrivateData(t *testing.T, tg *Target, what string, got, sent []byte) {
	t.Helper()
	if !tg.Caps.PaddedPrivateData {
		sameBytes(t, what, got, sent)
		return
	}
	if len(got) < len(sent) {
		t.Fatalf("%s: %d bytes, sent %d", what, len(got), len(sent))
	}
	sameBytes(t, what, got[:len(sent)], sent)
	allBytes(t, what+" (padding)", got[len(sent):], 0)
}

// testPrivateData: the initiator's private data reaches OnConnect and
// the passive queue pair, the reply OnConnect returns reaches the
// initiator (RFC 8797 carries the RPC-over-RDMA parameters this way),
// ConnParams.PrivateData is the reply when OnConnect gives none, and the
// endpoints' addresses match.
func testPrivateData(t *testing.T, tg *Target) {
	req := make([]byte, 56) // the InfiniBand CM's request limit
	pattern(req, 21)
	rep := make([]byte, 196) // and its reply limit
	pattern(rep, 22)
	var mu sync.Mutex
	var seen *verbs.ConnRequest
	sp := &verbs.ConnParams{PrivateData: []byte("default!"), OnConnect: func(r *verbs.ConnRequest) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		cp := *r
		cp.PrivateData = append([]byte(nil), r.PrivateData...)
		seen = &cp
		if len(r.PrivateData) > 0 && r.PrivateData[0] == req[0] {
			return rep, nil
		}
		return nil, nil
	}}
	c, s := tg.connect(t, &verbs.ConnParams{PrivateData: req}, sp)
	mu.Lock()
	r := seen
	mu.Unlock()
	if r == nil {
		t.Fatal("OnConnect was not called")
	}
	samePrivateData(t, tg, "private data seen by OnConnect", r.PrivateData, req)
	samePrivateData(t, tg, "the passive side's PeerPrivateData", s.PeerPrivateData(), req)
	samePrivateData(t, tg, "the reply private data", c.PeerPrivateData(), rep)
	if r.RemoteAddr == nil || c.LocalAddr() == nil || s.RemoteAddr() == nil ||
		c.RemoteAddr().String() != s.LocalAddr().String() || s.RemoteAddr().String() != c.LocalAddr().String() {
		t.Fatalf("addresses: client %v -> %v, server %v <- %v, request from %v", c.LocalAddr(), c.RemoteAddr(), s.LocalAddr(), s.RemoteAddr(), r.RemoteAddr)
	}
	if c.ORD() < 1 || s.IRD() < 1 {
		t.Fatalf("read depths: client ORD %d, server IRD %d", c.ORD(), s.IRD())
	}
	// RFC 8797's eight bytes, answered with the listener's default.
	short := []byte{0xf6, 0xab, 0xa6, 0x01, 0x01, 0x00, 0x0f, 0x0f}
	c2, _ := tg.connect(t, &verbs.ConnParams{PrivateData: short}, sp)
	samePrivateData(t, tg, "default reply private data", c2.PeerPrivateData(), []byte("default!"))
	mu.Lock()
	samePrivateData(t, tg, "eight bytes of private data", seen.PrivateData, short)
	mu.Unlock()
}

// testReject: an OnConnect error rejects the request (ErrRejected at the
// initiator) and the listener goes on accepting; a failing Setup rejects
// too.
func testReject(t *testing.T, tg *Target) {
	ctx := testCtx(t)
	var mu sync.Mutex
	calls := 0
	ln, err := tg.Provider.Listen(tg.ListenAddr, &verbs.ConnParams{OnConnect: func(*verbs.ConnRequest) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			return nil, errors.New("not now")
		}
		return nil, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan verbs.QueuePair, 1)
	go func() {
		qp, err := ln.Accept(ctx)
		if err != nil {
			qp = nil
		}
		accepted <- qp
	}()
	if qp, err := tg.Provider.Dial(ctx, ln.Addr().String(), nil); !errors.Is(err, verbs.ErrRejected) {
		if err == nil {
			qp.Close()
		}
		t.Fatalf("dial rejected by OnConnect: %v, want ErrRejected", err)
	}
	qp, err := tg.Provider.Dial(ctx, ln.Addr().String(), nil)
	if err != nil {
		t.Fatalf("dial after a rejection: %v", err)
	}
	qp.Close()
	if sq := <-accepted; sq == nil {
		t.Fatal("the listener did not accept after a rejection")
	} else {
		sq.Close()
	}

	failing, err := tg.Provider.Listen(tg.ListenAddr, &verbs.ConnParams{Setup: func(verbs.QueuePair) error { return errors.New("no resources") }})
	if err != nil {
		t.Fatal(err)
	}
	defer failing.Close()
	go func() {
		if qp, err := failing.Accept(ctx); err == nil {
			qp.Close()
		}
	}()
	if qp, err := tg.Provider.Dial(ctx, failing.Addr().String(), nil); !errors.Is(err, verbs.ErrRejected) {
		if err == nil {
			qp.Close()
		}
		t.Fatalf("dial to a listener whose Setup fails: %v, want ErrRejected", err)
	}
}

// testSetupBeforeAccept: receives posted by Setup are in place before the
// peer can send (rdma_accept after ibv_post_recv), on both sides; a
// failing Setup on the active side fails Dial and flushes what it posted.
func testSetupBeforeAccept(t *testing.T, tg *Target) {
	// Mapped before the cleanup below is registered, so that they are
	// unmapped after it has deregistered them.
	sb, cb, fb := alloc(t, 4096, 0), alloc(t, 4096, 0), alloc(t, 4096, 0)
	var mu sync.Mutex
	var regs []*verbs.MemoryRegion
	t.Cleanup(func() {
		for _, mr := range regs {
			_ = mr.Deregister()
		}
	})
	setup := func(buf []byte, wrid uint64, fail bool) func(verbs.QueuePair) error {
		return func(qp verbs.QueuePair) error {
			mr, err := qp.PD().RegisterMemory(buf, lw)
			if err != nil {
				return err
			}
			mu.Lock()
			regs = append(regs, mr)
			mu.Unlock()
			if err := qp.PostRecv(verbs.RecvWR{WRID: wrid, SGL: []verbs.SGE{{MR: mr, Length: 64}}}); err != nil {
				return err
			}
			if fail {
				return errors.New("changed my mind")
			}
			return nil
		}
	}
	c, s := tg.connect(t, &verbs.ConnParams{Setup: setup(cb, 8, false)}, &verbs.ConnParams{Setup: setup(sb, 7, false)})
	csrc, cs := region(t, c.PD(), 4096, 0, 0)
	ssrc, ss := region(t, s.PD(), 4096, 0, 0)
	copy(cs, "first")
	copy(ss, "second")
	postSend(t, c, verbs.SendWR{WRID: 1, Opcode: verbs.OpSend, SGL: []verbs.SGE{{MR: csrc, Length: 5}}})
	postSend(t, s, verbs.SendWR{WRID: 2, Opcode: verbs.OpSend, SGL: []verbs.SGE{{MR: ssrc, Length: 6}}})
	expectLen(t, PollOne(t, s.RecvCQ()), 7, verbs.OpRecv, 5)
	expectLen(t, PollOne(t, c.RecvCQ()), 8, verbs.OpRecv, 6)
	if string(sb[:5]) != "first" || string(cb[:6]) != "second" {
		t.Fatalf("received %q and %q", sb[:5], cb[:6])
	}

	ctx := testCtx(t)
	ln, err := tg.Provider.Listen(tg.ListenAddr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if qp, err := ln.Accept(ctx); err == nil {
			qp.Close()
		}
	}()
	cq := verbs.NewSoftCQ()
	if qp, err := tg.Provider.Dial(ctx, ln.Addr().String(), &verbs.ConnParams{RecvCQ: cq, Setup: setup(fb, 10, true)}); err == nil {
		qp.Close()
		t.Fatal("dial with a failing Setup succeeded")
	}
	Expect(t, PollOne(t, cq), 10, verbs.StatusFlushed, verbs.OpRecv)
}
