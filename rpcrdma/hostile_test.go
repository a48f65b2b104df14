package rpcrdma

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// The hostile-server suite: the fake peer (fakepeer_test.go) misbehaves
// the way a broken or malicious server could, and each test checks that
// the requester answers with an error or drops the message, closes the
// connection where the specification says so, and never lets a byte
// outside, or after, a call's advertised memory be read or written.

// exposedCall is a call that exposes three regions: its 8 KiB argument by
// Read chunk, a 4 KiB result destination by Write chunk, and a Reply
// chunk. The destination is the first half of an 8 KiB slab buffer whose
// second half is a guard no peer may touch.
type exposedCall struct {
	call  *oncrpc.Call
	bulk  []byte
	dest  []byte // destination and guard
	guard []byte
}

const (
	exposedBulk  = 8192
	exposedDest  = 4096
	guardPattern = 0xaa
)

func newExposedCall(t *testing.T, tr *Transport, xid uint32) *exposedCall {
	t.Helper()
	pool := tr.Buffers()
	bulkMem, err := pool.Get(exposedBulk)
	if err != nil {
		t.Fatal(err)
	}
	destMem, err := pool.Get(2 * exposedDest)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		bulkMem.Release()
		destMem.Release()
	})
	bulk, dest := bulkMem.Bytes(), destMem.Bytes()
	copy(bulk, pattern(exposedBulk))
	fill(dest, guardPattern)
	return &exposedCall{
		call: &oncrpc.Call{XID: xid, Head: mkCall(xid, procEcho, be32(exposedBulk)), Bulk: oncrpc.Lent(bulkMem),
			ReplyBulk: oncrpc.Lent(destMem).Slice(0, exposedDest), MaxReplySize: 8192},
		bulk: bulk, dest: dest, guard: dest[exposedDest:],
	}
}

// segments returns every segment a call message offered.
func (m *peerMsg) segments() []Segment {
	var segs []Segment
	for _, r := range m.Hdr.Reads {
		segs = append(segs, r.Segment)
	}
	for _, w := range m.Hdr.Writes {
		segs = append(segs, w...)
	}
	return append(segs, m.Hdr.Reply...)
}

// checkGuard fails the test if a byte outside the advertised destination
// changed.
func (ec *exposedCall) checkGuard(t *testing.T) {
	t.Helper()
	for i, b := range ec.guard {
		if b != guardPattern {
			t.Fatalf("guard byte %d after the Write chunk changed to %#x", i, b)
		}
	}
}

// requireFenced checks what must hold once a call has returned, for any
// reason (RFC 8166 s4.4.1, s8.1): no byte of any segment it offered can
// be reached through its STag, for reading or writing, and (when no other
// call is in flight) no region with remote access is live at all.
func requireFenced(t *testing.T, tr *Transport, segs []Segment, idle bool) {
	t.Helper()
	pd := tr.PD()
	for _, s := range segs {
		for off := range uint64(s.Length) {
			for _, need := range []verbs.Access{verbs.AccessRemoteRead, verbs.AccessRemoteWrite} {
				if _, err := iwarp.TableOf(pd).Resolve(s.Handle, need, s.Offset+off, 1); err == nil {
					t.Fatalf("STag %#x: byte %d still reachable with %v after the call returned", s.Handle, off, need)
				}
			}
		}
	}
	if !idle {
		return
	}
	if n := pd.LiveRemoteRegions(); n != 0 {
		t.Fatalf("%d regions with remote access live after the call returned", n)
	}
	if m := tr.Stats().Memory; m.LiveExposures != 0 {
		t.Fatalf("%d exposures live after the call returned", m.LiveExposures)
	}
}

// waitConnDead waits until the requester has noticed that its current
// connection is gone, so that its next call dials a new one.
func waitConnDead(t *testing.T, fp *fakePeer, tr *Transport) {
	t.Helper()
	tr.mu.Lock()
	c := tr.conn
	tr.mu.Unlock()
	if c == nil {
		return
	}
	select {
	case <-c.qpClosed:
	case <-fp.ctx.Done():
		t.Fatal("the requester did not notice its connection ended")
	}
}

