package rpcrdma

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// Conformance tests of the requester's marshalling (RFC 8166 s3.4-s3.5,
// s4): how a call is laid out on the wire and what memory it exposes.
// They drive conn.marshal directly on a connection with no peer behind it
// (confQP), so every byte of the Send and every exposed region can be
// checked. CONFORMANCE.md maps the checklist ids to them.

// confQP is a queue pair with no peer: it records the Sends posted on it
// and completes nothing. It stands in for a connection in unit tests of
// the marshal and receive paths.
type confQP struct {
	pd *verbs.ProtectionDomain

	mu    sync.Mutex
	sends [][]byte      // the bytes of each Send, copied at post time
	sent  chan struct{} // one token per Send

	onClose   func() // run by the first Close
	closeOnce sync.Once
	scq       *verbs.SoftCQ // registrations' completions
	regs      int           // registration work requests posted
}

// carryOut executes a registration work request at post time with the
// domain's synchronous registration, as the providers do, and queues its
// completion in cq: a local invalidation's key is dead when the post
// returns, and it completes once the accesses in progress ended.
func carryOut(wr verbs.SendWR, cq *verbs.SoftCQ) error {
	b := wr.Binding
	if wr.Opcode != verbs.OpLocalInvalidate {
		if _, err := b.MR.FastRegister(b.Target, b.Offset, b.Length, b.Access); err != nil {
			return err
		}
		cq.Push(verbs.Completion{WRID: wr.WRID, Opcode: wr.Opcode})
		return nil
	}
	if err := b.MR.InvalidateContext(noWait); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	go func() {
		c := verbs.Completion{WRID: wr.WRID, Opcode: wr.Opcode}
		if err := b.MR.Invalidate(); err != nil {
			c.Status = verbs.StatusFlushed
		}
		cq.Push(c)
	}()
	return nil
}

func (q *confQP) PostSend(wr verbs.SendWR) error {
	if wr.Opcode.IsRegistration() {
		q.mu.Lock()
		q.regs++
		q.mu.Unlock()
		return carryOut(wr, q.scq)
	}
	var msg []byte
	for _, sge := range wr.SGL {
		b := sge.MR.Bytes()
		if sge.Offset > uint64(len(b)) || uint64(sge.Length) > uint64(len(b))-sge.Offset {
			return verbs.ErrBounds
		}
		msg = append(msg, b[sge.Offset:sge.Offset+uint64(sge.Length)]...)
	}
	q.mu.Lock()
	q.sends = append(q.sends, msg)
	q.mu.Unlock()
	q.sent <- struct{}{}
	return nil
}

func (q *confQP) PostRecv(verbs.RecvWR) error   { return nil }
func (q *confQP) SendCQ() verbs.CompletionQueue { return q.scq }
func (q *confQP) RecvCQ() verbs.CompletionQueue { return verbs.NewSoftCQ() }
func (q *confQP) PD() *verbs.ProtectionDomain   { return q.pd }
func (q *confQP) PeerPrivateData() []byte       { return nil }
func (q *confQP) IRD() int                      { return 16 }
func (q *confQP) ORD() int                      { return 16 }
func (q *confQP) CRC() bool                     { return false }
func (q *confQP) LocalAddr() net.Addr           { return nil }
func (q *confQP) RemoteAddr() net.Addr          { return nil }
func (q *confQP) Err() error                    { return nil }
func (q *confQP) Done() <-chan struct{}         { return nil }
func (q *confQP) Close() error {
	if q.onClose != nil {
		q.closeOnce.Do(q.onClose)
	}
	return nil
}

// posted returns the Sends posted so far.
func (q *confQP) posted() [][]byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([][]byte(nil), q.sends...)
}

