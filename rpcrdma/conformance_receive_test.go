package rpcrdma

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// Conformance tests of the requester's receive path (RFC 8166 s3.3.1,
// s4.5, s4.6; v2 draft s3-s5; xcharext s4): messages are fed to
// conn.receive on a connection whose queue pair (confQP) records what the
// requester sends back. CONFORMANCE.md maps the checklist ids to them.

// confWordsMsg encodes 32-bit words as a message.
func confWordsMsg(words ...uint32) []byte {
	var e xdr.Encoder
	for _, w := range words {
		e.Uint32(w)
	}
	return e.Bytes()
}

// confMsg encodes h followed by an RPC reply for h.XID when withReply.
func confMsg(h Header, withReply bool) []byte {
	var e xdr.Encoder
	h.Append(&e)
	if withReply {
		oncrpc.AppendAcceptedReply(&e, h.XID, oncrpc.Success, 0, 0)
		e.Uint32(0)
	}
	return e.Bytes()
}

// confPend registers a call waiting for its reply, as conn.send does
// after taking a credit (counted unless credited is set).
func confPend(c *conn, xid uint32, credited bool) *req {
	r := &req{tr: c.t, xid: xid, call: &oncrpc.Call{XID: xid}, done: make(chan struct{})}
	c.mu.Lock()
	c.pending[xid] = r
	if !credited {
		c.inflight++
	}
	c.mu.Unlock()
	return r
}

func confDone(r *req) bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// confDelivered checks that r got a usable reply, and releases it.
func confDelivered(t *testing.T, r *req) *oncrpc.Reply {
	t.Helper()
	if !confDone(r) || r.err != nil || r.reply == nil {
		t.Fatalf("xid %#x: done %v, err %v, reply %v", r.xid, confDone(r), r.err, r.reply != nil)
	}
	rep := r.reply
	t.Cleanup(rep.Release)
	return rep
}

// confNext waits for the next Send the connection posts.
func confNext(t *testing.T, qp *confQP) []byte {
	t.Helper()
	select {
	case <-qp.sent:
	case <-time.After(time.Minute): // only keeps a broken test from hanging
		t.Fatal("nothing was sent")
	}
	s := qp.posted()
	return s[len(s)-1]
}

// TestConformanceReceiveDrops: messages the requester cannot use are
// dropped silently, whatever their XID, on version 1 and version 2
// connections: anything shorter than a header, an unknown procedure,
// RDMA_MSGP and RDMA_DONE, an RDMA_ERROR with an unknown code or cut
// short, and an RDMA_ERROR for no call (RFC 8166 s4.5, s4.6; bis-04
// s5.1.4). The call they name stays pending, no credit changes, and
// nothing is sent back. A 20-byte ERR_CHUNK then ends the call. (A
// well-formed reply for no call is dropped too, but its credit word is
// applied today: issue 9 item 13.)
func TestConformanceReceiveDrops(t *testing.T) {
	for _, st := range []negState{negV1, negV2} {
		vers := uint32(Version1)
		if st == negV2 {
			vers = Version2
		}
		c, qp := confConn(t, Config{}, st, 1024)
		const x = 0x51
		r := confPend(c, x, false)
		drops := []struct {
			name string
			msg  []byte
		}{
			{"16 bytes", confWordsMsg(x, vers, 8, ProcMsg)},
			{"unknown procedure 7", confWordsMsg(x, vers, 8, 7, 0, 0, 0)},
			{"RDMA_MSGP", confWordsMsg(x, vers, 8, ProcMsgP, 0, 0, 0, 0, 0)},
			{"RDMA_DONE", confWordsMsg(x, vers, 8, ProcDone)},
			{"unknown error code", confWordsMsg(x, vers, 8, ProcError, 9)},
			{"ERR_VERS cut to 24 bytes", confWordsMsg(x, vers, 8, ProcError, ErrVers, 1)},
			{"ERR_CHUNK for no call", confWordsMsg(x+1, vers, 8, ProcError, ErrChunk)},
		}
		for _, d := range drops {
			before := c.t.stats.dropped.Load()
			if c.receive(0, d.msg, 0, false) {
				t.Fatalf("v%d %s: receive buffer lent", vers, d.name)
			}
			if got := c.t.stats.dropped.Load(); got != before+1 {
				t.Errorf("v%d %s: not counted as dropped", vers, d.name)
			}
			if confDone(r) {
				t.Fatalf("v%d %s: ended the pending call: %v", vers, d.name, r.err)
			}
		}
		if c.granted != 1 {
			t.Fatalf("v%d: dropped messages changed the grant to %d", vers, c.granted)
		}
		if s := qp.posted(); len(s) != 0 {
			t.Fatalf("v%d: the requester answered dropped messages: %x", vers, s)
		}
		// RFC 8166 s4.5 (A-V1-2): a 20-byte ERR_CHUNK is a valid message.
		c.receive(0, confWordsMsg(x, vers, 8, ProcError, ErrChunk), 0, false)
		if !confDone(r) || !errors.Is(r.err, ErrChunkRejected) {
			t.Fatalf("v%d: 20-byte ERR_CHUNK: done %v, err %v", vers, confDone(r), r.err)
		}
	}
}

