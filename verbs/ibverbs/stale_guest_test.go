//go:build guestrdma

package ibverbs_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/mrcache/mrcachetest"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/rpcrdma"
	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/ibverbs"
)

// staleMarker fills the requester's slab before each call of
// TestGuestStaleBytes: any of it in what a call delivers is a byte the
// server did not write for that call.
var staleMarker = []byte("STALE!!!")

// fillSlab writes staleMarker over every free byte of the pool's budget.
func fillSlab(t *testing.T, pool *mrcache.Pool) {
	t.Helper()
	if err := pool.Poison(staleMarker); err != nil {
		t.Fatal(err)
	}
}

// overclaimServer is a hostile RPC-over-RDMA responder on the rdma-core
// provider: for a Write chunk it RDMA-Writes 100 bytes and claims the
// whole chunk, for a Reply chunk it writes the reply (28 bytes) and
// claims the whole chunk.
type overclaimServer struct {
	t    *testing.T
	qp   verbs.QueuePair
	pool *mrcache.Pool
	recv []*mrcache.Buffer
	out  *mrcache.Buffer // send and RDMA Write source
}

const overclaimWritten = 100

// startOverclaimServer listens on addr and serves one connection; the
// channel reports how serving it ended (nil: the client went away).
func startOverclaimServer(ctx context.Context, t *testing.T, p *ibverbs.Provider, addr string) (string, <-chan error) {
	t.Helper()
	pd := p.NewProtectionDomain()
	pool := mrcache.New(pd, 8<<20)
	t.Cleanup(pool.Close)
	s := &overclaimServer{t: t, pool: pool}
	for range 8 {
		b, err := pool.GetWait(ctx, 8192)
		if err != nil {
			t.Fatal(err)
		}
		s.recv = append(s.recv, b)
	}
	out, err := pool.GetWait(ctx, 8192)
	if err != nil {
		t.Fatal(err)
	}
	s.out = out
	setup := func(qp verbs.QueuePair) error {
		for i := range s.recv {
			if err := s.postRecv(qp, i); err != nil {
				return err
			}
		}
		return nil
	}
	ln, err := p.Listen(addr, &verbs.ConnParams{PD: pd, Setup: setup})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	done := make(chan error, 1)
	go func() {
		qp, err := ln.Accept(ctx)
		if err != nil {
			done <- err
			return
		}
		s.qp = qp
		defer qp.Close()
		done <- s.serve(ctx)
	}()
	return ln.Addr().String(), done
}

func (s *overclaimServer) postRecv(qp verbs.QueuePair, i int) error {
	sge, err := s.recv[i].SGE(0, 8192)
	if err != nil {
		return err
	}
	return qp.PostRecv(verbs.RecvWR{WRID: uint64(i), SGL: []verbs.SGE{sge}})
}

// post posts wr with n bytes of s.out and waits for its completion.
func (s *overclaimServer) post(ctx context.Context, wr verbs.SendWR, n int) error {
	sge, err := s.out.SGE(0, n)
	if err != nil {
		return err
	}
	wr.SGL = []verbs.SGE{sge}
	if err := s.qp.PostSend(wr); err != nil {
		return err
	}
	var wc [1]verbs.Completion
	if _, err := s.qp.SendCQ().Poll(ctx, wc[:]); err != nil {
		return err
	}
	if wc[0].Status != verbs.StatusSuccess {
		return fmt.Errorf("%v completed %v", wr.Opcode, wc[0].Status)
	}
	return nil
}