// confConn returns a connection of a new transport with confQP as its
// queue pair, in negotiation state st with send threshold sendSize.
func confConn(t *testing.T, cfg Config, st negState, sendSize int) (*conn, *confQP) {
	t.Helper()
	if cfg.Provider == nil {
		cfg.Provider = &iwarp.Provider{} // never dials: the domain is the pure-Go provider's
	}
	tr := NewTransport("127.0.0.1:1", cfg)
	t.Cleanup(func() { tr.Close() })
	qp := &confQP{pd: tr.pd, sent: make(chan struct{}, 64), scq: verbs.NewSoftCQ()}
	c := &conn{
		t: tr, qp: qp, recvSize: tr.cfg.InlineRecv,
		pending: make(map[uint32]*req), granted: 1,
		wake: make(chan struct{}), sends: make(map[uint64]sendState),
		dead: make(chan struct{}), qpClosed: make(chan struct{}),
		bcSlots: make(chan struct{}, tr.cfg.BackchannelSlots),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	t.Cleanup(c.cancel)
	c.neg, _ = tr.startNegotiation(sendSize, tr.cfg.InlineRecv, max(tr.cfg.InlineRecv, 4096))
	c.neg.st, c.neg.sendSize = st, sendSize
	return c, qp
}

// confMarshal marshals call on c and returns the req (finished at the end
// of the test) and the bytes of the Send it would post.
func confMarshal(t *testing.T, c *conn, call *oncrpc.Call, vers uint32, sendSize, recvLimit int) (*req, []byte) {
	t.Helper()
	r := &req{tr: c.t, xid: call.XID, call: call}
	if err := c.marshal(context.Background(), r, uint32(c.t.cfg.Credits), vers, sendSize, recvLimit); err != nil {
		t.Fatalf("marshal: %v", err)
	}
	t.Cleanup(func() { r.finish(c) })
	var send []byte
	for _, p := range r.pieces {
		send = append(send, p...)
	}
	// RFC 8166 s3.3.2, s4.2.4: no Send exceeds the peer's threshold.
	if len(send) > sendSize {
		t.Fatalf("%d-byte Send, threshold %d", len(send), sendSize)
	}
	// RFC 8166 s4.6: only RDMA_MSG and RDMA_NOMSG carry calls.
	if p := binary.BigEndian.Uint32(send[12:]); p != ProcMsg && p != ProcNoMsg {
		t.Fatalf("call sent as procedure %d", p)
	}
	return r, send
}

// confCallHead returns an RPC call header for xid followed by args words.
func confCallHead(xid uint32, args ...uint32) []byte {
	var e xdr.Encoder
	oncrpc.AppendCallHeader(&e, xid, echoProg, 1, procEcho, oncrpc.AuthNone)
	for _, a := range args {
		e.Uint32(a)
	}
	return e.Bytes()
}

func confWords(b []byte, n int) []uint32 {
	w := make([]uint32, n)
	for i := range w {
		w[i] = binary.BigEndian.Uint32(b[4*i:])
	}
	return w
}

// confResolve returns the bytes a peer reaches through seg with access
// need, failing the test if it cannot.
func confResolve(t *testing.T, c *conn, seg Segment, need verbs.Access) []byte {
	t.Helper()
	b, err := iwarp.TableOf(c.t.pd).Resolve(seg.Handle, need, seg.Offset, uint64(seg.Length))
	if err != nil {
		t.Fatalf("segment %+v with access %v: %v", seg, need, err)
	}
	return b
}

// confExactly checks that seg exposes exactly its bytes with access
// allowed and nothing with the other remote access (RFC 8166 s8.1.2).
func confExactly(t *testing.T, c *conn, seg Segment, allowed, denied verbs.Access) {
	t.Helper()
	confResolve(t, c, seg, allowed)
	if _, err := iwarp.TableOf(c.t.pd).Resolve(seg.Handle, allowed, seg.Offset, uint64(seg.Length)+1); !errors.Is(err, verbs.ErrBounds) {
		t.Errorf("one byte past segment %+v: %v, want ErrBounds", seg, err)
	}
	if _, err := iwarp.TableOf(c.t.pd).Resolve(seg.Handle, denied, seg.Offset, 1); !errors.Is(err, verbs.ErrAccess) {
		t.Errorf("segment %+v with access %v: %v, want ErrAccess", seg, denied, err)
	}
}

// TestConformanceInlineCall: a call that fits goes as one RDMA_MSG Send:
// a 28-byte header (xid, vers, credits requested, proc, three empty
// lists) and the RPC message right after it (RFC 8166 s3.5.1, s4.2, s4.3).
func TestConformanceInlineCall(t *testing.T) {
	for _, vers := range []uint32{Version1, Version2} {
		c, _ := confConn(t, Config{Credits: 32}, negV1, 1024)
		const xid = 0x1234abcd
		head := confCallHead(xid, 7)
		r, send := confMarshal(t, c, &oncrpc.Call{XID: xid, Head: head, MaxReplySize: 200}, vers, 1024, 1024)
		want := []uint32{xid, vers, 32, ProcMsg, 0, 0, 0}
		if got := confWords(send, 7); !reflect.DeepEqual(got, want) {
			t.Fatalf("v%d header words %v, want %v", vers, got, want)
		}
		if len(send) != MinHeaderLen+len(head) || !bytes.Equal(send[MinHeaderLen:], head) {
			t.Fatalf("v%d: Send of %d bytes is not the 28-byte header and the %d-byte call", vers, len(send), len(head))
		}
		if binary.BigEndian.Uint32(send[MinHeaderLen:]) != binary.BigEndian.Uint32(send) {
			t.Fatal("the payload does not start with rdma_xid")
		}
		if r.exposures() != 0 || c.t.pd.LiveRemoteRegions() != 0 {
			t.Fatalf("an inline call exposed %d regions", r.exposures())
		}
	}
}

// TestConformanceReadChunk: a call whose DDP-eligible argument does not
// fit inline sends it by Read chunk (RFC 8166 s3.4.5, s3.5.2): its
// position is the item's offset in the whole payload (a multiple of 4),
// its length count stays inline, the item and its XDR pad leave the
// inline stream, the chunk has no pad, and the memory is exposed for
// remote read only, exactly. Bulk outside the slab goes as several
// segments at one position, in order.
func TestConformanceReadChunk(t *testing.T) {
	c, _ := confConn(t, Config{}, negV1, 1024)
	const xid = 7
	lent, err := c.t.pool.Get(1001)
	if err != nil {
		t.Fatal(err)
	}
	defer lent.Release()
	data := lent.Bytes()
	copy(data, pattern(1001))
	head := confCallHead(xid, 3, uint32(len(data)))
	tail := []byte{0, 0, 0, 9, 0, 0, 0, 10}
	r, send := confMarshal(t, c, &oncrpc.Call{XID: xid, Head: head, Bulk: oncrpc.Lent(lent), Tail: tail, MaxReplySize: 200}, Version1, 1024, 1024)
	h := r.hdr
	if h.Proc != ProcMsg || len(h.Reads) != 1 || len(h.Writes) != 0 || h.Reply != nil {
		t.Fatalf("header %+v: want RDMA_MSG with one read segment", h)
	}
	rs := h.Reads[0]
	if rs.Position != uint32(len(head)) || rs.Position%4 != 0 {
		t.Fatalf("position %d, want %d (a multiple of 4)", rs.Position, len(head))
	}
	if rs.Length != 1001 {
		t.Fatalf("read chunk of %d bytes for a 1001-byte item (no roundup pad)", rs.Length)
	}
	if n := binary.BigEndian.Uint32(head[len(head)-4:]); n != 1001 {
		t.Fatalf("the word before the reduction point is %d, want the count 1001", n)
	}
	hlen := MinHeaderLen + readSegLen
	if !bytes.Equal(send[hlen:], append(append([]byte(nil), head...), tail...)) {
		t.Fatalf("inline stream is not head then tail (%d bytes)", len(send)-hlen)
	}
	if got := confResolve(t, c, rs.Segment, verbs.AccessRemoteRead); &got[0] != &data[0] {
		t.Fatal("the Read chunk does not expose the data where it lies")
	}
	confExactly(t, c, rs.Segment, verbs.AccessRemoteRead, verbs.AccessRemoteWrite)

	// 2.5 MiB of ordinary memory: 1 MiB transport buffers, one segment
	// each, all at the item's position, in order.
	big := pattern(5 << 19)
	head = confCallHead(xid+1, uint32(len(big)))
	r, _ = confMarshal(t, c, &oncrpc.Call{XID: xid + 1, Head: head, Bulk: oncrpc.Plain(big), MaxReplySize: 200}, Version1, 1024, 1024)
	if len(r.hdr.Reads) != 3 {
		t.Fatalf("%d read segments for 2.5 MiB outside the slab, want 3", len(r.hdr.Reads))
	}
	var got []byte
	for _, rs := range r.hdr.Reads {
		if rs.Position != uint32(len(head)) {
			t.Fatalf("segment at position %d, want %d", rs.Position, len(head))
		}
		got = append(got, confResolve(t, c, rs.Segment, verbs.AccessRemoteRead)...)
	}
	if !bytes.Equal(got, big) {
		t.Fatal("the segments, concatenated in order, are not the item")
	}
}

// TestConformancePositionZero: a call that does not fit inline even
// reduced, or has nothing to reduce, is an RDMA_NOMSG whose Send is the
// transport header alone and whose Position-Zero Read chunk is the whole
// call, XDR padding included, starting with the XID (RFC 8166 s3.5.3,
// s4.2.4).
func TestConformancePositionZero(t *testing.T) {
	c, _ := confConn(t, Config{}, negV1, 1024)
	cases := []struct {
		name string
		call *oncrpc.Call
	}{
		{"no DDP-eligible item", &oncrpc.Call{XID: 21, Head: append(confCallHead(21, 3000), pattern(3000)...), MaxReplySize: 200}},
		{"head too large to reduce", &oncrpc.Call{XID: 22, Head: append(confCallHead(22), pattern(2000)...), Bulk: oncrpc.Plain(pattern(1001)), Tail: []byte{0, 0, 0, 1}, MaxReplySize: 200}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, send := confMarshal(t, c, tc.call, Version1, 1024, 1024)
			var h Header
			n, err := h.Decode(send, false)
			if err != nil || n != len(send) {
				t.Fatalf("Send of %d bytes: header %d bytes, %v; want the header only", len(send), n, err)
			}
			if h.Proc != ProcNoMsg || len(h.Reads) == 0 || h.XID != tc.call.XID {
				t.Fatalf("header %+v: want RDMA_NOMSG with a Read chunk", h)
			}
			var chunk []byte
			for _, rs := range h.Reads {
				if rs.Position != 0 {
					t.Fatalf("segment at position %d", rs.Position)
				}
				confExactly(t, c, rs.Segment, verbs.AccessRemoteRead, verbs.AccessRemoteWrite)
				chunk = append(chunk, confResolve(t, c, rs.Segment, verbs.AccessRemoteRead)...)
			}
			call := tc.call
			want := append(append([]byte(nil), call.Head...), call.Bulk.Bytes()...)
			want = append(append(want, zeroPad[:xdr.Pad(call.Bulk.Len())]...), call.Tail...)
			if len(chunk)%4 != 0 || !bytes.Equal(chunk, want) {
				t.Fatalf("chunk of %d bytes is not the padded %d-byte call", len(chunk), len(want))
			}
			if binary.BigEndian.Uint32(chunk) != h.XID {
				t.Fatal("rdma_xid differs from the XID in the chunk")
			}
			if r.exposures() != len(h.Reads) || len(r.readRegs) != len(h.Reads) {
				t.Fatalf("%d exposures (%d for the Read chunk) for %d segments", r.exposures(), len(r.readRegs), len(h.Reads))
			}
		})
	}
}

