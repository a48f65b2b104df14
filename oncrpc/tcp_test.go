package oncrpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// echoServer is an in-process RPC peer for fault injection: it answers
// every call with SUCCESS and the call's arguments as results, in records
// cut into fragments of fragSize bytes.
type echoServer struct {
	ln       net.Listener
	fragSize int
	calls    atomic.Int64
	// wait, if set, runs before each reply is written, in the call's
	// own goroutine: a test holds a reply back until an event with it.
	wait func(payload []byte)
	// replied, if set, is called with each call's payload once its
	// reply is written.
	replied func(payload []byte)
	mu      sync.Mutex
	conns   []net.Conn
	// onConn, if set, runs in the connection's goroutine before serving.
	onConn func(c net.Conn, w *bufio.Writer, wmu *sync.Mutex)
}

// newEchoServer starts an echo server; setup, if not nil, configures it
// before it accepts connections.
func newEchoServer(t *testing.T, fragSize int, setup func(s *echoServer)) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln, fragSize: fragSize}
	if setup != nil {
		setup(s)
	}
	go s.serve()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
	})
	return s
}

func (s *echoServer) addr() string { return s.ln.Addr().String() }

func (s *echoServer) dropAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
	s.conns = nil
}

func (s *echoServer) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

func writeFragments(w *bufio.Writer, msg []byte, fragSize int) {
	for {
		n := min(len(msg), fragSize)
		hdr := uint32(n)
		if n == len(msg) {
			hdr |= lastFragment
		}
		binary.Write(w, binary.BigEndian, hdr)
		w.Write(msg[:n])
		msg = msg[n:]
		if len(msg) == 0 {
			break
		}
	}
	w.Flush()
}

func (s *echoServer) serveConn(c net.Conn) {
	br := bufio.NewReader(c)
	bw := bufio.NewWriter(c)
	var wmu sync.Mutex
	if s.onConn != nil {
		s.onConn(c, bw, &wmu)
	}
	for {
		msg, _, err := readRecord(br, 1<<30, 1<<30)
		if err != nil {
			return
		}
		if mt, _ := MessageType(msg.buf); mt == MsgReply {
			continue // reply to a backward call; the test checks it itself
		}
		h, args, err := ParseCall(msg.buf)
		if err != nil {
			return
		}
		s.calls.Add(1)
		args = append([]byte(nil), args...)
		go func() {
			if s.wait != nil && len(args) >= 4 {
				s.wait(args[4:]) // the payload after its length word
			}
			var e xdr.Encoder
			AppendAcceptedReply(&e, h.XID, Success, 0, 0)
			e.FixedOpaque(args)
			wmu.Lock()
			writeFragments(bw, e.Bytes(), s.fragSize)
			wmu.Unlock()
			if s.replied != nil && len(args) >= 4 {
				s.replied(args[4:])
			}
		}()
	}
}

func echoCall(ctx context.Context, c *Client, payload []byte) ([]byte, error) {
	var e xdr.Encoder
	xid := c.StartCall(&e, 1, AuthSys{MachineName: "t", UID: 1, GID: 2}.Credential())
	e.Uint32(uint32(len(payload)))
	rep, err := c.Do(ctx, &Call{XID: xid, Head: e.Bytes(), Bulk: Plain(payload)})
	if err != nil {
		return nil, err
	}
	defer rep.Release()
	d := xdr.NewDecoder(rep.Results)
	out := d.Opaque(1 << 30)
	if err := d.Err(); err != nil {
		return nil, err
	}
	return append([]byte(nil), out...), nil
}

func TestTCPMultiFragmentBothWays(t *testing.T) {
	srv := newEchoServer(t, 1000, nil)
	tr := NewTCPTransport(srv.addr(), TCPOptions{MaxFragment: 777})
	defer tr.Close()
	c := NewClient(tr, 99, 1, ClientOptions{})
	for _, n := range []int{0, 1, 776, 777, 778, 4096, 100003} {
		payload := bytes.Repeat([]byte{byte(n)}, n)
		got, err := echoCall(context.Background(), c, payload)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if !bytes.Equal(got, payload) {
			t.Fatalf("%d bytes: echo mismatch (got %d bytes)", n, len(got))
		}
	}
}