func (s *overclaimServer) serve(ctx context.Context) error {
	var wc [1]verbs.Completion
	for {
		if _, err := s.qp.RecvCQ().Poll(ctx, wc[:]); err != nil {
			return err
		}
		c := wc[0]
		if c.Status == verbs.StatusFlushed {
			return nil // the client closed the connection
		}
		if c.Status != verbs.StatusSuccess {
			return fmt.Errorf("receive %v", c.Status)
		}
		var h rpcrdma.Header
		if _, err := h.Decode(s.recv[c.WRID].Bytes()[:c.ByteLen], false); err != nil {
			return err
		}
		if err := s.postRecv(s.qp, int(c.WRID)); err != nil {
			return err
		}
		var rpc xdr.Encoder
		reply := rpcrdma.Header{XID: h.XID, Vers: rpcrdma.Version1, Credit: 4, Proc: rpcrdma.ProcMsg}
		switch {
		case len(h.Writes) == 1 && len(h.Writes[0]) == 1:
			seg := h.Writes[0][0]
			for i := range overclaimWritten {
				s.out.Bytes()[i] = byte(i)
			}
			if err := s.post(ctx, verbs.SendWR{Opcode: verbs.OpRDMAWrite, RemoteSTag: seg.Handle, RemoteOffset: seg.Offset}, overclaimWritten); err != nil {
				return err
			}
			reply.Writes = [][]rpcrdma.Segment{{seg}} // claims all seg.Length bytes
			oncrpc.AppendAcceptedReply(&rpc, h.XID, oncrpc.Success, 0, 0)
			rpc.Uint32(seg.Length)
		case len(h.Reply) == 1:
			seg := h.Reply[0]
			oncrpc.AppendAcceptedReply(&rpc, h.XID, oncrpc.Success, 0, 0)
			rpc.Uint32(0)
			n := copy(s.out.Bytes(), rpc.Bytes())
			if err := s.post(ctx, verbs.SendWR{Opcode: verbs.OpRDMAWrite, RemoteSTag: seg.Handle, RemoteOffset: seg.Offset}, n); err != nil {
				return err
			}
			reply.Proc, reply.Reply = rpcrdma.ProcNoMsg, []rpcrdma.Segment{seg} // claims the whole chunk
			rpc.Reset(nil)
		default:
			return fmt.Errorf("call %#x offers no single Write chunk segment and no Reply chunk", h.XID)
		}
		var e xdr.Encoder
		reply.Append(&e)
		n := copy(s.out.Bytes(), e.Bytes())
		n += copy(s.out.Bytes()[n:], rpc.Bytes())
		if err := s.post(ctx, verbs.SendWR{Opcode: verbs.OpSend}, n); err != nil {
			return err
		}
	}
}

