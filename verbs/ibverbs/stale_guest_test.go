//go:build guestrdma

package ibverbs_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/mrcache"
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
	done, cancel := context.WithCancel(context.Background())
	cancel()
	var got [][]byte
	for size := mrcache.ChunkSize; size >= mrcache.MinBlock; size /= 2 {
		for {
			b, err := pool.Get(size)
			if errors.Is(err, mrcache.ErrNoMemory) {
				b, err = pool.GetWait(done, size)
			}
			if err != nil {
				break
			}
			got = append(got, b)
		}
	}
	for _, b := range got {
		for i := range b {
			b[i] = staleMarker[i%len(staleMarker)]
		}
		if err := pool.Put(b); err != nil {
			t.Fatal(err)
		}
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
	recv [][]byte
	out  []byte // send and RDMA Write source
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
	sge, ok := s.pool.Locate(s.recv[i])
	if !ok {
		return fmt.Errorf("receive buffer outside the slab")
	}
	return qp.PostRecv(verbs.RecvWR{WRID: uint64(i), SGL: []verbs.SGE{sge}})
}

// post posts wr with n bytes of s.out and waits for its completion.
func (s *overclaimServer) post(ctx context.Context, wr verbs.SendWR, n int) error {
	sge, ok := s.pool.Locate(s.out[:n])
	if !ok {
		return fmt.Errorf("send buffer outside the slab")
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
		if _, err := h.Decode(s.recv[c.WRID][:c.ByteLen], false); err != nil {
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
				s.out[i] = byte(i)
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
			n := copy(s.out, rpc.Bytes())
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
		n := copy(s.out, e.Bytes())
		n += copy(s.out[n:], rpc.Bytes())
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
	dest, err := pool.Get(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Put(dest)
	rep, err := tr.RoundTrip(ctx, &oncrpc.Call{XID: 0x51, Head: head(0x51, 4096), ReplyBulk: dest, MaxReplySize: 128})
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
	fmt.Printf("STALE %s: Write chunk %d bytes claimed, Reply chunk %d bytes claimed: no stale byte delivered\n", dev, len(got), len(msg))
}

// TestGuestExposureRate measures what exposing a call's 4 KiB costs on the
// rdma-core provider over RDMAFS_CONFORMANCE_DEV: mrcache's Expose and
// Invalidate of one slab buffer, back to back, which here is an
// ibv_reg_mr and an ibv_dereg_mr (per-call registration; memory windows
// bound by a posted work request would replace both system calls). It
// prints the rate; TestKnfsdGuestRxeSiw reports it.
func TestGuestExposureRate(t *testing.T) {
	p, dev, _ := guestDevice(t)
	pool := mrcache.New(p.NewProtectionDomain(), 8<<20)
	defer pool.Close()
	buf, err := pool.Get(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Put(buf)
	ctx := context.Background()
	const n = 2000
	start := time.Now()
	for range n {
		reg, err := pool.Expose(buf, verbs.AccessRemoteWrite|verbs.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		if err := reg.Invalidate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	d := time.Since(start)
	fmt.Printf("EXPOSE %s per-call registration: %.0f exposures/s of 4 KiB (%d in %v)\n", dev, n/d.Seconds(), n, d.Round(time.Millisecond))
}
