package rpcrdma

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// connHandler is echoHandler made per connection: it keeps the
// connection so that a test can send backward calls on it, and records
// its Close.
type connHandler struct {
	echoHandler
	rc     *ResponderConn
	closed chan struct{}
}

func (h *connHandler) Close() error { close(h.closed); return nil }

// TestResponderBackwardCalls: backward calls from the responder (RFC
// 8167) reach the requester's call handler on the connection NewConn saw,
// several at once, and their replies come back by XID; forward calls go
// on meanwhile. When the connection ends, its handler is closed; the
// next connection gets a handler of its own.
func TestResponderBackwardCalls(t *testing.T) {
	forEachVersion(t, func(t *testing.T, v int) {
		conns := make(chan *connHandler, 1)
		env := newEnv(t, v, ResponderConfig{NewConn: func(rc *ResponderConn) (oncrpc.CallHandler, error) {
			h := &connHandler{rc: rc, closed: make(chan struct{})}
			conns <- h
			return h, nil
		}}, Config{})
		cb := &cbHandler{size: 100}
		env.tr.SetCallHandler(cb)
		ctx := ctxMinute(t)
		if err := env.echo(ctx, []byte("first"), nil); err != nil {
			t.Fatal(err)
		}
		h := <-conns
		var wg sync.WaitGroup
		errs := make(chan error, 20)
		for i := range 10 {
			wg.Add(2)
			go func() {
				defer wg.Done()
				xid := uint32(0x7000 + i)
				var e xdr.Encoder
				oncrpc.AppendCallHeader(&e, xid, 0x40000000, 1, 1, oncrpc.AuthNone)
				reply, err := h.rc.Call(ctx, e.Bytes())
				if err != nil {
					errs <- err
					return
				}
				if got, _, err := oncrpc.ParseReply(reply); err != nil || got != xid {
					t.Errorf("backward reply: xid %#x (%v), want %#x", got, err, xid)
				}
			}()
			go func() {
				defer wg.Done()
				if err := env.echo(ctx, []byte("forward"), nil); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if st := env.resp.Stats(); st.Backward != 10 || st.BackwardFails != 0 {
			t.Errorf("stats: %d backward calls, %d failed; want 10, 0", st.Backward, st.BackwardFails)
		}
		if m := cb.most.Load(); m > backwardSlots {
			t.Errorf("%d backward calls at once at the requester, beyond the responder's %d slots", m, backwardSlots)
		}
		h.rc.Close()
		<-h.closed
		var e xdr.Encoder
		oncrpc.AppendCallHeader(&e, 0x7100, 0x40000000, 1, 1, oncrpc.AuthNone)
		if _, err := h.rc.Call(ctx, e.Bytes()); err == nil {
			t.Error("backward call on a closed connection succeeded")
		}
		if err := env.echo(ctx, []byte("again"), nil); err != nil {
			t.Fatalf("call after the responder closed the connection: %v", err)
		}
		if h2 := <-conns; h2 == h {
			t.Error("the new connection got the old connection's handler")
		}
	})
}

// FuzzResponderBackwardReply: whatever a requester sends, picking out the
// replies to backward calls neither panics nor hands a call's message to
// a waiting backward call, and takes only RDMA_MSG replies and
// RDMA_ERRORs with the XID of a call in flight.
func FuzzResponderBackwardReply(f *testing.F) {
	reply := func(xid uint32) []byte {
		var e xdr.Encoder
		oncrpc.AppendAcceptedReply(&e, xid, oncrpc.Success, 0, 0)
		return encodeMsg(Header{XID: xid, Vers: Version1, Credit: 1, Proc: ProcMsg}, e.Bytes())
	}
	f.Add(reply(7))
	f.Add(reply(8))
	f.Add(encodeMsg(Header{XID: 7, Vers: Version2, Credit: 1, Proc: ProcError, ErrCode: ErrChunk}, nil))
	f.Add(backwardCallMsg(Header{XID: 7, Vers: Version1, Credit: 1, Proc: ProcMsg}, 7))
	f.Fuzz(func(t *testing.T, msg []byte) {
		c := &serverConn{s: &Responder{cfg: ResponderConfig{MaxVersion: Version2}}, bcPending: make(map[uint32]chan []byte)}
		ch := make(chan []byte, 1)
		c.bcPending[7] = ch
		took := c.backwardReply(msg)
		select {
		case got := <-ch:
			if !took {
				t.Fatal("a waiting call got a message backwardReply did not take")
			}
			if got != nil {
				if mt, ok := oncrpc.MessageType(got); !ok || mt != oncrpc.MsgReply {
					t.Fatalf("a backward call got a message that is not an RPC reply: %x", got)
				}
			}
		default:
		}
	})
}

// TestResponderNewConnRefuses: a connection NewConn refuses is closed; the
// requester's next connection, accepted, carries its calls.
func TestResponderNewConnRefuses(t *testing.T) {
	var n atomic.Int32
	env := newEnv(t, Version1, ResponderConfig{NewConn: func(rc *ResponderConn) (oncrpc.CallHandler, error) {
		if n.Add(1) == 1 {
			return nil, errors.New("no server connection")
		}
		return echoHandler{}, nil
	}}, Config{})
	if err := env.echo(ctxMinute(t), []byte("after a refusal"), nil); err != nil {
		t.Fatal(err)
	}
	if st := env.resp.Stats(); st.Refused != 1 || st.Accepted != 1 || st.Connections != 1 {
		t.Errorf("stats: refused %d, accepted %d, open %d; want 1, 1, 1", st.Refused, st.Accepted, st.Connections)
	}
}