// TestConformanceCreditWindow: one credit on a new connection; the grant
// comes only from the credit word of non-error replies, 0 reads as 1,
// and it is capped at the credits requested; a lower grant does not
// cancel calls in flight (RFC 8166 s3.3.1, s3.3.3; v2 draft s5).
func TestConformanceCreditWindow(t *testing.T) {
	c, _ := confConn(t, Config{Credits: 32}, negV1, 1024)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	window := func(want int) {
		t.Helper()
		c.mu.Lock()
		g, n := c.granted, c.inflight
		c.mu.Unlock()
		if g != want {
			t.Fatalf("grant %d, want %d", g, want)
		}
		for i := n; i < g; i++ {
			if err := c.acquireCredit(cancelled); err != nil {
				t.Fatalf("credit %d of %d: %v", i+1, g, err)
			}
		}
		if err := c.acquireCredit(cancelled); !errors.Is(err, context.Canceled) {
			t.Fatalf("a credit beyond the grant of %d: %v", g, err)
		}
		c.mu.Lock()
		c.inflight = n
		c.mu.Unlock()
	}
	window(1)
	if err := c.acquireCredit(context.Background()); err != nil {
		t.Fatal(err)
	}
	a := confPend(c, 0xa, true)
	// An RDMA_ERROR carries no grant.
	c.receive(0, confWordsMsg(0xa, Version1, 50, ProcError, ErrChunk), 0, false)
	if !errors.Is(a.err, ErrChunkRejected) {
		t.Fatalf("ERR_CHUNK: %v", a.err)
	}
	window(1)
	for _, tc := range []struct {
		credit uint32
		want   int
	}{{0, 1}, {100000, 32}, {8, 8}, {0, 1}} {
		r := confPend(c, 0x100+tc.credit, false)
		c.receive(0, confMsg(Header{XID: r.xid, Vers: Version1, Credit: tc.credit, Proc: ProcMsg}, true), 0, false)
		confDelivered(t, r)
		window(tc.want)
	}
	// A lower grant limits new calls only.
	r := confPend(c, 0x200, false)
	c.receive(0, confMsg(Header{XID: 0x200, Vers: Version1, Credit: 8, Proc: ProcMsg}, true), 0, false)
	confDelivered(t, r)
	f := confPend(c, 0xf, false)
	g := confPend(c, 0x9, false)
	c.receive(0, confMsg(Header{XID: 0xf, Vers: Version1, Credit: 1, Proc: ProcMsg}, true), 0, false)
	confDelivered(t, f)
	if confDone(g) {
		t.Fatal("a lower grant ended a call in flight")
	}
	window(1) // g holds the one credit: no new call
	c.receive(0, confMsg(Header{XID: 0x9, Vers: Version1, Credit: 2, Proc: ProcMsg}, true), 0, false)
	confDelivered(t, g)
	window(2)
}