// TestGuestStaleBytes runs the requester on the rdma-core provider over the
// device RDMAFS_CONFORMANCE_DEV against a hostile server on the same
// device that claims more bytes of a Write chunk or Reply chunk than it
// wrote. The device places RDMA Writes without the host seeing them, so
// the claim is taken; every slab buffer is filled with a marker first,
// and no marker byte may show in what a call delivers (the buffers are
// zeroed before exposure, rpcrdma CONFORMANCE.md "What the client can
// verify with a hardware provider"). TestKnfsdGuestRxeSiw runs it inside
// the knfsd guest over siw0 and rxe0.
func TestGuestStaleBytes(t *testing.T) {
	p, dev, addr := guestDevice(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, served := startOverclaimServer(ctx, t, p, addr)
	tr := rpcrdma.NewTransport(srv, rpcrdma.Config{Provider: p, Version: rpcrdma.Version1, MemoryBytes: 8 << 20})
	closed := false
	defer func() {
		if !closed {
			tr.Close()
		}
	}()
	pool := tr.Buffers()
	head := func(xid uint32, args ...uint32) []byte {
		var e xdr.Encoder
		oncrpc.AppendCallHeader(&e, xid, 0x20000099, 1, 4, oncrpc.AuthNone)
		for _, a := range args {
			e.Uint32(a)
		}
		return e.Bytes()
	}

	fillSlab(t, pool)
	lent, err := pool.Get(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer lent.Release()
	dest := lent.Bytes()
	rep, err := tr.RoundTrip(ctx, &oncrpc.Call{XID: 0x51, Head: head(0x51, 4096), ReplyBulk: oncrpc.Lent(lent), MaxReplySize: 128})
	if err != nil {
		t.Fatalf("Write chunk call: %v", err)
	}
	got := dest[:rep.BulkLen]
	rep.Release()
	if len(got) < overclaimWritten || got[overclaimWritten-1] != overclaimWritten-1 {
		t.Fatalf("Write chunk: %d bytes delivered, not the %d written first", len(got), overclaimWritten)
	}
	if i := bytes.Index(got, staleMarker[:4]); i >= 0 {
		t.Fatalf("over %s: %d bytes written, %d claimed: stale bytes delivered at %d", dev, overclaimWritten, len(got), i)
	}

	fillSlab(t, pool)
	rep, err = tr.RoundTrip(ctx, &oncrpc.Call{XID: 0x52, Head: head(0x52), MaxReplySize: 16384})
	if err != nil {
		t.Fatalf("Reply chunk call: %v", err)
	}
	msg := append([]byte(nil), rep.Msg...)
	rep.Release()
	if len(msg) < 28 || binary.BigEndian.Uint32(msg) != 0x52 {
		t.Fatalf("Reply chunk: %d bytes delivered", len(msg))
	}
	if i := bytes.Index(msg, staleMarker[:4]); i >= 0 {
		t.Fatalf("over %s: 28 bytes written into the Reply chunk, %d claimed: stale bytes delivered at %d", dev, len(msg), i)
	}
	tr.Close()
	closed = true
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("hostile server: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the hostile server's queue pair did not see the requester close")
	}
	how := "per-call registration"
	if binds := ibverbs.WindowBinds(tr.PD()); binds > 0 {
		how = fmt.Sprintf("memory windows, %d binds", binds)
	}
	fmt.Printf("STALE %s (%s): Write chunk %d bytes claimed, Reply chunk %d bytes claimed: no stale byte delivered\n", dev, how, len(got), len(msg))
}

// wantWindows reports whether the rdma-core provider must expose memory
// with memory windows on dev: rxe has type-2 windows; siw has none.
func wantWindows(dev string) bool { return strings.HasPrefix(dev, "rxe") }

// TestGuestExposureRate measures what exposing a call's 4 KiB costs on the
// rdma-core provider over RDMAFS_CONFORMANCE_DEV, both ways in one run:
// mrcache's Expose, the bind and Invalidate of one slab buffer, back to
// back. With memory windows (where the device has them) that is a bind
// work request posted alone and waited for (in a call it is chained
// before the Send, so this overstates it) and a local invalidation waited
// for; with per-call registration an ibv_reg_mr and an ibv_dereg_mr.
// Rounds alternate; it prints each rate's median and the median of the
// ratios. TestKnfsdGuestRxeSiw reports it.
func TestGuestExposureRate(t *testing.T) {
	p, dev, addr := guestDevice(t)
	if wantWindows(dev) {
		p.SetMemoryWindows(true) // opt-in (EnvWindows)
		if !p.MemoryWindows() {
			t.Fatalf("%s: the device has no memory windows", dev)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	type mode struct {
		name string
		pool *mrcache.Pool
		qp   verbs.QueuePair
	}
	var modes []*mode
	windows := p.MemoryWindows()
	for _, w := range []bool{true, false} {
		if w && !windows {
			continue
		}
		p.SetMemoryWindows(w)
		pd := p.NewProtectionDomain()
		m := &mode{name: "per-call registration", pool: mrcache.New(pd, 8<<20)}
		defer m.pool.Close()
		if w {
			m.name = "memory windows"
			m.qp, _ = connectPair(ctx, t, p, addr, pd)
		}
		modes = append(modes, m)
	}
	p.SetMemoryWindows(windows)
	const n, rounds = 300, 5
	rates := make([][]float64, len(modes))
	for range rounds {
		for i, m := range modes {
			buf, err := m.pool.Get(4096)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			for range n {
				reg, err := mrcachetest.Expose(buf, 0, 4096, verbs.AccessRemoteWrite|verbs.AccessLocalWrite)
				if err != nil {
					t.Fatal(err)
				}
				if m.qp != nil {
					if err := m.qp.(verbs.WindowBinder).BindWindows(ctx, reg.MR()); err != nil {
						t.Fatal(err)
					}
				}
				if err := mrcachetest.Invalidate(ctx, reg); err != nil {
					t.Fatal(err)
				}
			}
			rates[i] = append(rates[i], n/time.Since(start).Seconds())
			m.pool.Put(buf)
		}
	}
	out := fmt.Sprintf("EXPOSE %s", dev)
	for i, m := range modes {
		out += fmt.Sprintf(" %s: %.0f exposures/s of 4 KiB;", m.name, median(rates[i]))
	}
	if len(modes) == 2 {
		if ibverbs.WindowBinds(modes[0].qp.PD()) < n*rounds {
			t.Fatalf("%d window binds for %d exposures", ibverbs.WindowBinds(modes[0].qp.PD()), n*rounds)
		}
		ratios := make([]float64, rounds)
		for r := range ratios {
			ratios[r] = rates[0][r] / rates[1][r]
		}
		out += fmt.Sprintf(" windows/per-call median ratio %.2f (%d rounds of %d)", median(ratios), rounds, n)
	}
	fmt.Println(out)
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// connectPair connects two queue pairs of p on addr, the active one in
// pd, and returns both; they close when the test ends.
func connectPair(ctx context.Context, t *testing.T, p *ibverbs.Provider, addr string, pd *verbs.ProtectionDomain) (active, passive verbs.QueuePair) {
	t.Helper()
	ln, err := p.Listen(addr, &verbs.ConnParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan verbs.QueuePair, 1)
	go func() {
		qp, err := ln.Accept(ctx)
		if err != nil {
			qp = nil
		}
		accepted <- qp
	}()
	c, err := p.Dial(ctx, ln.Addr().String(), &verbs.ConnParams{PD: pd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { s.Close() })
	return c, s
}

// TestGuestWindowInvalidated checks a memory window's life on
// RDMAFS_CONFORMANCE_DEV where the device has windows: a slab buffer
// exposed by a window bound on the queue pair is written by the peer with
// RDMA Write; after Invalidate (a local invalidation work request) the
// peer's Write with the same key is refused and the buffer stays as it
// was (RFC 8166 s8.1: the responder's access ends with the exposure). On a
// device without windows it checks that the provider falls back.
func TestGuestWindowInvalidated(t *testing.T) {
	p, dev, addr := guestDevice(t)
	p.SetMemoryWindows(true)
	if !p.MemoryWindows() {
		if wantWindows(dev) {
			t.Fatalf("%s: the provider does not use memory windows", dev)
		}
		fmt.Printf("WINDOWS %s: none, per-call registration\n", dev)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pd := p.NewProtectionDomain()
	pool := mrcache.New(pd, 8<<20)
	defer pool.Close()
	c, s := connectPair(ctx, t, p, addr, pd)
	spool := mrcache.New(s.PD(), 8<<20)
	defer spool.Close()
	lentBuf, err := pool.Get(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Put(lentBuf)
	buf := lentBuf.Bytes()
	clear(buf)
	lentSrc, err := spool.Get(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer spool.Put(lentSrc)
	src := lentSrc.Bytes()
	for i := range src {
		src[i] = 0xa5
	}
	sge, err := lentSrc.SGE(0, 64)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := mrcachetest.Expose(lentBuf, 100, 1000, verbs.AccessRemoteWrite|verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.(verbs.WindowBinder).BindWindows(ctx, reg.MR()); err != nil {
		t.Fatal(err)
	}
	write := func(wrid uint64) verbs.Completion {
		t.Helper()
		if err := s.PostSend(verbs.SendWR{WRID: wrid, Opcode: verbs.OpRDMAWrite, SGL: []verbs.SGE{sge},
			RemoteSTag: reg.STag, RemoteOffset: reg.Offset}); err != nil {
			t.Fatal(err)
		}
		var wc [1]verbs.Completion
		if _, err := s.SendCQ().Poll(ctx, wc[:]); err != nil {
			t.Fatal(err)
		}
		return wc[0]
	}
	if wc := write(1); wc.Status != verbs.StatusSuccess {
		t.Fatalf("RDMA Write into the bound window: %v", wc.Status)
	}
	if buf[100] != 0xa5 || buf[163] != 0xa5 || buf[164] != 0 || buf[99] != 0 {
		t.Fatalf("window bytes after the peer's Write: %x %x %x %x", buf[99], buf[100], buf[163], buf[164])
	}
	key := reg.STag
	if err := mrcachetest.Invalidate(ctx, reg); err != nil {
		t.Fatal(err)
	}
	clear(buf)
	reg.STag = key
	if wc := write(2); wc.Status != verbs.StatusRemoteAccessErr {
		t.Fatalf("RDMA Write with the invalidated window's key %#x: %v, want %v", key, wc.Status, verbs.StatusRemoteAccessErr)
	}
	for i, b := range buf {
		if b != 0 {
			t.Fatalf("byte %d written through an invalidated window", i)
		}
	}
	fmt.Printf("WINDOWS %s: bound by a work request (%d binds), written by the peer, refused after the local invalidation\n", dev, ibverbs.WindowBinds(pd))
}