func TestTCPManyInFlight(t *testing.T) {
	// The server holds every reply until all calls have arrived, then
	// replies in reverse order of arrival, one at a time: the client must
	// match replies to calls by XID.
	const n = 200
	var mu sync.Mutex
	var held []chan struct{}
	written := make(chan struct{})
	srv := newEchoServer(t, 1<<20, func(s *echoServer) {
		s.wait = func([]byte) {
			ch := make(chan struct{})
			mu.Lock()
			held = append(held, ch)
			if len(held) == n {
				go func() {
					for i := n - 1; i >= 0; i-- {
						close(held[i])
						<-written
					}
				}()
			}
			mu.Unlock()
			<-ch
		}
		s.replied = func([]byte) { written <- struct{}{} }
	})
	tr := NewTCPTransport(srv.addr(), TCPOptions{})
	defer tr.Close()
	c := NewClient(tr, 99, 1, ClientOptions{})
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			payload := bytes.Repeat([]byte{byte(i)}, 1+i*13)
			got, err := echoCall(context.Background(), c, payload)
			if err == nil && !bytes.Equal(got, payload) {
				err = fmt.Errorf("call %d: wrong reply", i)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestTCPCancelLeavesConnectionUsable(t *testing.T) {
	// The server holds the reply to the 0xee call until the client has
	// given up on it (its context cancelled) and made another call.
	arrived, release, lateSent := make(chan struct{}), make(chan struct{}), make(chan struct{})
	srv := newEchoServer(t, 1<<20, func(s *echoServer) {
		s.wait = func(args []byte) {
			if len(args) > 0 && args[0] == 0xee {
				close(arrived)
				<-release
			}
		}
		s.replied = func(args []byte) {
			if len(args) > 0 && args[0] == 0xee {
				close(lateSent)
			}
		}
	})
	var conns atomic.Uint64
	tr := NewTCPTransport(srv.addr(), TCPOptions{OnConnect: func(g uint64) { conns.Store(g) }})
	defer tr.Close()
	c := NewClient(tr, 99, 1, ClientOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	cancelled := make(chan error, 1)
	go func() {
		_, err := echoCall(ctx, c, []byte{0xee})
		cancelled <- err
	}()
	<-arrived
	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context canceled", err)
	}
	got, err := echoCall(context.Background(), c, []byte("after"))
	if err != nil || string(got) != "after" {
		t.Fatalf("call after cancel: %q %v", got, err)
	}
	// Now the server writes the reply to the cancelled call. The next
	// call's reply comes after it on the same stream, so when that call
	// returns, the client has read the late reply and dropped it.
	close(release)
	<-lateSent
	if got, err := echoCall(context.Background(), c, []byte("late")); err != nil || string(got) != "late" {
		t.Fatalf("call after late reply: %q %v", got, err)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections, want 1: the late reply must not break the connection", n)
	}
}

func TestTCPReconnectRetransmits(t *testing.T) {
	var once sync.Once
	srv := newEchoServer(t, 1<<20, func(s *echoServer) {
		// The first transmission's connection is closed before its
		// reply is written: the reply is lost with it.
		s.wait = func(args []byte) {
			if args[0] == 1 {
				once.Do(s.dropAll)
			}
		}
	})
	gens := atomic.Uint64{}
	tr := NewTCPTransport(srv.addr(), TCPOptions{OnConnect: func(g uint64) { gens.Store(g) }})
	defer tr.Close()
	retrans := atomic.Int32{}
	c := NewClient(tr, 99, 1, ClientOptions{Retrans: 3, OnRetransmit: func(uint32, int, error) { retrans.Add(1) }})
	got, err := echoCall(context.Background(), c, []byte{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, []byte{1, 2, 3}) {
		t.Fatalf("got %v", got)
	}
	if gens.Load() < 2 || retrans.Load() < 1 {
		t.Fatalf("connections %d retransmissions %d, want a reconnect and a retransmission", gens.Load(), retrans.Load())
	}
}

// TestTCPTimeoutReconnects checks that a call that timed out is sent
// again over a new connection, never on the one it got no reply on
// (RFC 8881 s2.9.2; rfc5666bis s7.3.2, checklist B4-7.3.2-a), and that
// the old connection is closed by the client.
func TestTCPTimeoutReconnects(t *testing.T) {
	never := make(chan struct{}) // the first transmission is never answered
	t.Cleanup(func() { close(never) })
	var first atomic.Bool
	srv := newEchoServer(t, 1<<20, func(s *echoServer) {
		s.wait = func([]byte) {
			if first.CompareAndSwap(false, true) {
				<-never
			}
		}
	})
	gens := atomic.Uint64{}
	tr := NewTCPTransport(srv.addr(), TCPOptions{OnConnect: func(g uint64) { gens.Store(g) }})
	defer tr.Close()
	c := NewClient(tr, 99, 1, ClientOptions{Timeout: 50 * time.Millisecond, Hard: true})
	got, err := echoCall(context.Background(), c, []byte{7})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, []byte{7}) {
		t.Fatalf("got %v", got)
	}
	if n := srv.calls.Load(); n != 2 {
		t.Fatalf("server saw %d transmissions, want 2", n)
	}
	if g := gens.Load(); g != 2 {
		t.Fatalf("%d connections, want the retransmission on a second one", g)
	}
	// The first connection was closed by the client: the server reads EOF.
	srv.mu.Lock()
	old := srv.conns[0]
	srv.mu.Unlock()
	old.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := old.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("first connection: read %v, want EOF (closed by the client)", err)
	}
}

func TestTCPSoftTimeout(t *testing.T) {
	never := make(chan struct{}) // no reply until the test is over
	t.Cleanup(func() { close(never) })
	srv := newEchoServer(t, 1<<20, func(s *echoServer) {
		s.wait = func([]byte) { <-never }
	})
	tr := NewTCPTransport(srv.addr(), TCPOptions{})
	defer tr.Close()
	c := NewClient(tr, 99, 1, ClientOptions{Timeout: 20 * time.Millisecond, Retrans: 2})
	_, err := echoCall(context.Background(), c, []byte{1})
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if n := srv.calls.Load(); n != 3 {
		t.Fatalf("server saw %d transmissions, want 3", n)
	}
}

func TestTCPDialFailure(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	tr := NewTCPTransport(addr, TCPOptions{})
	const timeo = 300 * time.Millisecond
	c := NewClient(tr, 99, 1, ClientOptions{Retrans: 1, Timeout: timeo})
	start := time.Now()
	err := c.Ping(context.Background())
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrConnection) {
		t.Fatalf("err = %v, want timeout wrapping connection error", err)
	}
	if d := time.Since(start); d < timeo {
		t.Fatalf("a soft client gave up after %v of refused connections, before its %v timeout", d, timeo)
	}
}