// TestConformanceWriteChunk: a DDP-eligible result that may not fit
// inline gets a Write chunk of exactly its length, no room for pad,
// exposed for remote write only (RFC 8166 s3.4.6, s8.1.2); one that fits
// gets an empty Write list, asking for it inline (s4.3.2).
func TestConformanceWriteChunk(t *testing.T) {
	c, _ := confConn(t, Config{}, negV1, 1024)
	lent, err := c.t.pool.Get(1001)
	if err != nil {
		t.Fatal(err)
	}
	defer lent.Release()
	dest := lent.Bytes()
	r, _ := confMarshal(t, c, &oncrpc.Call{XID: 31, Head: confCallHead(31, 1001), ReplyBulk: oncrpc.Lent(lent), MaxReplySize: 128}, Version1, 1024, 1024)
	if len(r.hdr.Writes) != 1 || len(r.hdr.Writes[0]) != 1 || len(r.hdr.Reads) != 0 {
		t.Fatalf("header %+v: want one Write chunk of one segment", r.hdr)
	}
	seg := r.hdr.Writes[0][0]
	if seg.Length != 1001 {
		t.Fatalf("Write chunk of %d bytes for a 1001-byte result", seg.Length)
	}
	if got := confResolve(t, c, seg, verbs.AccessRemoteWrite); &got[0] != &dest[0] {
		t.Fatal("the Write chunk is not the destination")
	}
	confExactly(t, c, seg, verbs.AccessRemoteWrite, verbs.AccessRemoteRead)

	// Ordinary memory goes through a transport buffer of the same size.
	r, _ = confMarshal(t, c, &oncrpc.Call{XID: 32, Head: confCallHead(32, 1001), ReplyBulk: oncrpc.Plain(make([]byte, 1001)), MaxReplySize: 128}, Version1, 1024, 1024)
	if len(r.hdr.Writes) != 1 || len(r.hdr.Writes[0]) != 1 || r.hdr.Writes[0][0].Length != 1001 {
		t.Fatalf("bounced Write chunk %+v", r.hdr.Writes)
	}
	confExactly(t, c, r.hdr.Writes[0][0], verbs.AccessRemoteWrite, verbs.AccessRemoteRead)

	// A result that fits the reply threshold: no Write list at all.
	_, send := confMarshal(t, c, &oncrpc.Call{XID: 33, Head: confCallHead(33, 100), ReplyBulk: oncrpc.Plain(dest[:100]), MaxReplySize: 128}, Version1, 1024, 4096)
	if w := confWords(send, 7); w[4] != 0 || w[5] != 0 || w[6] != 0 {
		t.Fatalf("small READ: list words %v, want three empty lists", w[4:])
	}
}

