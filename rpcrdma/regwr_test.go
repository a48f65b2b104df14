package rpcrdma

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
)

// regCounter wraps a provider's queue pairs to record the send queue
// work requests the transport posts, and to fail fast-registers on
// demand: their post (failPost) or their completion (failCompletion,
// whose status is changed to a local protection error when polled).
type regCounter struct {
	verbs.Provider

	failPost       atomic.Bool
	failCompletion atomic.Bool

	mu     sync.Mutex
	posted []verbs.Opcode // in posting order, every queue pair's
	poison map[uint64]bool
}

func (p *regCounter) Dial(ctx context.Context, addr string, params *verbs.ConnParams) (verbs.QueuePair, error) {
	qp, err := p.Provider.Dial(ctx, addr, params)
	if err != nil {
		return nil, err
	}
	return &countingQP{QueuePair: qp, p: p}, nil
}

func (p *regCounter) count(op verbs.Opcode) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, o := range p.posted {
		if o == op {
			n++
		}
	}
	return n
}

func (p *regCounter) order() []verbs.Opcode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]verbs.Opcode(nil), p.posted...)
}

type countingQP struct {
	verbs.QueuePair
	p *regCounter
}

func (q *countingQP) PostSend(wr verbs.SendWR) error {
	p := q.p
	if wr.Opcode == verbs.OpFastRegister && p.failPost.Load() {
		return errors.New("injected fast-register post failure")
	}
	p.mu.Lock()
	p.posted = append(p.posted, wr.Opcode)
	if wr.Opcode == verbs.OpFastRegister && p.failCompletion.Load() {
		p.poison[wr.WRID] = true
	}
	p.mu.Unlock()
	return q.QueuePair.PostSend(wr)
}

// SetRecvHandler keeps the provider's receive handler path (the iWARP
// provider's receiving goroutine runs the reply's unmapWritable).
func (q *countingQP) SetRecvHandler(h func(verbs.Completion)) error {
	hs, ok := q.QueuePair.(verbs.RecvHandlerSetter)
	if !ok {
		return errors.New("no receive handler")
	}
	return hs.SetRecvHandler(h)
}

func (q *countingQP) SendCQ() verbs.CompletionQueue {
	return poisonCQ{CompletionQueue: q.QueuePair.SendCQ(), p: q.p}
}

// poisonCQ fails the completions of the poisoned work requests.
type poisonCQ struct {
	verbs.CompletionQueue
	p *regCounter
}

func (cq poisonCQ) fix(out []verbs.Completion) {
	cq.p.mu.Lock()
	defer cq.p.mu.Unlock()
	for i := range out {
		if cq.p.poison[out[i].WRID] {
			out[i].Status = verbs.StatusLocalProtectionErr
		}
	}
}

func (cq poisonCQ) Poll(ctx context.Context, out []verbs.Completion) (int, error) {
	n, err := cq.CompletionQueue.Poll(ctx, out)
	cq.fix(out[:n])
	return n, err
}

func (cq poisonCQ) TryPoll(out []verbs.Completion) int {
	n := cq.CompletionQueue.TryPoll(out)
	cq.fix(out[:n])
	return n
}

func newRegCounter(fp *fakePeer) *regCounter {
	return &regCounter{Provider: fp.provider(), poison: make(map[uint64]bool)}
}

// exposedRoundTrip runs ec's call against the fake peer, which writes 16
// bytes of the Write chunk and replies, and returns what the call
// returned and the segments it offered.
func exposedRoundTrip(t *testing.T, fp *fakePeer, tr *Transport, pc *peerConn, ec *exposedCall) (result, []Segment) {
	t.Helper()
	ch := goRoundTrip(fp.ctx, tr, ec.call)
	m := pc.recvCall()
	h := pc.replyHeader(m)
	h.Writes[0][0].Length = 16
	if err := pc.write(h.Writes[0][0].Handle, h.Writes[0][0].Offset, pattern(16)); err != nil {
		t.Fatal(err)
	}
	pc.replyWith(m, h, be32(16))
	return fp.wait(ch), m.segments()
}

