package rpcrdma

import (
	"context"
	"encoding/binary"
	"net"
	"runtime"
	"sync"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
)

// stubQP is a queue pair with no peer: it records the Sends posted.
type stubQP struct {
	mu    sync.Mutex
	sends [][]byte
	done  chan struct{}
	once  sync.Once
}

func (q *stubQP) PostSend(wr verbs.SendWR) error {
	var b []byte
	for _, s := range wr.SGL {
		b = append(b, s.MR.Bytes()[s.Offset:s.Offset+uint64(s.Length)]...)
	}
	q.mu.Lock()
	q.sends = append(q.sends, b)
	q.mu.Unlock()
	return nil
}
func (q *stubQP) PostRecv(verbs.RecvWR) error   { return nil }
func (q *stubQP) SendCQ() verbs.CompletionQueue { return verbs.NewSoftCQ() }
func (q *stubQP) RecvCQ() verbs.CompletionQueue { return verbs.NewSoftCQ() }
func (q *stubQP) PD() *verbs.ProtectionDomain   { return nil }
func (q *stubQP) PeerPrivateData() []byte       { return nil }
func (q *stubQP) IRD() int                      { return 0 }
func (q *stubQP) ORD() int                      { return 0 }
func (q *stubQP) CRC() bool                     { return false }
func (q *stubQP) LocalAddr() net.Addr           { return pipeAddr{} }
func (q *stubQP) RemoteAddr() net.Addr          { return pipeAddr{} }
func (q *stubQP) Err() error                    { return nil }
func (q *stubQP) Done() <-chan struct{}         { return q.done }
func (q *stubQP) Close() error                  { q.once.Do(func() { close(q.done) }); return nil }
func (q *stubQP) posted() [][]byte              { q.mu.Lock(); defer q.mu.Unlock(); return q.sends }

// stubConn is a connection of tr in negotiation state st over a stubQP.
func stubConn(tr *Transport, st negState) (*conn, *stubQP) {
	qp := &stubQP{done: make(chan struct{})}
	c := &conn{t: tr, qp: qp, recvSize: tr.cfg.InlineRecv, pending: make(map[uint32]*req), granted: tr.cfg.Credits,
		wake: make(chan struct{}), sends: make(map[uint64]sendState), dead: make(chan struct{}),
		qpClosed: make(chan struct{}), bcSlots: make(chan struct{}, tr.cfg.BackchannelSlots)}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.neg, _ = tr.startNegotiation(tr.cfg.InlineSend, tr.cfg.InlineRecv, tr.cfg.InlineRecv)
	c.neg.st, c.neg.sendSize = st, tr.cfg.InlineSend
	return c, qp
}

// fuzzHandler answers a backward call with as many result bytes as its
// first argument word says, up to 8 KiB (past the inline threshold).
type fuzzHandler struct{}

func (fuzzHandler) HandleCall(msg []byte) []byte {
	ch, args, err := oncrpc.ParseCall(msg)
	if err != nil {
		return nil
	}
	var e xdr.Encoder
	oncrpc.AppendAcceptedReply(&e, ch.XID, oncrpc.Success, 0, 0)
	n := 0
	if len(args) >= 4 {
		n = int(binary.BigEndian.Uint32(args) % 8192)
	}
	e.Reserve(n)
	return e.Bytes()
}

