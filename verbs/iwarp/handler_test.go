package iwarp

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/verbs"
)

// handlerLog records receive completions a handler is given.
type handlerLog struct {
	mu  sync.Mutex
	wcs []verbs.Completion
	in  int // calls in progress, to catch concurrent calls
	bad bool
	got chan struct{} // a token per completion
}

func newHandlerLog() *handlerLog { return &handlerLog{got: make(chan struct{}, 1024)} }

func (l *handlerLog) enter() {
	l.mu.Lock()
	l.in++
	l.bad = l.bad || l.in > 1
	l.mu.Unlock()
}

func (l *handlerLog) leave(wc verbs.Completion) {
	l.mu.Lock()
	l.in--
	l.wcs = append(l.wcs, wc)
	l.mu.Unlock()
	l.got <- struct{}{}
}

// wait waits for n more completions.
func (l *handlerLog) wait(t *testing.T, n int) {
	t.Helper()
	ctx := testCtx(t)
	for range n {
		select {
		case <-l.got:
		case <-ctx.Done():
			t.Fatalf("waiting for completions: %v", ctx.Err())
		}
	}
}

func (l *handlerLog) snapshot() ([]verbs.Completion, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]verbs.Completion(nil), l.wcs...), l.bad
}

// TestRecvHandler: with a receive handler, completions queued before it
// was set come first, then each message's, in order and one call at a
// time; a handler may post (here the server echoes every message from
// its handler: receive reposted, reply sent); the receives flushed by
// Close reach the handler too, and nothing reaches the receive CQ.
func TestRecvHandler(t *testing.T) {
	c, s := pair(t, nil, nil)
	const n = 50
	// Server: echo from the handler.
	sbuf := make([]byte, 64)
	swr, err := recvWR(s.PD(), 0, sbuf)
	if err != nil {
		t.Fatal(err)
	}
	ssgl := gather(t, s.PD(), sbuf)
	if err := s.PostRecv(swr); err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := s.SetRecvHandler(func(wc verbs.Completion) {
		if wc.Status != verbs.StatusSuccess || serr != nil {
			return
		}
		if serr = s.PostRecv(swr); serr == nil {
			serr = s.PostSend(verbs.SendWR{Opcode: verbs.OpSend, SGL: []verbs.SGE{{MR: ssgl[0].MR, Length: wc.ByteLen}}})
		}
	}); err != nil {
		t.Fatal(err)
	}

	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, 64)
		if err := postRecv(c, uint64(i), bufs[i]); err != nil {
			t.Fatal(err)
		}
	}
	// Two replies arrive before the client's handler is set: they
	// wait in the receive CQ and come first.
	send := func(i int) {
		t.Helper()
		if err := c.PostSend(verbs.SendWR{WRID: uint64(i), Opcode: verbs.OpSend, SGL: gather(t, c.PD(), []byte{byte(i), 1, 2})}); err != nil {
			t.Fatal(err)
		}
	}
	send(0)
	send(1)
	pollN(t, c.SendCQ(), 2)
	ctx := testCtx(t)
	for c.rcq.Len() < 2 {
		if ctx.Err() != nil {
			t.Fatalf("replies 0 and 1 not in the receive CQ: %v", c.Err())
		}
		time.Sleep(time.Millisecond)
	}
	log := newHandlerLog()
	if err := c.SetRecvHandler(func(wc verbs.Completion) {
		log.enter()
		log.leave(wc)
	}); err != nil {
		t.Fatal(err)
	}
	log.wait(t, 2)
	for i := 2; i < n-5; i++ {
		send(i)
		log.wait(t, 1)
		pollOne(t, c.SendCQ())
	}
	// The last five (n-5..n-1) stay posted and are flushed by Close.
	c.Close()
	log.wait(t, 5)
	wcs, bad := log.snapshot()
	if bad {
		t.Fatal("handler calls overlapped")
	}
	if len(wcs) != n {
		t.Fatalf("%d completions, want %d", len(wcs), n)
	}
	for i, wc := range wcs {
		st, byteLen := verbs.StatusSuccess, uint32(3)
		if i >= n-5 {
			st, byteLen = verbs.StatusFlushed, 0
		}
		expect(t, wc, uint64(i), st, verbs.OpRecv)
		if wc.ByteLen != byteLen {
			t.Fatalf("completion %d: %d bytes, want %d", i, wc.ByteLen, byteLen)
		}
		if st == verbs.StatusSuccess && bufs[i][0] != byte(i) {
			t.Fatalf("message %d holds %d", i, bufs[i][0])
		}
	}
	s.Close() // waits for the server's handler calls
	if serr != nil {
		t.Fatalf("server handler: %v", serr)
	}
	// A receive posted after the queue pair broke is flushed to the
	// handler, not to the receive CQ.
	if err := postRecv(c, 99, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	log.wait(t, 1)
	wcs, _ = log.snapshot()
	expect(t, wcs[n], 99, verbs.StatusFlushed, verbs.OpRecv)
	if k := c.rcq.Len(); k != 0 {
		t.Fatalf("%d completions in the receive CQ", k)
	}
}

// TestRecvHandlerInvalidates: a handler may invalidate the region the
// peer has just written with RDMA Write (as rpcrdma does with a Write
// chunk on the reply): the placement is over when the handler runs, so
// the invalidation does not wait for the goroutine running it.
func TestRecvHandlerInvalidates(t *testing.T) {
	c, s := pair(t, nil, nil)
	const rounds = 20
	sink := make([]byte, 4096)
	done := make(chan error, rounds)
	mrs := make(chan *verbs.MemoryRegion, 1)
	if err := postRecv(c, 0, make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	if err := c.SetRecvHandler(func(wc verbs.Completion) {
		if wc.Status != verbs.StatusSuccess {
			done <- errors.New(wc.Status.String())
			return
		}
		mr := <-mrs
		err := mr.Invalidate()
		if err == nil {
			err = postRecv(c, 0, make([]byte, 16))
		}
		done <- err
	}); err != nil {
		t.Fatal(err)
	}
	src := randBytes(len(sink), 7)
	ssrc := gather(t, s.PD(), src)
	note := gather(t, s.PD(), []byte("done"))
	for i := range rounds {
		mr := reg(t, c.PD(), sink, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		mrs <- mr
		if err := s.PostSend(verbs.SendWR{Opcode: verbs.OpRDMAWrite, SGL: ssrc, RemoteSTag: mr.STag()}); err != nil {
			t.Fatal(err)
		}
		if err := s.PostSend(verbs.SendWR{Opcode: verbs.OpSend, SGL: note}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if mr.Valid() {
			t.Fatalf("round %d: region still valid", i)
		}
		pollN(t, s.SendCQ(), 2)
		mustEqual(t, sink, src)
	}
}

// TestRecvHandlerSharedCQ: a receive CQ shared through ConnParams takes
// no handler (it may hold other queue pairs' completions).
func TestRecvHandlerSharedCQ(t *testing.T) {
	c, _ := pair(t, &verbs.ConnParams{RecvCQ: verbs.NewSoftCQ()}, nil)
	if err := c.SetRecvHandler(func(verbs.Completion) {}); !errors.Is(err, verbs.ErrInvalidWR) {
		t.Fatalf("SetRecvHandler on a shared CQ: %v", err)
	}
}
