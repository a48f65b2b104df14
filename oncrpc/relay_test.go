package oncrpc

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// TestRelayLendsReply: over a real TCP transport, the relay hands a
// server that knows ViewHandler the reply lent where the transport
// received it (a view with an owner), with the same bytes HandleCall
// returns a copy of.
func TestRelayLendsReply(t *testing.T) {
	addr := serveEcho(t, &echoHandler{})
	tr := NewTCPTransport(addr, TCPOptions{})
	defer tr.Close()
	r := Relay(tr, time.Minute)
	args := bytes.Repeat([]byte("relayed!"), 128<<10) // 1 MiB
	xid := uint32(0x1000)
	call := func() []byte {
		xid++
		var e xdr.Encoder
		AppendCallHeader(&e, xid, 100003, 4, 1, AuthNone)
		e.FixedOpaque(args)
		return e.Bytes()
	}

	v := r.HandleCallView(call())
	if owner, _ := v.Owner(); owner == nil {
		t.Fatal("HandleCallView returned ordinary memory: the reply was copied")
	}
	if !bytes.HasSuffix(v.Bytes(), args) {
		t.Fatalf("the lent reply (%d bytes) does not end with the call's %d bytes of arguments", v.Len(), len(args))
	}
	r.ReleaseView(v)
	if rep := r.HandleCall(call()); !bytes.HasSuffix(rep, args) {
		t.Fatalf("HandleCall's reply (%d bytes) does not end with the arguments", len(rep))
	}
}

// lendingTransport answers every call with the same reply buffer and
// counts the times it was given back.
type lendingTransport struct {
	Transport
	msg      []byte
	released int
}

func (l *lendingTransport) RoundTrip(ctx context.Context, c *Call) (*Reply, error) {
	return &Reply{Msg: l.msg, release: func() { l.released++ }}, nil
}

// TestRelayViewIsTransportBuffer: the view HandleCallView returns is the
// transport's own reply buffer, not a copy of it, and it goes back to the
// transport at ReleaseView, once, not before.
func TestRelayViewIsTransportBuffer(t *testing.T) {
	lt := &lendingTransport{msg: make([]byte, 1<<20)}
	r := Relay(lt, time.Minute)
	v := r.HandleCallView([]byte{0, 0, 0, 1, 0, 0, 0, 0})
	if v.Len() != len(lt.msg) || &v.Bytes()[0] != &lt.msg[0] {
		t.Fatal("the relay returned a copy of the transport's reply, not the reply")
	}
	if lt.released != 0 {
		t.Fatal("the reply went back to the transport before ReleaseView")
	}
	r.ReleaseView(v)
	if lt.released != 1 {
		t.Fatalf("ReleaseView gave the reply back %d times, want once", lt.released)
	}
	if rep := r.HandleCall([]byte{0, 0, 0, 2, 0, 0, 0, 0}); &rep[0] == &lt.msg[0] || lt.released != 2 {
		t.Fatalf("HandleCall must return a copy and give the buffer back (released %d times)", lt.released)
	}
}