// TestConformanceReplyChunk: a Reply chunk is offered when the largest
// reply may not fit the reply threshold, and only then (RFC 8166 s4.3.3);
// it is padded to a multiple of 4 (s3.5.3), write-only, and coexists with
// a Write chunk (s4.3.2).
func TestConformanceReplyChunk(t *testing.T) {
	c, _ := confConn(t, Config{}, negV1, 4096)
	r, _ := confMarshal(t, c, &oncrpc.Call{XID: 41, Head: confCallHead(41), MaxReplySize: 1000}, Version1, 4096, 4096)
	if r.hdr.Reply != nil {
		t.Fatal("Reply chunk for a reply that fits")
	}
	r, send := confMarshal(t, c, &oncrpc.Call{XID: 42, Head: confCallHead(42), MaxReplySize: 5001}, Version1, 4096, 4096)
	if len(r.hdr.Reply) != 1 {
		t.Fatalf("Reply chunk %+v for a 5001-byte reply", r.hdr.Reply)
	}
	seg := r.hdr.Reply[0]
	if seg.Length < 5001 || seg.Length%4 != 0 {
		t.Fatalf("Reply chunk of %d bytes for a 5001-byte reply", seg.Length)
	}
	confExactly(t, c, seg, verbs.AccessRemoteWrite, verbs.AccessRemoteRead)
	var h Header
	if _, err := h.Decode(send, false); err != nil || !reflect.DeepEqual(h.Reply, r.hdr.Reply) {
		t.Fatalf("Send header: %+v, %v", h, err)
	}
	// The Reply chunk takes 20 header bytes (segment count and segment;
	// its presence word is one of the 28): a call that fills the Send to
	// the byte with it goes inline, 4 bytes more go Position-Zero.
	for _, extra := range []int{0, 4} {
		head := append(confCallHead(44), make([]byte, 1024-MinHeaderLen-20-len(confCallHead(44))+extra)...)
		r, send := confMarshal(t, c, &oncrpc.Call{XID: 44, Head: head, MaxReplySize: 5001}, Version1, 1024, 1024)
		if want := map[int]chunkKind{0: chunkInline, 4: chunkPosZero}[extra]; r.kinds[0] != want || (extra == 0 && len(send) != 1024) {
			t.Fatalf("call of %d bytes with a Reply chunk: sent as %s in %d bytes", len(head), chunkNames[r.kinds[0]], len(send))
		}
	}
	// A READ and a large rest of the reply: both chunks.
	r, _ = confMarshal(t, c, &oncrpc.Call{XID: 43, Head: confCallHead(43), ReplyBulk: oncrpc.Plain(make([]byte, 8192)), MaxReplySize: 6000}, Version1, 4096, 4096)
	if len(r.hdr.Writes) != 1 || len(r.hdr.Reply) != 1 {
		t.Fatalf("header %+v: want a Write chunk and a Reply chunk", r.hdr)
	}
}