// TestConformanceDuplicateReply: once its reply is used, an XID is
// retired; a second reply for it, and a reply for an XID never used, are
// dropped without effect: their credit words are not taken (RFC 8166
// s2.2.2, s4.5).
func TestConformanceDuplicateReply(t *testing.T) {
	c, qp := confConn(t, Config{}, negV1, 1024)
	r := confPend(c, 0x77, false)
	c.receive(0, confMsg(Header{XID: 0x77, Vers: Version1, Credit: 4, Proc: ProcMsg}, true), 0, false)
	confDelivered(t, r)
	for _, x := range []uint32{0x77, 0x78} {
		before := c.t.stats.dropped.Load()
		c.receive(0, confMsg(Header{XID: x, Vers: Version1, Credit: 9, Proc: ProcMsg}, true), 0, false)
		c.mu.Lock()
		g, n := c.granted, c.inflight
		c.mu.Unlock()
		if c.t.stats.dropped.Load() != before+1 || n != 0 || g != 4 || len(qp.posted()) != 0 {
			t.Fatalf("reply for xid %#x: dropped %d→%d, in flight %d, grant %d (want 4), sent %d", x, before, c.t.stats.dropped.Load(), n, g, len(qp.posted()))
		}
	}
}

// TestConformanceUnusedWriteChunk: a Write chunk returned unused (same
// segments, lengths zero) is a valid reply with nothing placed (RFC 8166
// s4.3.2); it is reported as a placement of 0 bytes, so the upper layer
// can refuse a result the responder returned inline although a usable
// Write chunk was offered (s6.1).
func TestConformanceUnusedWriteChunk(t *testing.T) {
	c, _ := confConn(t, Config{}, negV1, 1024)
	r := confPend(c, 0x88, false)
	r.call.ReplyBulk = oncrpc.Plain(make([]byte, 1001))
	r.writeOff = []Segment{{Handle: 0x4401, Length: 1001, Offset: 0}}
	c.receive(0, confMsg(Header{XID: 0x88, Vers: Version1, Credit: 4, Proc: ProcMsg,
		Writes: [][]Segment{{{Handle: 0x4401, Length: 0, Offset: 0}}}}, true), 0, false)
	if rep := confDelivered(t, r); !rep.BulkPlaced || rep.BulkLen != 0 {
		t.Fatalf("unused chunk: placed %v, %d bytes; want placed, 0 bytes", rep.BulkPlaced, rep.BulkLen)
	}
}

// TestConformanceWriteListOmitted: a reply that leaves out the Write list
// the call offered breaks RFC 8166 s4.3.2 (a Write chunk offered is
// returned, used or unused); whatever it carries inline, it counts as a
// reply whose chunk placed nothing (BulkPlaced, BulkLen 0), as for an
// unused chunk, so a READ whose count claims data is an I/O error in the
// upper layer (nfsclient.TestReadCountBeyondPlaced) rather than data
// taken from where the call did not ask for it (RFC 8166 s6.1: an
// eligible result returned inline despite a usable Write chunk ends the
// RPC with a permanent error).
func TestConformanceWriteListOmitted(t *testing.T) {
	c, _ := confConn(t, Config{}, negV1, 1024)
	r := confPend(c, 0x89, false)
	r.call.ReplyBulk = oncrpc.Plain(make([]byte, 1001))
	r.writeOff = []Segment{{Handle: 0x4401, Length: 1001, Offset: 0}}
	c.receive(0, confMsg(Header{XID: 0x89, Vers: Version1, Credit: 4, Proc: ProcMsg}, true), 0, false)
	if rep := confDelivered(t, r); !rep.BulkPlaced || rep.BulkLen != 0 {
		t.Fatalf("Write list omitted: placed %v, %d bytes; want placed, 0 bytes", rep.BulkPlaced, rep.BulkLen)
	}
}