// probeRefused makes the requester dial again and has the peer try to
// read or write segment s over the new connection: the requester's
// provider must refuse it with a Terminate, and the call in flight fails
// with a connection error (to be retransmitted).
func probeRefused(t *testing.T, fp *fakePeer, tr *Transport, s Segment, read bool, xid uint32) {
	t.Helper()
	waitConnDead(t, fp, tr)
	ch := goRoundTrip(fp.ctx, tr, &oncrpc.Call{XID: xid, Head: mkCall(xid, procEcho, be32(0)), MaxReplySize: 128})
	pc := fp.accept()
	pc.recvCall()
	if read {
		pc.readRefused(s.Handle, s.Offset, int(s.Length), "RDMA Read of a returned call's memory")
	} else {
		pc.writeRefused(s.Handle, s.Offset, make([]byte, s.Length), "RDMA Write to a returned call's memory")
	}
	if r := fp.wait(ch); !errors.Is(r.err, oncrpc.ErrConnection) {
		t.Fatalf("call in flight when the peer was refused: %v, want a connection error", r.err)
	}
}

// deadlineCtx is a context whose deadline the test decides: expire makes
// it end with context.DeadlineExceeded, as a call timeout does.
type deadlineCtx struct {
	context.Context
	once sync.Once
	done chan struct{}
}

func newDeadlineCtx(parent context.Context) *deadlineCtx {
	return &deadlineCtx{Context: parent, done: make(chan struct{})}
}

