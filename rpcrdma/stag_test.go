package rpcrdma

import (
	"bytes"
	"errors"
	"testing"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// Accesses a hostile responder may try with the STags a call offered, or
// with STags it invents, and Send With Invalidate it was not allowed.

// TestHostileOutsideAdvertised: each chunk grants exactly its bytes and
// its direction (RFC 8166 s8.1, s8.1.2): a Write one byte past a Write
// chunk, a Write longer than it, an RDMA Read of it, a Write to a Read
// chunk, a Read past a Read chunk, and a Write to an STag never offered
// are refused by the requester's provider; the call fails with a
// connection error (to be retransmitted) and no byte outside what was
// advertised changes.
func TestHostileOutsideAdvertised(t *testing.T) {
	attacks := []struct {
		name string
		do   func(pc *peerConn, m *peerMsg)
	}{
		{"write one byte past the Write chunk", func(pc *peerConn, m *peerMsg) {
			w := m.Hdr.Writes[0][0]
			pc.writeRefused(w.Handle, w.Offset+uint64(w.Length), []byte{1}, "Write past the chunk")
		}},
		{"write longer than the Write chunk", func(pc *peerConn, m *peerMsg) {
			w := m.Hdr.Writes[0][0]
			pc.writeRefused(w.Handle, w.Offset, make([]byte, w.Length+1), "Write longer than the chunk")
		}},
		{"read the Write chunk", func(pc *peerConn, m *peerMsg) {
			w := m.Hdr.Writes[0][0]
			pc.readRefused(w.Handle, w.Offset, 1, "Read of a Write chunk")
		}},
		{"write the Read chunk", func(pc *peerConn, m *peerMsg) {
			r := m.Hdr.Reads[0]
			pc.writeRefused(r.Handle, r.Offset, []byte{1}, "Write to a Read chunk")
		}},
		{"read past the Read chunk", func(pc *peerConn, m *peerMsg) {
			r := m.Hdr.Reads[0]
			pc.readRefused(r.Handle, r.Offset, int(r.Length)+1, "Read past the chunk")
		}},
		{"write an STag never offered", func(pc *peerConn, m *peerMsg) {
			pc.writeRefused(0x00abcd01, 0, []byte{1}, "Write to an unknown STag")
		}},
		{"read an STag never offered", func(pc *peerConn, m *peerMsg) {
			pc.readRefused(0x00abcd01, 0, 1, "Read of an unknown STag")
		}},
	}
	fp := newFakePeer(t, peerOpts{Credits: 4})
	tr := fp.transport(Config{Version: Version1})
	ec := newExposedCall(t, tr, 70)
	for _, a := range attacks {
		waitConnDead(t, fp, tr)
		ch := goRoundTrip(fp.ctx, tr, ec.call)
		pc := fp.accept()
		m := pc.recvCall()
		a.do(pc, m)
		if r := fp.wait(ch); !errors.Is(r.err, oncrpc.ErrConnection) {
			t.Fatalf("%s: call returned %v, want a connection error", a.name, r.err)
		}
		ec.checkGuard(t)
		for i, b := range ec.dest[:exposedDest] {
			if b != guardPattern {
				t.Fatalf("%s: destination byte %d changed", a.name, i)
			}
		}
		if !bytes.Equal(ec.bulk, pattern(exposedBulk)) {
			t.Fatalf("%s: the call's argument changed", a.name)
		}
		requireFenced(t, tr, m.segments(), true)
	}
	// After all that, a retransmission on a new connection works.
	waitConnDead(t, fp, tr)
	ch := goRoundTrip(fp.ctx, tr, ec.call)
	pc := fp.accept()
	m := pc.recvCall()
	pc.reply(m, be32(0))
	if r := fp.wait(ch); r.err != nil {
		t.Fatal(r.err)
	} else {
		r.rep.Release()
	}
}

// TestHostileSendWithInvalidate: a reply by Send With Invalidate when we
// did not allow it (RFC 8797 s5.1, xcharext s3.2) is counted as a
// violation and still used (every STag of the call is invalidated
// locally anyway); one naming an STag that the reply's call did not
// offer, for example another call's, closes the connection, and both
// calls fail to be retransmitted; one naming an STag that is not live is
// refused by the provider.
func TestHostileSendWithInvalidate(t *testing.T) {
	t.Run("own STag, not allowed", func(t *testing.T) {
		fp := newFakePeer(t, peerOpts{Credits: 4})
		tr := fp.transport(Config{Version: Version1})
		pc := warmUp(t, fp, tr)
		ec := newExposedCall(t, tr, 80)
		ch := goRoundTrip(fp.ctx, tr, ec.call)
		m := pc.recvCall()
		m.release()
		b := encodeMsg(pc.replyHeader(m), rpcReply(m.RPCXID), be32(0))
		if err := pc.sendRawInv(b, true, m.Hdr.Writes[0][0].Handle); err != nil {
			t.Fatal(err)
		}
		r := fp.wait(ch)
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.rep.Release()
		if st := tr.Stats(); st.InvalidateViolations != 1 || st.Connects != 1 {
			t.Fatalf("violations %d, connections %d; want 1, 1", st.InvalidateViolations, st.Connects)
		}
		requireFenced(t, tr, m.segments(), true)
	})
	t.Run("own STag, allowed", func(t *testing.T) {
		fp := newFakePeer(t, peerOpts{Credits: 4})
		tr := fp.transport(Config{Version: Version1, AcceptInvalidate: true})
		pc := warmUp(t, fp, tr)
		ec := newExposedCall(t, tr, 81)
		ch := goRoundTrip(fp.ctx, tr, ec.call)
		m := pc.recvCall()
		m.release()
		b := encodeMsg(pc.replyHeader(m), rpcReply(m.RPCXID), be32(0))
		if err := pc.sendRawInv(b, true, m.Hdr.Reply[0].Handle); err != nil {
			t.Fatal(err)
		}
		r := fp.wait(ch)
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.rep.Release()
		if st := tr.Stats(); st.InvalidateViolations != 0 {
			t.Fatalf("%d violations for an allowed remote invalidation", st.InvalidateViolations)
		}
		requireFenced(t, tr, m.segments(), true)
	})
	t.Run("another call's STag", func(t *testing.T) {
		fp := newFakePeer(t, peerOpts{Credits: 4})
		tr := fp.transport(Config{Version: Version1, AcceptInvalidate: true})
		pc := warmUp(t, fp, tr)
		a, b := newExposedCall(t, tr, 82), newExposedCall(t, tr, 83)
		cha := goRoundTrip(fp.ctx, tr, a.call)
		ma := pc.recvCall()
		chb := goRoundTrip(fp.ctx, tr, b.call)
		mb := pc.recvCall()
		ma.release()
		msg := encodeMsg(pc.replyHeader(ma), rpcReply(ma.RPCXID), be32(0))
		if err := pc.sendRawInv(msg, true, mb.Hdr.Writes[0][0].Handle); err != nil {
			t.Fatal(err)
		}
		for _, ch := range []<-chan result{cha, chb} {
			if r := fp.wait(ch); !errors.Is(r.err, oncrpc.ErrConnection) {
				t.Fatalf("call returned %v after a foreign remote invalidation, want a connection error", r.err)
			}
		}
		pc.waitClosed()
		if st := tr.Stats(); st.InvalidateViolations != 1 {
			t.Fatalf("%d violations", st.InvalidateViolations)
		}
		requireFenced(t, tr, append(ma.segments(), mb.segments()...), true)
	})
	t.Run("dead STag", func(t *testing.T) {
		fp := newFakePeer(t, peerOpts{Credits: 4})
		tr := fp.transport(Config{Version: Version1, AcceptInvalidate: true})
		pc := warmUp(t, fp, tr)
		ec := newExposedCall(t, tr, 84)
		ch := goRoundTrip(fp.ctx, tr, ec.call)
		m := pc.recvCall()
		m.release()
		msg := encodeMsg(pc.replyHeader(m), rpcReply(m.RPCXID), be32(0))
		_ = pc.sendRawInv(msg, true, 0x00abcd01)
		pc.requireRefused("Send With Invalidate of an unknown STag")
		if r := fp.wait(ch); !errors.Is(r.err, oncrpc.ErrConnection) {
			t.Fatalf("call returned %v, want a connection error", r.err)
		}
		requireFenced(t, tr, m.segments(), true)
	})
}

// TestHostileMessageSizes: a Send larger than our receive buffers breaks
// the connection (RFC 8166 s3.3: the peer exceeded our inline threshold;
// the provider refuses it) and the call in flight fails to be
// retransmitted; messages too short for a header are dropped (see
// TestHostileMalformedRepliesDropped).
func TestHostileMessageSizes(t *testing.T) {
	fp := newFakePeer(t, peerOpts{Credits: 4})
	tr := fp.transport(Config{Version: Version1})
	pc := warmUp(t, fp, tr)
	ch := goRoundTrip(fp.ctx, tr, &oncrpc.Call{XID: 90, Head: mkCall(90, procEcho, be32(0)), MaxReplySize: 128})
	m := pc.recvCall()
	m.release()
	big := encodeMsg(pc.replyHeader(m), rpcReply(m.RPCXID), make([]byte, 4096))
	_ = pc.sendRawInv(big, false, 0)
	te := pc.waitTerminated()
	if te == nil && pc.qp.Err() == nil {
		t.Fatal("an oversized Send did not break the connection")
	}
	if r := fp.wait(ch); !errors.Is(r.err, oncrpc.ErrConnection) {
		t.Fatalf("call returned %v, want a connection error", r.err)
	}
}