// TestRegistrationWorkRequests: a call's exposures are registered and
// invalidated with work requests on its connection's send queue, as
// FRWR hardware needs (Linux xprtrdma frwr_map, frwr_unmap_sync): one
// OpFastRegister per exposure, posted ahead of the call's Send, and one
// OpLocalInvalidate per exposure before the call returns; nothing stays
// reachable, and the pool's counters add up.
func TestRegistrationWorkRequests(t *testing.T) {
	fp := newFakePeer(t, peerOpts{Credits: 4})
	prov := newRegCounter(fp)
	tr := fp.transport(Config{Version: Version1, Provider: prov})
	pc := warmUp(t, fp, tr)
	before := tr.Stats().Memory
	base := len(prov.order())
	ec := newExposedCall(t, tr, 70)
	r, segs := exposedRoundTrip(t, fp, tr, pc, ec)
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.rep.Release()
	requireFenced(t, tr, segs, true)
	ops := prov.order()[base:]
	var fr, inv, sends int
	for _, op := range ops {
		switch op {
		case verbs.OpFastRegister:
			if sends > 0 {
				t.Fatalf("posted %v: a fast-register after the call's Send", ops)
			}
			fr++
		case verbs.OpLocalInvalidate:
			inv++
		case verbs.OpSend:
			sends++
		}
	}
	if fr != len(segs) || inv != len(segs) || sends != 1 {
		t.Fatalf("posted %v for a call offering %d segments: want a fast-register and a local invalidation each, and one Send", ops, len(segs))
	}
	after := tr.Stats().Memory
	if after.Exposures-before.Exposures != uint64(len(segs)) || after.LiveExposures != 0 || after.FastRegions < len(segs) {
		t.Fatalf("pool counters: %+v before, %+v after %d exposures", before, after, len(segs))
	}
	if string(ec.dest[:16]) != string(pattern(16)) {
		t.Fatal("the Write chunk does not hold the peer's data")
	}
	ec.checkGuard(t)
}

// TestFastRegisterPostFailure: a fast-register that cannot be posted
// fails its call at once, with the provider's error: nothing is sent,
// nothing stays exposed, and the connection serves the next call.
func TestFastRegisterPostFailure(t *testing.T) {
	fp := newFakePeer(t, peerOpts{Credits: 4})
	prov := newRegCounter(fp)
	tr := fp.transport(Config{Version: Version1, Provider: prov})
	pc := warmUp(t, fp, tr)
	prov.failPost.Store(true)
	ec := newExposedCall(t, tr, 71)
	ctx, cancel := context.WithTimeout(fp.ctx, 10*time.Second)
	defer cancel()
	_, err := tr.RoundTrip(ctx, ec.call)
	if err == nil || !strings.Contains(err.Error(), "injected fast-register post failure") {
		t.Fatalf("call with a failing fast-register: %v", err)
	}
	if prov.count(verbs.OpSend) != 1 { // the warm-up's
		t.Fatalf("posted %v: the call was sent", prov.order())
	}
	if n := tr.PD().LiveRemoteRegions(); n != 0 || tr.Stats().Memory.LiveExposures != 0 {
		t.Fatalf("%d regions with remote access live after the failed call", n)
	}
	prov.failPost.Store(false)
	ec = newExposedCall(t, tr, 72)
	r, _ := exposedRoundTrip(t, fp, tr, pc, ec)
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.rep.Release()
}

// TestFastRegisterCompletionError: a fast-register that completes in
// error (the queue pair broke under it: xprtrdma's frwr_wc_fastreg
// disconnects) fails its call with a connection error instead of
// delivering a reply or hanging, even if the peer answers; the call's
// memory is fenced when it returns.
func TestFastRegisterCompletionError(t *testing.T) {
	fp := newFakePeer(t, peerOpts{Credits: 4})
	prov := newRegCounter(fp)
	tr := fp.transport(Config{Version: Version1, Provider: prov})
	pc := warmUp(t, fp, tr)
	prov.failCompletion.Store(true)
	ec := newExposedCall(t, tr, 73)
	ctx, cancel := context.WithTimeout(fp.ctx, 20*time.Second)
	defer cancel()
	ch := goRoundTrip(ctx, tr, ec.call)
	var r result
	select {
	case r = <-ch: // failed when its Send was posted
	case <-time.After(2 * time.Second):
		// The Send went out first: the peer answers, and the
		// completion in error is reaped when the reply comes.
		m := pc.recvCall()
		pc.reply(m, be32(0))
		r = fp.wait(ch)
	}
	if !errors.Is(r.err, oncrpc.ErrConnection) || r.rep != nil || !strings.Contains(r.err.Error(), "FastRegister") {
		t.Fatalf("call whose fast-register failed: %v, %v; want a connection error naming the fast-register", r.rep, r.err)
	}
	if n := tr.PD().LiveRemoteRegions(); n != 0 || tr.Stats().Memory.LiveExposures != 0 {
		t.Fatalf("%d regions with remote access live after the failed call", n)
	}
}