func (c *deadlineCtx) Done() <-chan struct{} { return c.done }
func (c *deadlineCtx) expire()               { c.once.Do(func() { close(c.done) }) }
func (c *deadlineCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// TestHostileAccessAfterReturn: however a call returns (its reply, a
// timeout, cancellation, the loss of the connection, a retransmission
// superseding it), once RoundTrip has returned the peer can neither read
// nor write any byte of the call's Read, Write or Reply chunk, no region
// with remote access is left, and nothing outside the Write chunk was
// ever written (RFC 8166 s4.4.1, s8.1).
func TestHostileAccessAfterReturn(t *testing.T) {
	for _, mode := range []string{"reply", "timeout", "cancel", "connection-loss", "superseded"} {
		t.Run(mode, func(t *testing.T) {
			fp := newFakePeer(t, peerOpts{Credits: 4})
			tr := fp.transport(Config{Version: Version1, Credits: 8})
			// A first call gets the grant of 4 (RFC 8166 s3.3.3).
			ch := goRoundTrip(fp.ctx, tr, &oncrpc.Call{XID: 1, Head: mkCall(1, procEcho, be32(0)), MaxReplySize: 128})
			pc := fp.accept()
			pc.reply(pc.recvCall(), be32(0))
			if r := fp.wait(ch); r.err != nil {
				t.Fatal(r.err)
			}

			ec := newExposedCall(t, tr, 100)
			ctx := newDeadlineCtx(fp.ctx)
			cctx, cancel := context.WithCancel(fp.ctx)
			defer cancel()
			var callCtx context.Context = ctx
			if mode == "cancel" {
				callCtx = cctx
			}
			ch = goRoundTrip(callCtx, tr, ec.call)
			m := pc.recvCall()
			segs := m.segments()
			if len(m.Hdr.Reads) != 1 || len(m.Hdr.Writes) != 1 || m.Hdr.Reply == nil {
				t.Fatalf("call offered reads %v writes %v reply %v; want one of each", m.Hdr.Reads, m.Hdr.Writes, m.Hdr.Reply)
			}
			w := m.Hdr.Writes[0][0]
			if w.Length != exposedDest {
				t.Fatalf("Write chunk of %d bytes offered for a %d-byte destination", w.Length, exposedDest)
			}
			// While the call is in flight the peer may use what was
			// offered, exactly.
			if got := pc.pullChunk(m.Hdr.Reads); !bytes.Equal(got, ec.bulk) {
				t.Fatal("Read chunk does not carry the argument")
			}
			data := pattern(exposedDest)
			if err := pc.write(w.Handle, w.Offset, data); err != nil {
				t.Fatal(err)
			}

			var r result
			switch mode {
			case "reply":
				h := pc.replyHeader(m)
				h.Writes[0][0].Length = exposedDest
				pc.replyWith(m, h, be32(exposedDest))
				r = fp.wait(ch)
				if r.err != nil {
					t.Fatal(r.err)
				}
				if !r.rep.BulkPlaced || r.rep.BulkLen != exposedDest || !bytes.Equal(ec.dest[:exposedDest], data) {
					t.Fatalf("reply: placed %v, %d bytes; data equal %v", r.rep.BulkPlaced, r.rep.BulkLen, bytes.Equal(ec.dest[:exposedDest], data))
				}
				r.rep.Release()
			case "timeout":
				ctx.expire()
				if r = fp.wait(ch); !errors.Is(r.err, context.DeadlineExceeded) {
					t.Fatalf("timed-out call returned %v", r.err)
				}
			case "cancel":
				cancel()
				if r = fp.wait(ch); !errors.Is(r.err, context.Canceled) {
					t.Fatalf("cancelled call returned %v", r.err)
				}
			case "connection-loss":
				tr.mu.Lock()
				qp := tr.conn.qp
				tr.mu.Unlock()
				pc.qp.Close()
				if r = fp.wait(ch); !errors.Is(r.err, oncrpc.ErrConnection) {
					t.Fatalf("call on a lost connection returned %v", r.err)
				}
				// RFC 8166 s4.5.4 spirit: the call completes only
				// once its queue pair is shut down.
				select {
				case <-qp.Done():
				default:
					t.Fatal("the call returned before its queue pair was closed")
				}
			case "superseded":
				// The same XID again: the first call ends and its
				// memory with it.
				again := newExposedCall(t, tr, 100)
				ch2 := goRoundTrip(fp.ctx, tr, again.call)
				if r = fp.wait(ch); r.err == nil {
					t.Fatal("superseded call succeeded")
				}
				m2 := pc.recvCall()
				requireFenced(t, tr, segs, false)
				if m2.segments()[0].Handle == segs[0].Handle {
					t.Fatal("retransmission reuses the superseded call's STag")
				}
				pc.writeRefused(w.Handle, w.Offset, []byte{1}, "Write to a superseded call's chunk")
				if r2 := fp.wait(ch2); !errors.Is(r2.err, oncrpc.ErrConnection) {
					t.Fatalf("retransmission after the peer was refused: %v", r2.err)
				}
			}
			after := append([]byte(nil), ec.dest...)
			requireFenced(t, tr, segs, true)
			ec.checkGuard(t)
			if mode == "reply" || mode == "timeout" || mode == "cancel" {
				// The call's own connection is still up.
				pc.writeRefused(w.Handle, w.Offset, []byte{1}, "Write to a returned call's chunk")
			}

			// Over the wire too, on a new connection (the protection
			// domain outlives connections): every segment, both ways.
			xid := uint32(200)
			for _, s := range segs {
				for _, read := range []bool{false, true} {
					xid++
					probeRefused(t, fp, tr, s, read, xid)
				}
			}
			if !bytes.Equal(ec.dest, after) {
				t.Fatal("the destination changed after the call returned")
			}
			requireFenced(t, tr, segs, true)
		})
	}
}

// holdProvider wraps a provider so that, while held is set, the send
// completions of its queue pairs are never delivered: a peer that never
// acknowledges a Send (on InfiniBand, an endless receiver-not-ready retry).
type holdProvider struct {
	verbs.Provider
	held atomic.Bool
}

func (p *holdProvider) Dial(ctx context.Context, addr string, params *verbs.ConnParams) (verbs.QueuePair, error) {
	qp, err := p.Provider.Dial(ctx, addr, params)
	if err != nil {
		return nil, err
	}
	return &holdQP{QueuePair: qp, scq: &holdCQ{CompletionQueue: qp.SendCQ(), held: &p.held}}, nil
}

type holdQP struct {
	verbs.QueuePair
	scq *holdCQ
}

func (q *holdQP) SendCQ() verbs.CompletionQueue { return q.scq }

type holdCQ struct {
	verbs.CompletionQueue
	held *atomic.Bool
}

func (c *holdCQ) Poll(ctx context.Context, out []verbs.Completion) (int, error) {
	for {
		n, err := c.CompletionQueue.Poll(ctx, out)
		if err != nil || !c.held.Load() {
			return n, err
		}
	}
}

// TestHostileUnacknowledgedSend: a call whose Send never completes still
// returns when its reply comes, and when its context ends (a requester
// that waited for the completion hung for as long as the peer liked).
func TestHostileUnacknowledgedSend(t *testing.T) {
	fp := newFakePeer(t, peerOpts{Credits: 4})
	hp := &holdProvider{Provider: fp.provider()}
	tr := fp.transport(Config{Version: Version1, Provider: hp})
	small := func(xid uint32) *oncrpc.Call {
		return &oncrpc.Call{XID: xid, Head: mkCall(xid, procEcho, be32(0)), MaxReplySize: 128}
	}
	ch := goRoundTrip(fp.ctx, tr, small(1))
	pc := fp.accept()
	pc.reply(pc.recvCall(), be32(0))
	if r := fp.wait(ch); r.err != nil {
		t.Fatal(r.err)
	}
	hp.held.Store(true)

	// Answered: returns with the reply.
	ch = goRoundTrip(fp.ctx, tr, small(2))
	pc.reply(pc.recvCall(), be32(0))
	if r := fp.wait(ch); r.err != nil {
		t.Fatal(r.err)
	} else {
		r.rep.Release()
	}
	// Unanswered: returns when its context ends.
	ctx, cancel := context.WithCancel(fp.ctx)
	ch = goRoundTrip(ctx, tr, small(3))
	pc.recvCall()
	cancel()
	if r := fp.wait(ch); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled call returned %v", r.err)
	}
}

