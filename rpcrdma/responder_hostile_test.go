package rpcrdma

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// Hostile requesters against the responder: a raw queue pair of the
// pure-Go provider that sends whatever transport headers the test
// writes, beyond the grant, with Read chunks it never lets the responder
// read.

// stallConn is a requester's connection that, once stalled, swallows
// everything the responder sends (so the responder's RDMA Reads are
// never answered) while the requester can still send; the end of the
// stream still reaches the requester.
type stallConn struct {
	net.Conn
	stalled   atomic.Bool
	swallowed atomic.Int64
}

func (c *stallConn) Read(p []byte) (int, error) {
	for {
		n, err := c.Conn.Read(p)
		if !c.stalled.Load() || err != nil {
			return n, err
		}
		c.swallowed.Add(int64(n))
	}
}

// rawRequester is a requester that follows no rule but the test's.
type rawRequester struct {
	t       *testing.T
	qp      verbs.QueuePair
	pd      *verbs.ProtectionDomain
	conn    *stallConn
	recvMem []byte // its receive buffers, 4096 bytes each, by WRID
	mu      sync.Mutex
	wr      uint64
}

// dialRaw connects a raw requester to the responder at addr, with
// receive buffers posted for nrecv replies.
func dialRaw(t *testing.T, ctx context.Context, addr string, nrecv int) *rawRequester {
	t.Helper()
	r := &rawRequester{t: t, pd: iwarp.NewProtectionDomain()}
	pv := &iwarp.Provider{DialConn: func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		r.conn = &stallConn{Conn: c}
		return r.conn, nil
	}}
	mem := make([]byte, nrecv*4096)
	r.recvMem = mem
	mr, err := r.pd.RegisterMemory(mem, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	setup := func(qp verbs.QueuePair) error {
		for i := range nrecv {
			sge := verbs.SGE{MR: mr, Offset: uint64(i * 4096), Length: 4096}
			if err := qp.PostRecv(verbs.RecvWR{WRID: uint64(i), SGL: []verbs.SGE{sge}}); err != nil {
				return err
			}
		}
		return nil
	}
	priv := PrivateData{Version: privDataVersion, InlineSend: 4096, InlineRecv: 4096}.Marshal()
	qp, err := pv.Dial(ctx, addr, &verbs.ConnParams{PD: r.pd, PrivateData: priv, Setup: setup})
	if err != nil {
		t.Fatal(err)
	}
	r.qp = qp
	t.Cleanup(func() { qp.Close() })
	return r
}

