package rpcrdma

import (
	"bytes"
	"testing"

	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// staleMarker fills the slab before the calls of TestHostileHardwareStaleBytes:
// any of it in a reply is a byte the peer did not write for the call.
var staleMarker = []byte("STALE!!!")

// fillSlab writes staleMarker over every free byte of the pool's budget.
func fillSlab(t *testing.T, pool *mrcache.Pool) {
	t.Helper()
	if err := pool.Poison(staleMarker); err != nil {
		t.Fatal(err)
	}
}

// TestHostileHardwareStaleBytes: with a provider that cannot count the
// bytes the peer placed (rdma-core: a domain with a registration hook, as
// here), a reply's claimed lengths are taken on trust, so a responder
// that claims more than it wrote must get zeros, never what the buffer
// held: every slab buffer is filled with a marker first, and no marker
// byte may show in what a call delivers. Covered: a Write chunk exposed
// where it is (the upper layer's slab buffer), one bounced through
// transport buffers (a heap destination), and a Reply chunk.
func TestHostileHardwareStaleBytes(t *testing.T) {
	fp := newFakePeer(t, peerOpts{Credits: 4})
	hook := &failingHook{stags: make(map[*verbs.MemoryRegion]uint32)}
	tr := fp.transport(Config{Version: Version1, MemoryBytes: 8 << 20,
		Provider: hookedProvider{fp.provider(), iwarp.NewProtectionDomainWithHook(hook)}})
	pc := warmUp(t, fp, tr)
	pool := tr.Buffers()
	if pool.CountsPlacement() {
		t.Fatal("a domain with a registration hook claims to count placed bytes")
	}
	written := pattern(100)

	writeChunk := func(t *testing.T, xid uint32, dest oncrpc.View) {
		ch := goRoundTrip(fp.ctx, tr, &oncrpc.Call{XID: xid, Head: mkCall(xid, procSource, be32(exposedDest)),
			ReplyBulk: dest, MaxReplySize: 128})
		m := pc.recvCall()
		if len(m.Hdr.Writes) != 1 || len(m.Hdr.Writes[0]) != 1 {
			t.Fatalf("Write chunks %v", m.Hdr.Writes)
		}
		w := m.Hdr.Writes[0][0]
		if err := pc.write(w.Handle, w.Offset, written); err != nil {
			t.Fatal(err)
		}
		h := pc.replyHeader(m)
		h.Writes[0][0].Length = w.Length // claims the whole chunk
		pc.replyWith(m, h, be32(exposedDest))
		r := fp.wait(ch)
		if r.err != nil {
			t.Fatal(r.err)
		}
		defer r.rep.Release()
		got := dest.Bytes()[:r.rep.BulkLen]
		if !bytes.HasPrefix(got, written) {
			t.Fatalf("the %d bytes written are not at the start of the %d delivered", len(written), len(got))
		}
		if i := bytes.Index(got, staleMarker[:4]); i >= 0 {
			t.Fatalf("100 bytes written, %d claimed: stale bytes delivered at %d: %q", w.Length, i, got[i:i+8])
		}
	}

	t.Run("write-registered", func(t *testing.T) {
		fillSlab(t, pool)
		lent, err := pool.Get(exposedDest)
		if err != nil {
			t.Fatal(err)
		}
		defer lent.Release()
		writeChunk(t, 80, oncrpc.Lent(lent))
	})
	t.Run("write-bounce", func(t *testing.T) {
		fillSlab(t, pool)
		writeChunk(t, 81, oncrpc.Plain(make([]byte, exposedDest)))
	})
	t.Run("reply-chunk", func(t *testing.T) {
		fillSlab(t, pool)
		const xid = 82
		ch := goRoundTrip(fp.ctx, tr, &oncrpc.Call{XID: xid, Head: mkCall(xid, procEcho, be32(0)), MaxReplySize: 16384})
		m := pc.recvCall()
		if len(m.Hdr.Reply) != 1 {
			t.Fatalf("Reply chunk %v", m.Hdr.Reply)
		}
		seg := m.Hdr.Reply[0]
		msg := append(rpcReply(m.RPCXID), be32(0)...)
		if err := pc.write(seg.Handle, seg.Offset, msg); err != nil {
			t.Fatal(err)
		}
		m.release()
		// Claims the whole chunk, having written len(msg) bytes.
		pc.send(Header{XID: m.Hdr.XID, Vers: m.Hdr.Vers, Credit: pc.credits, Proc: ProcNoMsg, Reply: []Segment{seg}})
		r := fp.wait(ch)
		if r.err != nil {
			// Refusing the over-claim outright is as good.
			return
		}
		defer r.rep.Release()
		if i := bytes.Index(r.rep.Msg, staleMarker[:4]); i >= 0 {
			t.Fatalf("%d bytes written, %d claimed: stale bytes delivered at %d of the reply", len(msg), seg.Length, i)
		}
	})
}