// TestHostileStalledTransfer: a peer that stalls a transfer in the middle
// (an RDMA Write it stops sending halfway, or the Read Response to an RDMA
// Read it stops receiving) cannot hold the call past its timeout, and once
// the call has returned no further byte is placed or read: the
// invalidation waits for the transfer, and when it stalls the requester
// closes the connection under it (RFC 8166 s4.5.4) before the call
// completes.
func TestHostileStalledTransfer(t *testing.T) {
	for _, dir := range []string{"write", "read"} {
		t.Run(dir, func(t *testing.T) {
			fp := newFakePeer(t, peerOpts{Credits: 4})
			tr := fp.transport(Config{Version: Version1})
			pool := tr.Buffers()
			const size = 256 << 10
			bulkMem, err := pool.Get(size)
			if err != nil {
				t.Fatal(err)
			}
			defer bulkMem.Release()
			destMem, err := pool.Get(size)
			if err != nil {
				t.Fatal(err)
			}
			defer destMem.Release()
			bulk, dest := bulkMem.Bytes(), destMem.Bytes()
			fill(dest, guardPattern)
			copy(bulk, pattern(size))
			call := &oncrpc.Call{XID: 7, Head: mkCall(7, procEcho, be32(size)), Bulk: oncrpc.Lent(bulkMem), ReplyBulk: oncrpc.Lent(destMem), MaxReplySize: 128}
			ctx := newDeadlineCtx(fp.ctx)
			ch := goRoundTrip(ctx, tr, call)
			pc := fp.accept()
			m := pc.recvCall()
			segs := m.segments()
			switch dir {
			case "write":
				// 1000 bytes of the first frame reach the requester:
				// it is placing the Write when the peer stalls.
				pc.gate.limit(1000)
				w := m.Hdr.Writes[0][0]
				// The Write fails when the requester closes.
				go func() { _ = pc.write(w.Handle, w.Offset, pattern(size)) }()
				if err := pc.gate.waitStalled(fp.ctx); err != nil {
					t.Fatal(err)
				}
			case "read":
				// The peer stops reading 1000 bytes into the Read
				// Response: the requester is sending it when it stalls.
				n := pc.gate.holdReads(1000)
				r := m.Hdr.Reads[0]
				pc.postRead(r.Handle, r.Offset, int(r.Length))
				if err := pc.gate.waitRead(fp.ctx, n); err != nil {
					t.Fatal(err)
				}
			}
			ctx.expire()
			if r := fp.wait(ch); !errors.Is(r.err, context.DeadlineExceeded) {
				t.Fatalf("stalled call returned %v", r.err)
			}
			requireFenced(t, tr, segs, true)
			snapshot := append([]byte(nil), dest...)
			changed := 0
			for i := range dest {
				if dest[i] != guardPattern {
					changed++
				}
			}
			if changed > 1000 {
				t.Fatalf("%d bytes placed from 1000 bytes sent", changed)
			}
			// The requester closed the connection under the stalled
			// transfer; letting the peer go on changes nothing.
			pc.gate.open()
			pc.waitClosed()
			if !bytes.Equal(dest, snapshot) {
				t.Fatal("bytes were placed after the call returned")
			}
			if dir == "read" {
				var wc [1]verbs.Completion
				if n, err := pc.qp.SendCQ().Poll(fp.ctx, wc[:]); err != nil || n != 1 || wc[0].Status == verbs.StatusSuccess {
					t.Fatalf("the stalled RDMA Read completed %v (%d, %v)", wc[0].Status, n, err)
				}
			}
		})
	}
}