// send posts msg as one Send without waiting for it.
func (r *rawRequester) send(msg []byte) {
	r.t.Helper()
	b := append([]byte(nil), msg...)
	mr, err := r.pd.RegisterMemory(b, verbs.AccessLocalWrite)
	if err != nil {
		r.t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.wr++
	if err := r.qp.PostSend(verbs.SendWR{WRID: r.wr, Opcode: verbs.OpSend, SGL: []verbs.SGE{{MR: mr, Length: uint32(len(b))}}}); err != nil {
		r.t.Fatal(err)
	}
}

// firstCall sends one echo call and waits for its reply, as a requester
// does before it has a grant beyond one credit (RFC 8166 s3.3.3); it
// returns the grant the reply carries.
func (r *rawRequester) firstCall(ctx context.Context) uint32 {
	r.t.Helper()
	var args xdr.Encoder
	args.Opaque([]byte("first"))
	r.send(callMsg(999, args.Bytes(), nil))
	var wc [1]verbs.Completion
	n, err := r.qp.RecvCQ().Poll(ctx, wc[:])
	if err != nil || n != 1 || wc[0].Status != verbs.StatusSuccess {
		r.t.Fatalf("the first call's reply: %d completions, %v", n, err)
	}
	if wc[0].ByteLen < 12 {
		r.t.Fatalf("the first call's reply has %d bytes", wc[0].ByteLen)
	}
	return binary.BigEndian.Uint32(r.recvMem[int(wc[0].WRID)*4096+8:])
}

// closed reports whether the connection has broken.
func (r *rawRequester) closed() bool {
	select {
	case <-r.qp.Done():
		return true
	default:
		return false
	}
}

// callMsg is an RDMA_MSG carrying an echo call of args, with a Read chunk
// of reads, if any, at the end of the arguments.
func callMsg(xid uint32, args []byte, reads []ReadSegment) []byte {
	h := Header{XID: xid, Vers: Version1, Credit: 1024, Proc: ProcMsg, Reads: reads}
	var e xdr.Encoder
	h.Append(&e)
	return append(e.Bytes(), mkCall(xid, procEcho, args)...)
}

// TestHostileResponderGrant: a requester that sends 64 calls on a grant
// of 4 never has more than 4 calls in progress at the responder (the
// handler sees at most 4 at once, MaxInFlight stays at 4): the responder
// closes its connection (RFC 8166 s3.3.1: "the RDMA layer may signal an
// error, possibly terminating the connection"), and an honest requester
// is served meanwhile.
func TestHostileResponderGrant(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const grant = 4
	release := make(chan struct{})
	var cur, most atomic.Int32
	over := make(chan struct{})
	var overOnce sync.Once
	hold := func() {
		n := cur.Add(1)
		defer cur.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if n > grant {
			overOnce.Do(func() { close(over) })
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
	}
	resp, err := Listen("127.0.0.1:0", ResponderConfig{Provider: &iwarp.Provider{}, Handler: echoHandler{wait: hold}, Credits: grant})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Close()
	var relOnce sync.Once
	unblock := func() { relOnce.Do(func() { close(release) }) }
	defer unblock()
	r := dialRaw(t, ctx, resp.Addr(), 8)
	var args xdr.Encoder
	args.Opaque([]byte("hostile"))
	for i := range 64 {
		r.send(callMsg(uint32(1000+i), args.Bytes(), nil))
	}
	select {
	case <-r.qp.Done():
	case <-over:
	case <-ctx.Done():
		t.Fatal("the responder neither closed the connection nor ran more calls than granted")
	}
	if m := most.Load(); m > grant {
		t.Fatalf("the handler ran %d calls of one connection at once on a grant of %d", m, grant)
	}
	if m := resp.MaxInFlight(); m > grant {
		t.Fatalf("the responder had %d calls of one connection in progress on a grant of %d", m, grant)
	}
	// The others go on: an honest requester (whose calls find the
	// handler blocked too, so it is released first).
	unblock()
	tr := NewTransport(resp.Addr(), Config{Provider: &iwarp.Provider{}})
	defer tr.Close()
	clnt := oncrpc.NewClient(tr, echoProg, 1, oncrpc.ClientOptions{Timeout: 30 * time.Second, Retrans: 2})
	env := &testEnv{resp: resp, tr: tr, clnt: clnt}
	if err := env.echo(ctx, pattern(100), nil); err != nil {
		t.Fatalf("honest requester: %v", err)
	}
}

// stallReads connects a raw requester that offers calls with Read
// chunks of chunk bytes each and never answers the responder's RDMA
// Reads of them.
func stallReads(t *testing.T, ctx context.Context, addr string, calls, chunk int) *rawRequester {
	t.Helper()
	r := dialRaw(t, ctx, addr, 8)
	src, err := r.pd.RegisterMemory(make([]byte, chunk), verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if g := r.firstCall(ctx); g < uint32(calls) {
		t.Fatalf("the first reply grants %d credits; the test sends %d calls", g, calls)
	}
	r.conn.stalled.Store(true)
	for i := range calls {
		var args xdr.Encoder
		args.Uint32(uint32(chunk)) // the opaque's length; its data is the chunk
		pos := uint32(len(mkCall(0, procEcho)) + 4)
		r.send(callMsg(uint32(5000+i), args.Bytes(), []ReadSegment{{Position: pos, Segment: Segment{Handle: src.STag(), Length: uint32(chunk)}}}))
	}
	return r
}

// waitSettled waits until the responder's registered memory in use has
// stopped changing and is at least min bytes.
func waitSettled(t *testing.T, ctx context.Context, resp *Responder, min int64) int64 {
	t.Helper()
	last, same := int64(-1), 0
	for same < 3 {
		if ctx.Err() != nil {
			t.Fatalf("the responder's memory did not settle: %d bytes in use", last)
		}
		time.Sleep(100 * time.Millisecond)
		n := resp.Buffers().Stats().BytesInUse
		if n == last && n >= min {
			same++
		} else {
			last, same = n, 0
		}
	}
	return last
}

// TestHostileResponderStalledReads: a requester that offers calls with
// Read chunks and never lets the responder read them holds no more than
// its share of the responder's registered memory, so a second requester
// is served while the first still stalls (before, the first held the
// whole slab and the second could not even connect: its receive buffers
// waited for memory forever).
func TestHostileResponderStalledReads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const chunk = 4<<20 - 4096 // a call rebuilt in one 4 MiB slab buffer
	resp, err := Listen("127.0.0.1:0", ResponderConfig{Provider: &iwarp.Provider{}, Handler: echoHandler{}, ReplyBulk: echoReplyBulk,
		Memory: 64 << 20, ConnMemory: 16 << 20, ReadTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Close()
	a := stallReads(t, ctx, resp.Addr(), 20, chunk)
	held := waitSettled(t, ctx, resp, 4<<20)
	if held > 16<<20 {
		t.Fatalf("a stalled requester holds %d bytes of registered memory; its share is %d", held, 16<<20)
	}
	tr := NewTransport(resp.Addr(), Config{Provider: &iwarp.Provider{}})
	defer tr.Close()
	env := &testEnv{resp: resp, tr: tr, clnt: oncrpc.NewClient(tr, echoProg, 1, oncrpc.ClientOptions{Timeout: 30 * time.Second, Retrans: 2})}
	for _, n := range []int{100, 64 << 10, 1 << 20} {
		if err := env.echo(ctx, pattern(n), nil); err != nil {
			t.Fatalf("second requester, echo of %d bytes: %v", n, err)
		}
	}
	if a.closed() {
		t.Fatal("the stalled requester's connection was closed: the second requester was not served beside it")
	}
}

// TestHostileResponderReadDeadline: a requester that leaves a Read
// chunk unanswered past the responder's deadline has its connection
// closed and its memory given back; the responder serves others.
func TestHostileResponderReadDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := Listen("127.0.0.1:0", ResponderConfig{Provider: &iwarp.Provider{}, Handler: echoHandler{}, ReplyBulk: echoReplyBulk,
		ReadTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Close()
	before := resp.Buffers().Stats().BytesInUse
	a := stallReads(t, ctx, resp.Addr(), 4, 1<<20)
	select {
	case <-a.qp.Done():
	case <-ctx.Done():
		t.Fatal("the responder did not close a connection whose Read chunks went unanswered")
	}
	for resp.Buffers().Stats().BytesInUse != before {
		if ctx.Err() != nil {
			t.Fatalf("%d bytes of registered memory in use after the connection closed, %d before", resp.Buffers().Stats().BytesInUse, before)
		}
		time.Sleep(10 * time.Millisecond)
	}
	tr := NewTransport(resp.Addr(), Config{Provider: &iwarp.Provider{}})
	defer tr.Close()
	env := &testEnv{resp: resp, tr: tr, clnt: oncrpc.NewClient(tr, echoProg, 1, oncrpc.ClientOptions{Timeout: 30 * time.Second, Retrans: 2})}
	if err := env.echo(ctx, pattern(1<<20), nil); err != nil {
		t.Fatal(err)
	}
}

// TestResponderShareNoDeadlock: an honest requester whose calls in
// progress fill the inbound half of its share with their Read chunks
// (8 calls of 3 MiB on a 16 MiB share) still gets every reply through
// RDMA Writes from the outbound half: a call holding its Read sink while
// its reply waits for memory never waits on another such call (nor
// until a timeout breaks the connection: one connection throughout).
func TestResponderShareNoDeadlock(t *testing.T) {
	env := newEnv(t, Version1, ResponderConfig{Credits: 8, ConnMemory: 16 << 20}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 3<<20 + i
			if err := env.echo(ctx, pattern(n), make([]byte, n)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if st := env.tr.Stats(); st.Connects != 1 {
		t.Fatalf("%d connections: calls waited for each other until a timeout broke the connection", st.Connects)
	}
}
