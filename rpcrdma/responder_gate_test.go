package rpcrdma

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// dialFrom connects a requester that sends nothing to the responder at
// addr from the loopback address src, and returns its queue pair.
func dialFrom(ctx context.Context, src, addr string) (verbs.QueuePair, error) {
	pv := &iwarp.Provider{DialConn: func(ctx context.Context, addr string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		return d.DialContext(ctx, "tcp", addr)
	}}
	priv := PrivateData{Version: privDataVersion, InlineSend: 4096, InlineRecv: 4096}.Marshal()
	return pv.Dial(ctx, addr, &verbs.ConnParams{PD: iwarp.NewProtectionDomain(), PrivateData: priv})
}

// TestResponderGate: Allow refuses a peer before its connection is set
// up; one source gets at most MaxConnsPerSource connections however many
// it opens, and another source is served beside them; a source's
// connections, once closed, count no more.
func TestResponderGate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	refusals := make(chan error, 64)
	resp, err := Listen("127.0.0.1:0", ResponderConfig{Provider: &iwarp.Provider{}, Handler: echoHandler{}, ReplyBulk: echoReplyBulk,
		MaxConns: 8, MaxConnsPerSource: 2,
		Allow:    func(peer net.Addr) bool { return peer.(*net.TCPAddr).IP.String() != "127.0.0.4" },
		OnRefuse: func(_ net.Addr, err error) { refusals <- err }})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Close()
	if _, err := dialFrom(ctx, "127.0.0.4", resp.Addr()); err == nil {
		t.Fatal("a peer Allow refuses was connected")
	}
	if err := <-refusals; !errors.Is(err, ErrNotAllowed) {
		t.Errorf("refusal of 127.0.0.4: %v, want ErrNotAllowed", err)
	}
	var held []verbs.QueuePair
	for range 6 {
		qp, err := dialFrom(ctx, "127.0.0.3", resp.Addr())
		if err == nil {
			held = append(held, qp)
		}
	}
	if len(held) != 2 {
		t.Fatalf("127.0.0.3 opened %d connections, want MaxConnsPerSource's 2", len(held))
	}
	tr := NewTransport(resp.Addr(), Config{Provider: &iwarp.Provider{}})
	defer tr.Close()
	env := &testEnv{resp: resp, tr: tr, clnt: oncrpc.NewClient(tr, echoProg, 1, oncrpc.ClientOptions{Timeout: 30 * time.Second, Retrans: 2})}
	if err := env.echo(ctx, pattern(1000), nil); err != nil {
		t.Fatalf("127.0.0.1 beside 127.0.0.3's connections: %v", err)
	}
	st := resp.Stats()
	if st.NotAllowed != 1 || st.OverLimit != 4 {
		t.Errorf("NotAllowed=%d OverLimit=%d, want 1 and 4", st.NotAllowed, st.OverLimit)
	}
	for range 4 {
		if err := <-refusals; !errors.Is(err, ErrTooManyConns) {
			t.Errorf("refusal of 127.0.0.3: %v, want ErrTooManyConns", err)
		}
	}
	for _, qp := range held {
		qp.Close()
	}
	for {
		qp, err := dialFrom(ctx, "127.0.0.3", resp.Addr())
		if err == nil {
			qp.Close()
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("127.0.0.3 refused after its connections closed: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestResponderIdleTimeout: a connection that sends nothing is closed
// after IdleTimeout and counted.
func TestResponderIdleTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := Listen("127.0.0.1:0", ResponderConfig{Provider: &iwarp.Provider{}, Handler: echoHandler{}, ReplyBulk: echoReplyBulk,
		IdleTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Close()
	qp, err := dialFrom(ctx, "127.0.0.1", resp.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	select {
	case <-qp.Done():
	case <-ctx.Done():
		t.Fatalf("a connection that sent nothing still open; stats %+v", resp.Stats())
	}
	for resp.Stats().Connections > 0 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	if st := resp.Stats(); st.IdleClosed != 1 || st.Connections != 0 {
		t.Errorf("IdleClosed=%d, %d connections open; want the silent connection closed as idle", st.IdleClosed, st.Connections)
	}
}