// TestTCPSoftRidesOutRestart: a soft client whose server refuses
// connections for longer than Retrans quick attempts (a restarting
// server) still gets its reply once the server is back within timeo.
func TestTCPSoftRidesOutRestart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	tr := NewTCPTransport(addr, TCPOptions{})
	defer tr.Close()
	back := make(chan struct{})
	var failures atomic.Int32
	c := NewClient(tr, 99, 1, ClientOptions{Retrans: 1, Timeout: time.Minute,
		OnRetransmit: func(uint32, int, error) {
			if failures.Add(1) == 4 {
				close(back)
			}
		}})
	go func() {
		<-back
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("listen again on %s: %v", addr, err)
			return
		}
		t.Cleanup(func() { ln.Close() })
		serveTCP(ln, handlerFunc(func(m []byte) []byte {
			ch, _, err := ParseCall(m)
			if err != nil {
				return nil
			}
			var e xdr.Encoder
			AppendAcceptedReply(&e, ch.XID, Success, 0, 0)
			return e.Bytes()
		}))
	}()
	if err := c.Ping(context.Background()); err != nil {
		t.Fatalf("ping across %d refused connections: %v", failures.Load(), err)
	}
}

type handlerFunc func([]byte) []byte

func (f handlerFunc) HandleCall(m []byte) []byte { return f(m) }

func TestTCPBackwardCall(t *testing.T) {
	gotReply := make(chan []byte, 1)
	srv := newEchoServer(t, 1<<20, func(s *echoServer) {
		s.onConn = func(c net.Conn, w *bufio.Writer, wmu *sync.Mutex) {
			// The server calls the client before serving it, in
			// 5-byte fragments: program 0x40000000.
			var e xdr.Encoder
			AppendCallHeader(&e, 0xabcdef, 0x40000000, 1, 0, AuthNone)
			wmu.Lock()
			writeFragments(w, e.Bytes(), 5)
			wmu.Unlock()
		}
	})
	tr := NewTCPTransport(srv.addr(), TCPOptions{})
	defer tr.Close()
	tr.SetCallHandler(handlerFunc(func(msg []byte) []byte {
		h, _, err := ParseCall(msg)
		if err != nil {
			t.Error(err)
			return nil
		}
		gotReply <- append([]byte(nil), msg...)
		var e xdr.Encoder
		AppendAcceptedReply(&e, h.XID, Success, 0, 0)
		return e.Bytes()
	}))
	c := NewClient(tr, 99, 1, ClientOptions{})
	if _, err := echoCall(context.Background(), c, []byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-gotReply:
		h, _, _ := ParseCall(msg)
		if h.XID != 0xabcdef || h.Prog != 0x40000000 {
			t.Fatalf("handler saw %+v", h)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("backward call not delivered")
	}
}

func TestTCPRecordTooLarge(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// The server keeps its end open until the test is over: closing it
	// with the call unread could reset the connection before the client
	// reads the fragment header.
	done := make(chan struct{})
	defer close(done)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		bufio.NewReader(c).Peek(4)
		c.Write([]byte{0xff, 0xff, 0xff, 0xff}) // a 2 GiB fragment
		<-done
	}()
	tr := NewTCPTransport(ln.Addr().String(), TCPOptions{MaxRecord: 1 << 20})
	defer tr.Close()
	var e xdr.Encoder
	AppendCallHeader(&e, 1, 1, 1, 0, AuthNone)
	_, err = tr.RoundTrip(context.Background(), &Call{XID: 1, Head: e.Bytes()})
	if !errors.Is(err, ErrConnection) || !errors.Is(err, errRecordTooLarge) {
		t.Fatalf("err = %v, want record-too-large connection error", err)
	}
}