// TestConformanceUpdXchXID: RDMA_OPTIONAL messages are handled by
// opttype before any XID lookup: an UPDXCH, an INITXCH or an unexpected
// RESPXCH carrying the XID of a pending call leave that call alone
// (xcharext s4.3, s4.4).
func TestConformanceUpdXchXID(t *testing.T) {
	c, qp := confConn(t, Config{}, negV2, 4096)
	const x = 0x99
	r := confPend(c, x, false)
	for _, m := range []Header{
		{OptType: OptUpdXch, OptInfo: UpdXch{Now: Uint32Val(XCharRBSize, 2048)}.Marshal()},
		{OptType: OptRespXch, OptInfo: RespXch{Done: Subset{1}}.Marshal()},
		{OptType: OptInitXch, OptInfo: InitXch{Start: []XCharVal{Uint32Val(XCharRBSize, 3072)}}.Marshal()},
	} {
		m.XID, m.Vers, m.Credit, m.Proc = x, Version2, 8, ProcOptional
		c.receive(0, confMsg(m, false), 0, false)
		if confDone(r) || c.inflight != 1 || c.granted != 1 {
			t.Fatalf("opttype %d with a pending call's XID: done %v, in flight %d, grant %d", m.OptType, confDone(r), c.inflight, c.granted)
		}
	}
	if c.neg.peer.RBSize != 3072 || c.neg.sendSize != 3072 {
		t.Fatalf("peer RBSIZ %d, send threshold %d: the UPDXCH and INITXCH were not applied", c.neg.peer.RBSize, c.neg.sendSize)
	}
	if s := qp.posted(); len(s) != 0 {
		t.Fatalf("answered: %x", s)
	}
	c.receive(0, confMsg(Header{XID: x, Vers: Version2, Credit: 8, Proc: ProcMsg}, true), 0, false)
	confDelivered(t, r)
}

// TestConformanceOptionalOnV1Ignored: on a version-1 connection an
// RDMA_OPTIONAL is dropped: the thresholds stay those of the connection's
// start and nothing is sent back (RFC 8166 s3.3.2; v2 draft s3).
func TestConformanceOptionalOnV1Ignored(t *testing.T) {
	c, qp := confConn(t, Config{}, negV1, 1024)
	init := InitXch{Start: []XCharVal{Uint32Val(XCharRBSize, 8192)}}.Marshal()
	c.receive(0, confMsg(Header{XID: 5, Vers: Version2, Credit: 8, Proc: ProcOptional, OptType: OptInitXch, OptInfo: init}, false), 0, false)
	c.receive(0, confMsg(Header{XID: 6, Vers: Version2, Credit: 8, Proc: ProcOptional, OptType: 0x7fff}, false), 0, false)
	if c.neg.sendSize != 1024 || c.neg.peerInit || c.granted != 1 {
		t.Fatalf("send threshold %d, peer announced %v, grant %d", c.neg.sendSize, c.neg.peerInit, c.granted)
	}
	if s := qp.posted(); len(s) != 0 {
		t.Fatalf("answered an RDMA_OPTIONAL on version 1: %x", s)
	}
}

// TestConformanceRespXch: the requester answers a peer's REQXCH with a
// RESPXCH carrying its XID, whose done, rej and pend subsets are disjoint
// and cover every entry (xcharext s4.2, s4.3).
func TestConformanceRespXch(t *testing.T) {
	c, qp := confConn(t, Config{}, negV2, 4096)
	want := []XCharVal{
		Uint32Val(XCharRBSize, 4096),       // what we have: done
		Uint32Val(XCharRBSize, 2048),       // a duplicate: rejected
		Uint32Val(0x80000000, 1),           // unknown: rejected
		Uint32Val(XCharBRS, BRSGenl),       // not supported: rejected
		BoolVal(XCharReqRemInv, true),      // not accepted here: rejected
		Uint32Val(XCharRBSize+1000, 12345), // unknown: rejected
	}
	const q = 0xabc
	// The answer is one-way: it goes out while a credit stays free for
	// calls (RFC 8166 s3.3.1: every message we send takes a credit).
	c.granted = 2
	c.receive(0, confMsg(Header{XID: q, Vers: Version2, Credit: 8, Proc: ProcOptional, OptType: OptReqXch, OptInfo: ReqXch{Want: want}.Marshal()}, false), 0, false)
	var h Header
	n, err := h.Decode(confNext(t, qp), true)
	if err != nil || h.XID != q || h.Vers != Version2 || h.Proc != ProcOptional || h.OptType != OptRespXch {
		t.Fatalf("answer %+v (%d bytes), %v: want RESPXCH with XID %#x", h, n, err, q)
	}
	m, err := ParseRespXch(h.OptInfo)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		k := 0
		for _, s := range []Subset{m.Done, m.Rej, m.Pend} {
			if s.Has(i) {
				k++
			}
		}
		if k != 1 {
			t.Errorf("entry %d in %d of done/rej/pend", i, k)
		}
	}
	if !m.Done.Has(0) || m.Done.Has(1) {
		t.Fatalf("done %v: want entry 0 only", m.Done)
	}
}

