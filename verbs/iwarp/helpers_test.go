package iwarp

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/verbstest"
)

// testTimeout only guards against hangs; no test relies on timing.
const testTimeout = 60 * time.Second

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// pair connects a client and a server queue pair over loopback TCP.
func pair(t testing.TB, cp, sp *verbs.ConnParams) (client, server *QP) {
	t.Helper()
	return pairWith(t, nil, cp, sp)
}

func pairWith(t testing.TB, pv *Provider, cp, sp *verbs.ConnParams) (client, server *QP) {
	t.Helper()
	ctx := testCtx(t)
	ln, err := Listen("127.0.0.1:0", sp)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		qp  *QP
		err error
	}
	ch := make(chan res, 1)
	go func() {
		qp, err := ln.AcceptQP(ctx)
		ch <- res{qp, err}
	}()
	if pv == nil {
		pv = &Provider{}
	}
	c, err := pv.Dial(ctx, ln.Addr().String(), cp)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatalf("accept: %v", r.err)
	}
	client, server = c.(*QP), r.qp
	t.Cleanup(func() {
		client.Close()
		server.Close()
	})
	return client, server
}

// reg registers buf in pd. Test buffers are Go heap memory: the pure-Go
// provider pins nothing, so that is fine here (the transport registers
// memory it owns outside the heap, see package mrcache).
func reg(t testing.TB, pd *verbs.ProtectionDomain, buf []byte, access verbs.Access) *verbs.MemoryRegion {
	t.Helper()
	mr, err := pd.RegisterMemory(buf, access)
	if err != nil {
		t.Fatalf("register %d bytes: %v", len(buf), err)
	}
	return mr
}

// gather registers each buffer in pd (local read access only, which every
// region has) and returns a gather list of one SGE per buffer, in order.
func gather(t testing.TB, pd *verbs.ProtectionDomain, bufs ...[]byte) []verbs.SGE {
	t.Helper()
	sgl := make([]verbs.SGE, len(bufs))
	for i, b := range bufs {
		sgl[i] = verbs.SGE{MR: reg(t, pd, b, 0), Length: uint32(len(b))}
	}
	return sgl
}

// recvWR registers buf with local write access in pd and returns a
// receive work request for all of it. It reports errors instead of
// failing the test, for use in ConnParams.Setup (another goroutine).
func recvWR(pd *verbs.ProtectionDomain, wrid uint64, buf []byte) (verbs.RecvWR, error) {
	mr, err := pd.RegisterMemory(buf, verbs.AccessLocalWrite)
	if err != nil {
		return verbs.RecvWR{}, err
	}
	return verbs.RecvWR{WRID: wrid, SGL: []verbs.SGE{{MR: mr, Length: uint32(len(buf))}}}, nil
}

// postRecv registers buf and posts it on qp as receive wrid.
func postRecv(qp verbs.QueuePair, wrid uint64, buf []byte) error {
	wr, err := recvWR(qp.PD(), wrid, buf)
	if err != nil {
		return err
	}
	return qp.PostRecv(wr)
}

// The completion helpers are the conformance suite's.
var (
	pollN   = verbstest.PollN
	pollOne = verbstest.PollOne
	expect  = verbstest.Expect
)

func randBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

func mustEqual(t testing.TB, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("data mismatch: %d vs %d bytes, first difference at %d", len(got), len(want), i)
	}
}

// faultConn corrupts the byte at stream offset corruptAt of what it
// writes (counting from arm), to test CRC checking.
type faultConn struct {
	net.Conn
	mu        sync.Mutex
	armed     bool
	written   int64
	corruptAt int64
}

func (c *faultConn) arm(at int64) {
	c.mu.Lock()
	c.armed, c.written, c.corruptAt = true, 0, at
	c.mu.Unlock()
}

func (c *faultConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	if c.armed && c.corruptAt >= c.written && c.corruptAt < c.written+int64(len(b)) {
		nb := append([]byte(nil), b...)
		nb[c.corruptAt-c.written] ^= 0x5a
		b = nb
	}
	if c.armed {
		c.written += int64(len(b))
	}
	c.mu.Unlock()
	return c.Conn.Write(b)
}