// TestConformanceSegmentGolden: the chunk-list encoding of RFC 8166
// s4.1.2/s4.3 spelled out (the checklist's "1 3 HLOO HLOO HLOO 1 2 HLOO
// HLOO 0" Write list), and the error codes shared by both versions'
// decoders (bis-04 s9.1).
func TestConformanceSegmentGolden(t *testing.T) {
	seg := func(i uint32) Segment {
		return Segment{Handle: 0x100 + i, Length: 0x10 * i, Offset: 0x1000 * uint64(i)}
	}
	h := Header{XID: 9, Vers: 1, Credit: 8, Proc: ProcMsg, Writes: [][]Segment{{seg(1), seg(2), seg(3)}, {seg(4), seg(5)}}}
	hloo := func(i uint32) string {
		s := seg(i)
		var e xdr.Encoder
		encodeSegment(&e, s)
		return hex.EncodeToString(e.Bytes())
	}
	want := "00000009 00000001 00000008 00000000" + " 00000000" + // no Read list
		" 00000001 00000003" + hloo(1) + hloo(2) + hloo(3) +
		" 00000001 00000002" + hloo(4) + hloo(5) + " 00000000" + // end of the Write list
		" 00000000" // no Reply chunk
	var e xdr.Encoder
	h.Append(&e)
	if got := hex.EncodeToString(e.Bytes()); got != strings.Join(strings.Fields(want), "") {
		t.Fatalf("encode\n got %s\nwant %s", got, strings.Join(strings.Fields(want), ""))
	}
	if hloo(1) != "00000101"+"00000010"+"0000000000001000" {
		t.Fatalf("segment %s: want handle(4) length(4) offset(8)", hloo(1))
	}
	var d Header
	if n, err := d.Decode(e.Bytes(), false); err != nil || n != e.Len() || !reflect.DeepEqual(d.Writes, h.Writes) {
		t.Fatalf("round trip: %+v %v", d, err)
	}
	for _, code := range []uint32{ErrVers, ErrChunk} {
		e.Reset(nil)
		(&Header{XID: 1, Vers: 1, Proc: ProcError, ErrCode: code, VersLow: 1, VersHigh: 1}).Append(&e)
		for _, v2 := range []bool{false, true} {
			if _, err := d.Decode(e.Bytes(), v2); err != nil || d.ErrCode != code {
				t.Fatalf("error code %d, v2 decoder %v: %v %+v", code, v2, err, d)
			}
		}
	}
}