// TestHostileReplyDuringReadResponse: a peer that replies while the Read
// Response for the call's Read chunk is still going out (it stops reading
// it halfway) cannot make the call return with the chunk readable: the
// invalidation the call makes before it returns stops the transfer (the
// connection ends under it), and the reply is still the call's (RFC 8166
// s8.1.3, s4.5.4). This covers the Read chunk's invalidation by the
// caller, after the receive path has delivered the reply.
func TestHostileReplyDuringReadResponse(t *testing.T) {
	fp := newFakePeer(t, peerOpts{Credits: 4})
	tr := fp.transport(Config{Version: Version1})
	pc := warmUp(t, fp, tr)
	const size = 256 << 10
	bulkMem, err := tr.Buffers().Get(size)
	if err != nil {
		t.Fatal(err)
	}
	defer bulkMem.Release()
	bulk := bulkMem.Bytes()
	copy(bulk, pattern(size))
	a := goRoundTrip(fp.ctx, tr, &oncrpc.Call{XID: 41, Head: mkCall(41, procEcho, be32(size)), Bulk: oncrpc.Lent(bulkMem), MaxReplySize: 128})
	m := pc.recvCall()
	if len(m.Hdr.Reads) != 1 {
		t.Fatalf("call sent with %d read segments, want a Read chunk", len(m.Hdr.Reads))
	}
	n := pc.gate.holdReads(1000) // the Read Response starts, then stalls
	rs := m.Hdr.Reads[0]
	pc.postRead(rs.Handle, rs.Offset, int(rs.Length))
	pc.mu.Lock()
	readWR := pc.nextWR
	pc.mu.Unlock()
	if err := pc.gate.waitRead(fp.ctx, n); err != nil {
		t.Fatal(err)
	}
	// The reply's Send completes only after the RDMA Read (send queue
	// order): it is posted without waiting.
	m.release()
	sge, done := pc.local(encodeMsg(pc.replyHeader(m), rpcReply(m.RPCXID), be32(0)))
	defer done()
	pc.mu.Lock()
	pc.nextWR++
	err = pc.qp.PostSend(verbs.SendWR{WRID: pc.nextWR, Opcode: verbs.OpSend, SGL: []verbs.SGE{sge}})
	pc.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	r := fp.wait(a)
	switch {
	case r.err == nil:
		r.rep.Release()
	case !errors.Is(r.err, oncrpc.ErrConnection):
		t.Fatalf("call returned %v", r.err)
	}
	requireFenced(t, tr, m.segments(), true)
	// Only now may the peer read on: the transfer was stopped before the
	// call returned.
	pc.gate.open()
	var wc [1]verbs.Completion
	for wc[0].WRID != readWR {
		if k, err := pc.qp.SendCQ().Poll(fp.ctx, wc[:]); err != nil || k != 1 {
			t.Fatalf("the peer's RDMA Read did not complete: %d, %v", k, err)
		}
	}
	if wc[0].Status == verbs.StatusSuccess {
		t.Fatal("the peer read the whole Read chunk after the call returned")
	}
}