// FuzzBackwardCall feeds arbitrary messages to the receive path of a
// connection with no call pending, as backward calls (or anything else) a
// responder could send: no panic, at most one answer per message, and
// every answer is well-formed: an RDMA_ERROR or RPC reply echoing the
// message's XID and version with a non-zero credit, or a ROPT_RESPXCH, an
// RDMA_ERROR answering an RDMA_OPTIONAL; an answer never exceeds the
// inline threshold. A well-formed backward call in the connection's
// version is answered with its reply, unless the reply is too large, in
// which case the connection is closed.
func FuzzBackwardCall(f *testing.F) {
	call := func(h Header, rpcXID, n uint32) []byte {
		var e xdr.Encoder
		oncrpc.AppendCallHeader(&e, rpcXID, 0x40000000, 1, 1, oncrpc.AuthNone)
		e.Uint32(n)
		return encodeMsg(h, e.Bytes())
	}
	f.Add(call(Header{XID: 7, Vers: 1, Credit: 1, Proc: ProcMsg}, 7, 16), false)
	f.Add(call(Header{XID: 7, Vers: 2, Credit: 1, Proc: ProcMsg}, 7, 16), true)
	f.Add(call(Header{XID: 7, Vers: 1, Credit: 1, Proc: ProcMsg}, 7, 5000), false)
	f.Add(call(Header{XID: 7, Vers: 3, Credit: 1, Proc: ProcMsg}, 7, 16), false)
	f.Add(call(Header{XID: 7, Vers: 1, Credit: 1, Proc: ProcMsg}, 8, 16), false)
	f.Add(call(Header{XID: 7, Vers: 1, Credit: 1, Proc: ProcMsg, Writes: [][]Segment{{{Handle: 1, Length: 4}}}}, 7, 16), false)
	f.Add(call(Header{XID: 7, Vers: 1, Credit: 1, Proc: ProcNoMsg, Reply: []Segment{{Handle: 1, Length: 4}}}, 7, 16), false)
	f.Add(encodeMsg(Header{XID: 7, Vers: 2, Credit: 1, Proc: ProcOptional, OptType: 0x7fff}), true)
	f.Add(encodeMsg(Header{XID: 7, Vers: 2, Credit: 1, Proc: ProcOptional, OptType: OptReqXch,
		OptInfo: ReqXch{Want: []XCharVal{Uint32Val(XCharRBSize, 8192)}}.Marshal()}), true)
	f.Add(encodeMsg(Header{XID: 7, Vers: 1, Credit: 1, Proc: ProcError, ErrCode: ErrChunk}), false)
	tr := NewTransport("stub", Config{Credits: 8, BackchannelSlots: 2})
	tr.SetCallHandler(fuzzHandler{})
	f.Cleanup(func() { tr.Close() })
	f.Fuzz(func(t *testing.T, msg []byte, v2 bool) {
		st := negV1
		if v2 {
			st = negV2
		}
		c, qp := stubConn(tr, st)
		defer func() {
			c.fail(oncrpc.ErrClosed)
			for wr, s := range c.sends {
				tr.pool.Put(s.buf)
				delete(c.sends, wr)
			}
		}()
		c.receive(0, msg, 0, false)
		// A backward call is served on its own goroutine; it gives
		// its slot back once its answer is posted (or the connection
		// closed).
		for len(c.bcSlots) > 0 {
			runtime.Gosched()
		}
		sends := qp.posted()
		if len(sends) > 1 {
			t.Fatalf("%d messages sent in answer to one", len(sends))
		}
		if len(sends) == 0 {
			if wellFormedCall(msg, st) && !c.isDead() {
				t.Fatal("a well-formed backward call was not answered and the connection is up")
			}
			return
		}
		var in, out Header
		if _, err := in.Decode(msg, v2 && in.peekV2(msg)); err != nil {
			t.Fatalf("answered a message that does not decode: %v", err)
		}
		n, err := out.Decode(sends[0], out.peekV2(sends[0]))
		if err != nil {
			t.Fatalf("our answer does not decode: %v", err)
		}
		if out.XID != in.XID || out.Credit == 0 || len(sends[0]) > tr.cfg.InlineSend {
			t.Fatalf("answer xid %#x credit %d len %d to xid %#x", out.XID, out.Credit, len(sends[0]), in.XID)
		}
		switch {
		case out.Proc == ProcError, out.Proc == ProcMsg:
			if out.Vers != in.Vers {
				t.Fatalf("answer in version %d to version %d", out.Vers, in.Vers)
			}
			if out.Proc == ProcMsg {
				if len(out.Reads)+len(out.Writes) != 0 || out.Reply != nil || binary.BigEndian.Uint32(sends[0][n:]) != in.XID {
					t.Fatalf("backward reply with chunks or another RPC XID: %+v", out)
				}
				if mt, ok := oncrpc.MessageType(sends[0][n:]); !ok || mt != oncrpc.MsgReply {
					t.Fatal("backward reply is not an RPC reply")
				}
			}
		case out.Proc == ProcOptional && out.OptType == OptRespXch && in.Proc == ProcOptional:
		default:
			t.Fatalf("answer proc %d to proc %d", out.Proc, in.Proc)
		}
	})
}

// peekV2 reports whether an encoded header says version 2.
func (*Header) peekV2(b []byte) bool {
	return len(b) >= 8 && binary.BigEndian.Uint32(b[4:]) == Version2
}

// wellFormedCall reports whether msg is a backward call a connection in
// state st serves.
func wellFormedCall(msg []byte, st negState) bool {
	var h Header
	n, err := h.Decode(msg, st == negV2)
	if err != nil || h.Proc != ProcMsg || len(h.Reads)+len(h.Writes) != 0 || h.Reply != nil {
		return false
	}
	want := uint32(Version1)
	if st == negV2 {
		want = Version2
	}
	p := msg[n:]
	if h.Vers != want || !isCall(p) || binary.BigEndian.Uint32(p) != h.XID {
		return false
	}
	_, _, err = oncrpc.ParseCall(p)
	return err == nil
}
