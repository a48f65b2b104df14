package mrcache_test

import (
	"bytes"
	"context"
	"errors"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/mrcache/mrcachetest"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// wirePair connects a peer queue pair (the "server", with a domain of its
// own) to a queue pair in pd, whose memory the pool exposes, over loopback
// with the pure-Go iWARP provider.
func wirePair(t *testing.T, pd *verbs.ProtectionDomain) (peer, ours *iwarp.QP) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	ln, err := iwarp.Listen("127.0.0.1:0", &verbs.ConnParams{PD: pd})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan *iwarp.QP, 1)
	go func() {
		qp, err := ln.AcceptQP(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- qp
	}()
	peer, err = iwarp.Dial(ctx, ln.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ours = <-got
	if ours == nil {
		t.FailNow()
	}
	t.Cleanup(func() {
		peer.Close()
		ours.Close()
	})
	return peer, ours
}

// peerOp has the peer RDMA Write (or Read) n bytes at off of the region
// stag names and returns the status of its work request.
func peerOp(t *testing.T, peer *iwarp.QP, op verbs.Opcode, stag uint32, off uint64, n int, data byte) verbs.Status {
	t.Helper()
	buf := bytes.Repeat([]byte{data}, n)
	mr, err := peer.PD().RegisterMemory(buf, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	wr := verbs.SendWR{WRID: 1, Opcode: op, SGL: []verbs.SGE{{MR: mr, Length: uint32(n)}}, RemoteSTag: stag, RemoteOffset: off}
	if op == verbs.OpRDMARead {
		wr.Length = uint32(n)
	}
	if err := peer.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wc [1]verbs.Completion
	if _, err := peer.SendCQ().Poll(ctx, wc[:]); err != nil {
		t.Fatal(err)
	}
	return wc[0].Status
}

// TestExposedWindowOverWire: a peer given a 4 KiB window of a larger slab
// buffer (RFC 8166 s8.1) can RDMA Write and Read exactly that window, not
// one byte before or after it, and not at all with the window's STag once
// it was invalidated, or once the region was bound again to another range
// (same STag index, new key). Each refused access terminates the
// connection (RFC 5040 s7), and no slab byte outside the window changes.
func TestExposedWindowOverWire(t *testing.T) {
	pd := iwarp.NewProtectionDomain()
	p := mrcache.New(pd, 0)
	defer p.Close()
	if err := p.ReserveFastRegions(1); err != nil {
		t.Fatal(err)
	}
	lent, err := p.Get(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	buf := lent.Bytes()
	const lo, hi = 8192, 8192 + 4096
	const guard, fill = 0xa5, 0x3c
	for i := range buf {
		buf[i] = guard
	}
	rw := verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessLocalWrite
	expose := func(lo, hi int) *mrcache.Registration {
		t.Helper()
		r, err := mrcachetest.Expose(lent, lo, hi-lo, rw)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	checkGuards := func(lo, hi int) {
		t.Helper()
		for i, b := range buf {
			if (i < lo || i >= hi) && b != guard {
				t.Fatalf("slab byte %d outside the window [%d, %d) changed to %#x", i, lo, hi, b)
			}
		}
	}

	// The window itself: written and read back whole.
	reg := expose(lo, hi)
	peer, ours := wirePair(t, pd)
	if st := peerOp(t, peer, verbs.OpRDMAWrite, reg.STag, reg.Offset, hi-lo, fill); st != verbs.StatusSuccess {
		t.Fatalf("write of the window: %v", st)
	}
	// The Read is served after the Write was placed (RFC 5040 s5.5).
	if st := peerOp(t, peer, verbs.OpRDMARead, reg.STag, reg.Offset, hi-lo, 0); st != verbs.StatusSuccess {
		t.Fatalf("read of the window: %v", st)
	}
	stale := reg.STag
	placed, ok, err := mrcachetest.InvalidatePlaced(context.Background(), reg)
	if err != nil || !ok || placed != hi-lo {
		t.Fatalf("invalidate: %d bytes placed (%v), %v; want %d", placed, ok, err, hi-lo)
	}
	if ours.Err() != nil || peer.Err() != nil {
		t.Fatalf("errors: %v %v", ours.Err(), peer.Err())
	}
	if !bytes.Equal(buf[lo:hi], bytes.Repeat([]byte{fill}, hi-lo)) {
		t.Fatal("the window does not hold the peer's data")
	}
	checkGuards(lo, hi)

	for _, tc := range []struct {
		name  string
		op    verbs.Opcode
		stale bool   // use the invalidated window's STag
		off   uint64 // from the window's start (wrapping: -1 is the byte before)
		n     int
	}{
		{"write the byte before", verbs.OpRDMAWrite, false, 1<<64 - 1, 1},
		{"write the byte before and the first", verbs.OpRDMAWrite, false, 1<<64 - 1, 2},
		{"write the byte after", verbs.OpRDMAWrite, false, hi - lo, 1},
		{"write one byte past the end", verbs.OpRDMAWrite, false, 0, hi - lo + 1},
		{"read the byte before", verbs.OpRDMARead, false, 1<<64 - 1, 1},
		{"read the byte after", verbs.OpRDMARead, false, hi - lo, 1},
		{"read one byte past the end", verbs.OpRDMARead, false, 0, hi - lo + 1},
		{"write with the invalidated STag", verbs.OpRDMAWrite, true, 0, 1},
		{"read with the invalidated STag", verbs.OpRDMARead, true, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The window is exposed again (the same region, a new key),
			// for another range when the stale STag is tried.
			wlo, whi := lo, hi
			if tc.stale {
				wlo, whi = hi, hi+4096
			}
			reg := expose(wlo, whi)
			defer mrcachetest.Invalidate(context.Background(), reg)
			if reg.STag>>8 != stale>>8 || reg.STag == stale {
				t.Fatalf("re-exposure STag %#x, first %#x: want the same index, another key", reg.STag, stale)
			}
			stag := reg.STag
			if tc.stale {
				stag = stale
			}
			peer, ours := wirePair(t, pd)
			st := peerOp(t, peer, tc.op, stag, reg.Offset+tc.off, tc.n, ^byte(guard))
			<-ours.Done()
			<-peer.Done()
			var te *iwarp.TerminateError
			if !errors.As(ours.Err(), &te) || !te.Sent {
				t.Fatalf("our queue pair: %v, want a Terminate sent", ours.Err())
			}
			if tc.op == verbs.OpRDMARead && st != verbs.StatusRemoteAccessErr {
				t.Fatalf("refused read completed %v", st)
			}
			ours.Close() // nothing can land any more
			if err := mrcachetest.Invalidate(context.Background(), reg); err != nil {
				t.Fatal(err)
			}
			checkGuards(lo, hi) // [hi, hi+4096) still holds the guard too
		})
	}
	if pd.LiveRemoteRegions() != 0 {
		t.Fatalf("%d regions with remote access left", pd.LiveRemoteRegions())
	}
	if err := p.Put(lent); err != nil {
		t.Fatal(err)
	}
}

// TestRegistrationWorkRequests: an exposure made and ended with
// registration work requests on a queue pair (as the transport does):
// the fast-register posted, the peer reaches exactly the exposed bytes;
// once the local invalidation completed, Invalidated counts what the peer
// placed and the STag is dead. A fast-register that cannot be posted is
// abandoned, and an exposure whose invalidation failed is discarded;
// either way the counters add up and the region is not reused.
func TestRegistrationWorkRequests(t *testing.T) {
	pd := iwarp.NewProtectionDomain()
	p := mrcache.New(pd, 0)
	defer p.Close()
	lent, err := p.Get(8192)
	if err != nil {
		t.Fatal(err)
	}
	defer lent.Release()
	peer, ours := wirePair(t, pd)
	poll := func(wrid uint64) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var wc [1]verbs.Completion
		if _, err := ours.SendCQ().Poll(ctx, wc[:]); err != nil || wc[0].WRID != wrid || wc[0].Status != verbs.StatusSuccess {
			t.Fatalf("completion %+v (%v), want work request %d successful", wc[0], err, wrid)
		}
	}
	rw := verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessLocalWrite
	reg, err := lent.Expose(4096, 1000, rw)
	if err != nil {
		t.Fatal(err)
	}
	if err := ours.PostSend(reg.FastRegisterWR(1)); err != nil {
		t.Fatal(err)
	}
	reg.Posted()
	poll(1)
	if st := peerOp(t, peer, verbs.OpRDMAWrite, reg.STag, reg.Offset, 100, 7); st != verbs.StatusSuccess {
		t.Fatalf("peer write of the exposure: %v", st)
	}
	// The Read is served after the Write was placed (RFC 5040 s5.5).
	if st := peerOp(t, peer, verbs.OpRDMARead, reg.STag, reg.Offset, 100, 0); st != verbs.StatusSuccess {
		t.Fatalf("peer read of the exposure: %v", st)
	}
	if s := p.Stats(); s.Exposures != 1 || s.LiveExposures != 1 || s.FastRegions != 1 {
		t.Fatalf("exposed: %+v", s)
	}
	if err := ours.PostSend(reg.LocalInvalidateWR(2)); err != nil {
		t.Fatal(err)
	}
	poll(2)
	placed, ok := reg.Invalidated()
	if placed != 100 || !ok {
		t.Fatalf("Invalidated: %d bytes placed (%v), want 100", placed, ok)
	}
	if _, err := iwarp.TableOf(pd).Resolve(reg.STag, verbs.AccessRemoteWrite, reg.Offset, 1); !errors.Is(err, verbs.ErrInvalidSTag) {
		t.Fatalf("the STag after its invalidation: %v", err)
	}
	if s := p.Stats(); s.LiveExposures != 0 || s.FastRegions != 1 {
		t.Fatalf("invalidated: %+v", s)
	}

	// The region idle since is reused; posted on the peer's queue pair
	// (another domain) the fast-register is refused.
	reg, err = lent.Expose(0, 10, verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if err := peer.PostSend(reg.FastRegisterWR(3)); !errors.Is(err, verbs.ErrInvalidWR) {
		t.Fatalf("fast-register on another domain's queue pair: %v", err)
	}
	reg.Abandon()
	if s := p.Stats(); s.FastRegions != 0 || s.LiveExposures != 0 || s.Exposures != 1 {
		t.Fatalf("abandoned: %+v", s)
	}

	// Discard ends an exposure without a completed invalidation.
	reg, err = lent.Expose(0, 10, verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if err := ours.PostSend(reg.FastRegisterWR(4)); err != nil {
		t.Fatal(err)
	}
	reg.Posted()
	poll(4)
	if err := reg.Discard(); err != nil {
		t.Fatal(err)
	}
	if _, err := iwarp.TableOf(pd).Resolve(reg.STag, verbs.AccessRemoteRead, reg.Offset, 1); !errors.Is(err, verbs.ErrInvalidSTag) {
		t.Fatalf("the STag after Discard: %v", err)
	}
	if s := p.Stats(); s.FastRegions != 0 || s.LiveExposures != 0 || s.Exposures != 2 || s.ExposureReuses != 0 {
		t.Fatalf("discarded: %+v", s)
	}
}
