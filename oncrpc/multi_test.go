package oncrpc

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// echoHandler answers each call with its arguments as results; hold, if
// set, runs first (a test holds replies back with it).
type echoHandler struct {
	hold  func(args []byte)
	calls atomic.Int64
}

func (h *echoHandler) HandleCall(msg []byte) []byte {
	hdr, args, err := ParseCall(msg)
	if err != nil {
		return nil
	}
	h.calls.Add(1)
	if h.hold != nil {
		h.hold(args)
	}
	var e xdr.Encoder
	AppendAcceptedReply(&e, hdr.XID, Success, 0, 0)
	e.FixedOpaque(args)
	return e.Bytes()
}

// serveEcho runs Serve (server.go) with h on a loopback listener.
func serveEcho(t *testing.T, h CallHandler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		serveTCP(ln, h)
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	return ln.Addr().String()
}

// newMulti returns a MultiTransport of n TCP connections to addr.
func newMulti(t *testing.T, addr string, n int) *MultiTransport {
	t.Helper()
	conns := make([]Transport, n)
	for i := range conns {
		conns[i] = NewTCPTransport(addr, TCPOptions{})
	}
	m, err := NewMultiTransport(conns, MultiOptions{BindTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// binder is a BindFunc that sends an echo call "bind i" on the
// connection, and counts binds per connection.
type binder struct {
	mu    sync.Mutex
	binds map[int]int
}

func (b *binder) bind(ctx context.Context, i int, tr Transport) error {
	c := NewClient(tr, 1, 1, ClientOptions{Timeout: 5 * time.Second, Retrans: 1})
	want := fmt.Sprintf("bind %d", i)
	got, err := echoCall(ctx, c, []byte(want))
	if err != nil {
		return err
	}
	if string(got) != want {
		return fmt.Errorf("bind reply %q", got)
	}
	b.mu.Lock()
	if b.binds == nil {
		b.binds = make(map[int]int)
	}
	b.binds[i]++
	b.mu.Unlock()
	return nil
}

func (b *binder) count(i int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.binds[i]
}

func TestMultiRoundRobin(t *testing.T) {
	addr := serveEcho(t, &echoHandler{})
	m := newMulti(t, addr, 4)
	c := NewClient(m, 1, 1, ClientOptions{Timeout: 10 * time.Second})
	ctx := context.Background()

	// Before Bind only the first connection carries calls.
	for i := range 3 {
		if _, err := echoCall(ctx, c, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if st := m.Stats(); st[0].Calls != 3 || st[1].Calls+st[2].Calls+st[3].Calls != 0 {
		t.Fatalf("before Bind: %+v", st)
	}
	var b binder
	if err := m.Bind(ctx, b.bind); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 4; i++ {
		if b.count(i) != 1 {
			t.Errorf("connection %d bound %d times, want 1", i, b.count(i))
		}
	}
	if b.count(0) != 0 {
		t.Errorf("connection 0 bound %d times; CREATE_SESSION binds it", b.count(0))
	}
	before := m.Stats()
	for i := range 40 {
		p := bytes.Repeat([]byte{byte(i)}, i)
		got, err := echoCall(ctx, c, p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, p) {
			t.Fatalf("call %d: got %x", i, got)
		}
	}
	for i, s := range m.Stats() {
		if n := s.Calls - before[i].Calls; n != 10 {
			t.Errorf("connection %d carried %d of 40 calls, want 10", i, n)
		}
		if !s.Up || s.BytesSent == 0 || s.BytesRecv == 0 {
			t.Errorf("connection %d: %+v", i, s)
		}
	}
}

// TestMultiFailover breaks one connection while calls wait for their
// replies on every connection: its calls come back from another
// connection, and it is redialled and bound again.
func TestMultiFailover(t *testing.T) {
	const n, calls = 4, 16
	gate := make(chan struct{})
	var arrived sync.WaitGroup
	arrived.Add(calls)
	var first sync.Map
	h := &echoHandler{hold: func(args []byte) {
		// Calls are held, binds pass.
		if !bytes.Contains(args, []byte("call ")) {
			return
		}
		if _, dup := first.LoadOrStore(string(args), true); !dup {
			arrived.Done()
		}
		<-gate
	}}
	addr := serveEcho(t, h)
	m := newMulti(t, addr, n)
	var b binder
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.Bind(ctx, b.bind); err != nil {
		t.Fatal(err)
	}
	c := NewClient(m, 1, 1, ClientOptions{Timeout: time.Minute})

	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := []byte(fmt.Sprintf("call %d", i))
			got, err := echoCall(ctx, c, p)
			if err == nil && !bytes.Equal(got, p) {
				err = fmt.Errorf("call %d: got %q", i, got)
			}
			errs <- err
		}()
	}
	arrived.Wait()
	onBroken := m.Stats()[1].Calls
	m.Conn(1).(*TCPTransport).Abort()
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	var resent uint64
	for _, s := range m.Stats() {
		resent += s.Resent
	}
	if resent < onBroken {
		t.Errorf("%d calls resent, want at least the %d on the broken connection", resent, onBroken)
	}
	// The broken connection comes back, bound again, and carries calls.
	for m.Stats()[1].Reconnects == 0 {
		if ctx.Err() != nil {
			t.Fatalf("connection 1 not back: %+v", m.Stats()[1])
		}
		time.Sleep(10 * time.Millisecond)
	}
	if b.count(1) < 2 {
		t.Errorf("connection 1 bound %d times, want a second bind after the redial", b.count(1))
	}
	st := m.Stats()[1]
	if st.Failures != 1 || st.LastError == "" {
		t.Errorf("connection 1: %+v", st)
	}
	before := st.Calls
	for i := range 2 * n {
		if _, err := echoCall(ctx, c, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if m.Stats()[1].Calls == before {
		t.Error("the redialled connection carries no calls")
	}
}

func TestMultiConnectionCount(t *testing.T) {
	for _, n := range []int{0, MaxConnections + 1} {
		conns := make([]Transport, n)
		for i := range conns {
			conns[i] = NewTCPTransport("127.0.0.1:1", TCPOptions{})
		}
		if _, err := NewMultiTransport(conns, MultiOptions{}); err == nil {
			t.Errorf("%d connections accepted", n)
		}
	}
}

// TestMultiNoReplyMovesCall: a call the server never answers on its
// first connection is sent again, after the client's timeout, on
// another one (the transport broke the first: RFC 8881 s2.9.2), which
// is then redialled and bound again.
func TestMultiNoReplyMovesCall(t *testing.T) {
	var dropped atomic.Bool
	h := handlerFunc(func(msg []byte) []byte {
		_, args, err := ParseCall(msg)
		if err != nil {
			return nil
		}
		if bytes.Contains(args, []byte("stuck")) && dropped.CompareAndSwap(false, true) {
			return nil // no reply, the connection stays up
		}
		return (&echoHandler{}).HandleCall(msg)
	})
	addr := serveEcho(t, h)
	m := newMulti(t, addr, 3)
	var b binder
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.Bind(ctx, b.bind); err != nil {
		t.Fatal(err)
	}
	var retrans atomic.Int32
	c := NewClient(m, 1, 1, ClientOptions{Timeout: 200 * time.Millisecond, Retrans: 5,
		OnRetransmit: func(uint32, int, error) { retrans.Add(1) }})
	got, err := echoCall(ctx, c, []byte("stuck"))
	if err != nil || string(got) != "stuck" {
		t.Fatalf("got %q, %v", got, err)
	}
	if !dropped.Load() || retrans.Load() == 0 {
		t.Fatalf("the call was not retransmitted (dropped=%v retransmissions=%d)", dropped.Load(), retrans.Load())
	}
	var lost, back uint64
	for {
		lost, back = 0, 0
		for _, s := range m.Stats() {
			lost += s.Failures
			back += s.Reconnects
		}
		if back >= 1 || ctx.Err() != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if lost != 1 || back != 1 {
		t.Fatalf("connections lost %d, bound again %d, want 1 and 1: %+v", lost, back, m.Stats())
	}
}