// TestConformanceInitXchContents: the requester's INITXCH lists every
// characteristic it knows (RBSIZ = its Receive size, REQREMINV, BRS =
// INLINE), flags them unchanging, carries no payload, and fits a 1024-byte
// Receive (xcharext s3.3, s4, s4.1).
func TestConformanceInitXchContents(t *testing.T) {
	c, qp := confConn(t, Config{XChars: true, InlineRecv: 8192}, negV2, 4096)
	c.mu.Lock()
	c.granted = 2 // a one-way message goes out only while a credit stays free for calls
	sent := c.sendInitXchLocked()
	c.mu.Unlock()
	if !sent {
		t.Fatal("INITXCH not sent with a free credit")
	}
	msg := confNext(t, qp)
	var h Header
	n, err := h.Decode(msg, true)
	if err != nil || n != len(msg) || h.Proc != ProcOptional || h.OptType != OptInitXch || h.Vers != Version2 {
		t.Fatalf("INITXCH Send of %d bytes: header %d bytes %+v, %v", len(msg), n, h, err)
	}
	if len(msg) > 1024 {
		t.Fatalf("INITXCH of %d bytes", len(msg))
	}
	m, err := ParseInitXch(h.OptInfo)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint32]bool{}
	for _, v := range m.Start {
		seen[v.Which] = true
	}
	ch := DefaultChars
	if err := ch.applySpec(m.Start); err != nil {
		t.Fatal(err)
	}
	if !seen[XCharRBSize] || !seen[XCharReqRemInv] || !seen[XCharBRS] || ch != (Chars{RBSize: 8192, ReqRemInv: false, BRS: BRSInline}) {
		t.Fatalf("INITXCH announces %+v (ids %v)", ch, seen)
	}
	for i := range m.Start {
		if !m.NoChg.Has(i) {
			t.Errorf("entry %d not flagged unchanging", i)
		}
	}
}

// TestConformanceXCharOrder: an xcharspec's order does not matter
// (xcharext s2.1).
func TestConformanceXCharOrder(t *testing.T) {
	spec := []XCharVal{Uint32Val(XCharRBSize, 8192), Uint32Val(XCharBRS, BRSGenl), BoolVal(XCharReqRemInv, true)}
	a, b := DefaultChars, DefaultChars
	if err := a.applySpec(spec); err != nil {
		t.Fatal(err)
	}
	if err := b.applySpec([]XCharVal{spec[2], spec[1], spec[0]}); err != nil {
		t.Fatal(err)
	}
	if a != b || a != (Chars{RBSize: 8192, ReqRemInv: true, BRS: BRSGenl}) {
		t.Fatalf("in order %+v, reversed %+v", a, b)
	}
}

// confCBHandler answers every backward call with an accepted, successful
// reply carrying the call's XID and one result word.
type confCBHandler struct{}

func (confCBHandler) HandleCall(msg []byte) []byte {
	h, _, err := oncrpc.ParseCall(msg)
	if err != nil {
		return nil
	}
	var e xdr.Encoder
	oncrpc.AppendAcceptedReply(&e, h.XID, oncrpc.Success, 0, 0)
	e.Uint32(42)
	return e.Bytes()
}