// TestConformanceLocalErrorFailsFast: a call that cannot be built (here
// no memory for its Write chunk) fails at once: it is never queued, its
// credit is given back, nothing is sent and nothing stays exposed (RFC
// 8166 s4.5.4).
func TestConformanceLocalErrorFailsFast(t *testing.T) {
	c, qp := confConn(t, Config{MemoryBytes: mrcache.ChunkSize}, negV1, 1024)
	all, err := c.t.pool.GetWait(context.Background(), mrcache.ChunkSize)
	if err != nil {
		t.Fatal(err)
	}
	defer c.t.pool.Put(all)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no waiting for memory
	r := &req{tr: c.t, xid: 61, call: &oncrpc.Call{XID: 61, Head: confCallHead(61, 8192), ReplyBulk: oncrpc.Plain(make([]byte, 8192)), MaxReplySize: 128}}
	if err := c.send(ctx, r); !errors.Is(err, context.Canceled) {
		t.Fatalf("send with no memory: %v", err)
	}
	if c.inflight != 0 || len(c.pending) != 0 || len(qp.posted()) != 0 || c.t.pd.LiveRemoteRegions() != 0 {
		t.Fatalf("after the failed call: %d in flight, %d pending, %d sent, %d exposed", c.inflight, len(c.pending), len(qp.posted()), c.t.pd.LiveRemoteRegions())
	}
}