// TestConformanceBackwardReply: a backward call (RDMA_MSG, no chunks, an
// RPC CALL) is told from a forward reply by its msg_type even when a
// forward call with the same XID is pending; its reply is an RDMA_MSG
// with the call's version and XID, three empty chunk lists, the backward
// grant (never 0) as its credit, and an RPC REPLY with the same XID, on
// version-1 and version-2 connections (bis-04 s7.1.4, s7.2.1, s7.3.5,
// s7.4; v2 draft s4.2).
func TestConformanceBackwardReply(t *testing.T) {
	for _, st := range []negState{negV1, negV2} {
		vers := uint32(Version1)
		if st == negV2 {
			vers = Version2
		}
		c, qp := confConn(t, Config{BackchannelSlots: 3}, st, 1024)
		c.t.SetCallHandler(confCBHandler{})
		const x = 0x5150
		fwd := confPend(c, x, false)
		var e xdr.Encoder
		(&Header{XID: x, Vers: vers, Credit: 2, Proc: ProcMsg}).Append(&e)
		oncrpc.AppendCallHeader(&e, x, 0x40000000, 1, 1, oncrpc.AuthNone)
		c.receive(0, e.Bytes(), 0, false)
		msg := confNext(t, qp)
		var h Header
		n, err := h.Decode(msg, true)
		if err != nil || n != MinHeaderLen {
			t.Fatalf("v%d backward reply header: %d bytes, %v", vers, n, err)
		}
		if h.XID != x || h.Vers != vers || h.Proc != ProcMsg || h.Credit != 3 || len(h.Reads)+len(h.Writes) != 0 || h.Reply != nil {
			t.Fatalf("v%d backward reply header %+v", vers, h)
		}
		xid, res, err := oncrpc.ParseReply(msg[n:])
		if err != nil || xid != x || len(res) != 4 || res[3] != 42 {
			t.Fatalf("v%d backward reply payload: xid %#x, %x, %v", vers, xid, res, err)
		}
		if confDone(fwd) || c.inflight != 1 {
			t.Fatalf("v%d: the backward call touched the forward call with its XID", vers)
		}
		c.receive(0, confMsg(Header{XID: x, Vers: vers, Credit: 2, Proc: ProcMsg}, true), 0, false)
		confDelivered(t, fwd)
	}
}

// TestConformanceOurErrorEchoes: the RDMA_ERRORs the requester builds
// (for RDMA_OPTIONALs it cannot use: v2 draft s3.1, A-V2-6) echo the
// failing message's XID and version, with procedure 4 and the error code,
// and nothing after them (RFC 8166 s4.5).
func TestConformanceOurErrorEchoes(t *testing.T) {
	c, qp := confConn(t, Config{}, negV2, 4096)
	// Each answer is one-way and holds a credit until a reply to a later
	// call comes (RFC 8166 s3.3.1): two answers need two credits beyond
	// the one kept for calls.
	c.granted = 3
	for _, tc := range []struct {
		xid, opt uint32
		info     []byte
		code     uint32
	}{
		{0x71, 0x7fff, []byte{1, 2, 3, 4}, ErrOption},
		{0x72, OptInitXch, []byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0xff, 0xff}, ErrChunk},
	} {
		c.receive(0, confMsg(Header{XID: tc.xid, Vers: Version2, Credit: 8, Proc: ProcOptional, OptType: tc.opt, OptInfo: tc.info}, false), 0, false)
		msg := confNext(t, qp)
		if w := confWords(msg, 4); len(msg) != 20 || w[0] != tc.xid || w[1] != Version2 || w[3] != ProcError || binary.BigEndian.Uint32(msg[16:]) != tc.code {
			t.Fatalf("answer to opttype %#x: %x, want XID %#x, version 2, RDMA_ERROR %d", tc.opt, msg, tc.xid, tc.code)
		}
	}
}

// TestConformanceBackwardExcess: more backward calls than the backward
// grant neither take nor lose forward credits, and a forward call in
// flight still gets its reply (bis-04 s7.2.1).
func TestConformanceBackwardExcess(t *testing.T) {
	c, _ := confConn(t, Config{BackchannelSlots: 2}, negV1, 1024)
	c.t.SetCallHandler(confCBHandler{})
	fwd := confPend(c, 0x600, false)
	for i := range uint32(3) {
		var e xdr.Encoder
		(&Header{XID: 0x700 + i, Vers: Version1, Credit: 2, Proc: ProcMsg}).Append(&e)
		oncrpc.AppendCallHeader(&e, 0x700+i, 0x40000000, 1, 1, oncrpc.AuthNone)
		c.receive(0, e.Bytes(), 0, false)
	}
	c.mu.Lock()
	g, n := c.granted, c.inflight
	c.mu.Unlock()
	if g != 1 || n != 1 || confDone(fwd) {
		t.Fatalf("after 3 backward calls: grant %d, in flight %d, forward call done %v", g, n, confDone(fwd))
	}
	c.receive(0, confMsg(Header{XID: 0x600, Vers: Version1, Credit: 4, Proc: ProcMsg}, true), 0, false)
	confDelivered(t, fwd)
}