// TestConformanceFailedInvalidateClosesFirst: when a reply arrives while
// the peer still holds a placement into the call's Write chunk (the
// invalidation cannot complete), the queue pair is closed, ending the
// placement, before the RPC completes, and the connection is failed (RFC
// 8166 s4.5.4, s8.1). The test waits out the requester's bound on the
// invalidation (invalidateWait).
func TestConformanceFailedInvalidateClosesFirst(t *testing.T) {
	c, qp := confConn(t, Config{}, negV1, 1024)
	lent, err := c.t.pool.Get(1001)
	if err != nil {
		t.Fatal(err)
	}
	defer lent.Release()
	r, _ := confMarshal(t, c, &oncrpc.Call{XID: 81, Head: confCallHead(81, 1001), ReplyBulk: oncrpc.Lent(lent), MaxReplySize: 128}, Version1, 1024, 1024)
	seg := r.hdr.Writes[0][0]
	r.done = make(chan struct{})
	c.pending[81], c.inflight = r, 1
	_, mr, err := iwarp.TableOf(c.t.pd).Begin(seg.Handle, verbs.AccessRemoteWrite, seg.Offset, 1) // a placement that stalls
	if err != nil {
		t.Fatal(err)
	}
	closedBeforeDone := false
	qp.onClose = func() {
		closedBeforeDone = !confDone(r)
		mr.End() // closing the queue pair ends its placements
	}
	c.receive(0, confMsg(Header{XID: 81, Vers: Version1, Credit: 4, Proc: ProcMsg, Writes: [][]Segment{{{Handle: seg.Handle, Offset: seg.Offset}}}}, true), 0, false)
	if !confDone(r) {
		t.Fatal("the call did not complete")
	}
	if r.reply != nil {
		r.reply.Release()
	}
	if !closedBeforeDone {
		t.Fatal("the queue pair was not closed before the call completed")
	}
	<-c.dead
	if !errors.Is(c.err, oncrpc.ErrConnection) {
		t.Fatalf("connection error %v", c.err)
	}
	if _, err := iwarp.TableOf(c.t.pd).Resolve(seg.Handle, verbs.AccessRemoteWrite, seg.Offset, 1); !errors.Is(err, verbs.ErrInvalidSTag) {
		t.Fatalf("the Write chunk after the failed invalidation: %v", err)
	}
}
