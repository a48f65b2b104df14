package rpcrdma

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// Replies a hostile or broken responder could send, checked against the
// fake peer (fakepeer_test.go).

// warmUp makes the first call of a connection, answered with the peer's
// grant, and returns the peer's side of the connection.
func warmUp(t *testing.T, fp *fakePeer, tr *Transport) *peerConn {
	t.Helper()
	ch := goRoundTrip(fp.ctx, tr, &oncrpc.Call{XID: 1, Head: mkCall(1, procEcho, be32(0)), MaxReplySize: 128})
	pc := fp.accept()
	pc.reply(pc.recvCall(), be32(0))
	if r := fp.wait(ch); r.err != nil {
		t.Fatal(r.err)
	} else {
		r.rep.Release()
	}
	return pc
}

// TestHostileMalformedRepliesDropped: replies that do not match their
// call are discarded without failing it or changing the credit grant
// (RFC 8166 s4.5); the call completes with the well-formed reply that
// follows them. The number of bytes placed in the Write chunk that the
// reply reports reaches the caller (Reply.BulkLen), so a READ whose count
// says more can be caught; nothing lands outside the chunk.
func TestHostileMalformedRepliesDropped(t *testing.T) {
	fp := newFakePeer(t, peerOpts{Credits: 4})
	tr := fp.transport(Config{Version: Version1})
	pc := warmUp(t, fp, tr)
	ec := newExposedCall(t, tr, 50)
	ch := goRoundTrip(fp.ctx, tr, ec.call)
	m := pc.recvCall()
	w := m.Hdr.Writes[0][0]
	before := tr.Stats()

	good := pc.replyHeader(m)
	good.Writes[0][0].Length = 100
	good.Credit = 3
	payload := append(rpcReply(m.RPCXID), be32(exposedDest)...) // a READ count of 4096
	bad := func(mut func(h *Header)) []byte {
		h := pc.replyHeader(m)
		h.Writes[0][0].Length = 100
		h.Credit = 1000
		mut(&h)
		return encodeMsg(h, payload)
	}
	raw := func(words ...uint32) []byte {
		var b []byte
		for _, w := range words {
			b = append(b, be32(w)...)
		}
		return b
	}
	x := m.Hdr.XID
	malformed := map[string][]byte{
		"read list": bad(func(h *Header) {
			h.Reads = []ReadSegment{{Position: 0, Segment: Segment{Handle: w.Handle, Length: 4}}}
		}),
		"two Write chunks":      bad(func(h *Header) { h.Writes = append(h.Writes, h.Writes[0]) }),
		"extra segment":         bad(func(h *Header) { h.Writes[0] = append(h.Writes[0], h.Writes[0][0]) }),
		"segment too long":      bad(func(h *Header) { h.Writes[0][0].Length = w.Length + 1 }),
		"another handle":        bad(func(h *Header) { h.Writes[0][0].Handle ^= 0x100 }),
		"another offset":        bad(func(h *Header) { h.Writes[0][0].Offset += 8 }),
		"NOMSG without chunk":   bad(func(h *Header) { h.Proc = ProcNoMsg }),
		"v2 on a v1 connection": bad(func(h *Header) { h.Vers = Version2 }),
		"version 3":             bad(func(h *Header) { h.Vers = 3 }),
		"RPC XID mismatch":      encodeMsg(good, append(rpcReply(m.RPCXID+1), be32(exposedDest)...)),
		"no RPC payload":        encodeMsg(good),
		// RFC 8166 s4.5, s4.6: unknown, MSGP and DONE procedures.
		"proc 7":    raw(x, 1, 1000, 7, 0, 0, 0),
		"RDMA_MSGP": raw(x, 1, 1000, ProcMsgP, 0, 0, 0, 0, 0),
		"RDMA_DONE": raw(x, 1, 1000, ProcDone),
		// v2 draft s4.2: error code 3 exists only in version 2.
		"INVAL_OPTION on v1":     raw(x, 1, 1000, ProcError, ErrOption),
		"RDMA_OPTIONAL on v1":    raw(x, 1, 1000, ProcOptional, 0x7fff, 0),
		"v2 RDMA_OPTIONAL on v1": raw(x, 2, 1000, ProcOptional, 0x7fff, 0),
		"unknown error code":     raw(x, 1, 1000, ProcError, 9),
		"ERR_VERS cut short":     raw(x, 1, 1000, ProcError, ErrVers, 1),
		"16 bytes":               raw(x, 1, 1000, ProcMsg),
		"12 bytes":               raw(x, 1, 1000),
		"empty":                  nil,
	}
	for name, b := range malformed {
		if err := pc.sendRawInv(b, false, 0); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// Each was dropped before it changed anything: the grant is still
	// the last good reply's (4), looked at before a good reply could
	// set it again (each bad one says 1000, which would count as 128).
	for tr.Stats().Dropped-before.Dropped < uint64(len(malformed)) {
		if fp.ctx.Err() != nil {
			t.Fatalf("%d of %d malformed replies dropped", tr.Stats().Dropped-before.Dropped, len(malformed))
		}
		time.Sleep(time.Millisecond)
	}
	if st := tr.Stats(); st.Credits != 4 {
		t.Fatalf("grant %d after malformed replies, want the 4 of the last good one: a dropped reply's grant was taken", st.Credits)
	}
	// The peer places 100 bytes and says so; its READ count says 4096.
	data := pattern(100)
	if err := pc.write(w.Handle, w.Offset, data); err != nil {
		t.Fatal(err)
	}
	pc.replyWith(m, good, be32(exposedDest))
	r := fp.wait(ch)
	if r.err != nil {
		t.Fatalf("call failed after malformed replies: %v", r.err)
	}
	defer r.rep.Release()
	st := tr.Stats()
	if got := st.Dropped - before.Dropped; got != uint64(len(malformed)) {
		t.Errorf("%d messages dropped, want %d", got, len(malformed))
	}
	if st.Credits != 3 {
		t.Errorf("grant %d after the reply, want its 3: a dropped reply's grant was taken", st.Credits)
	}
	if !r.rep.BulkPlaced || r.rep.BulkLen != 100 {
		t.Fatalf("reply reports %v, %d bytes placed, want 100", r.rep.BulkPlaced, r.rep.BulkLen)
	}
	if !bytes.Equal(ec.dest[:100], data) {
		t.Fatal("placed bytes differ")
	}
	for i, b := range ec.dest[100:] {
		if b != guardPattern {
			t.Fatalf("byte %d changed beyond what was placed", 100+i)
		}
	}
	if st.Connects != 1 {
		t.Fatalf("%d connections: a malformed reply cost the connection", st.Connects)
	}
	requireFenced(t, tr, m.segments(), true)
}

// TestHostileShortWriteChunkBounce: a destination outside registered
// memory is offered as several Write chunk segments of transport buffers;
// what the reply says was placed, segment by segment, is all that is
// copied out (RFC 8166 s3.4.6), and a reply claiming data after a short
// segment (not filled contiguously) is dropped.
func TestHostileShortWriteChunkBounce(t *testing.T) {
	fp := newFakePeer(t, peerOpts{Credits: 4})
	tr := fp.transport(Config{Version: Version1})
	pc := warmUp(t, fp, tr)
	const size = 2*bounceSize + 4096
	dest := make([]byte, size)
	fill(dest, guardPattern)
	ch := goRoundTrip(fp.ctx, tr, &oncrpc.Call{XID: 60, Head: mkCall(60, procSource, be32(size)), ReplyBulk: oncrpc.Plain(dest), MaxReplySize: 128})
	m := pc.recvCall()
	segs := m.Hdr.Writes[0]
	if len(segs) != 3 || segs[0].Length != bounceSize || segs[2].Length != 4096 {
		t.Fatalf("Write chunk %v for a %d-byte destination outside registered memory", segs, size)
	}
	data := pattern(bounceSize + 500)
	if err := pc.write(segs[0].Handle, segs[0].Offset, data[:bounceSize]); err != nil {
		t.Fatal(err)
	}
	if err := pc.write(segs[1].Handle, segs[1].Offset, data[bounceSize:]); err != nil {
		t.Fatal(err)
	}
	// The last segment is written but reported empty: not copied.
	if err := pc.write(segs[2].Handle, segs[2].Offset, pattern(4096)); err != nil {
		t.Fatal(err)
	}
	payload := append(rpcReply(m.RPCXID), be32(size)...)
	h := pc.replyHeader(m)
	h.Writes[0][0].Length, h.Writes[0][2].Length = 500, 4096
	pc.send(h, payload) // data after a short segment: dropped
	h.Writes[0][0].Length, h.Writes[0][1].Length, h.Writes[0][2].Length = bounceSize, 500, 0
	pc.replyWith(m, h, payload)
	r := fp.wait(ch)
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.rep.Release()
	if r.rep.BulkLen != len(data) {
		t.Fatalf("BulkLen %d, want %d", r.rep.BulkLen, len(data))
	}
	if !bytes.Equal(dest[:len(data)], data) {
		t.Fatal("placed data differs")
	}
	for i, b := range dest[len(data):] {
		if b != guardPattern {
			t.Fatalf("byte %d beyond the placed data changed", len(data)+i)
		}
	}
	if st := tr.Stats(); st.Dropped != 1 {
		t.Fatalf("%d dropped, want the non-contiguous reply", st.Dropped)
	}
}

// TestHostileWriteChunkOverclaim: a responder whose returned Write chunk
// claims more bytes than it RDMA-Wrote (4096 claimed, 100 written) gets
// only the bytes it placed counted (Reply.BulkLen 100): the rest of the
// destination holds what was there before, not data (RFC 8166 s3.4.6),
// and a READ count above 100 is then refused by the upper layer
// (nfsclient.TestReadCountBeyondPlaced: an I/O error). This holds for a
// destination exposed where it is and for one bounced through transport
// buffers, where nothing beyond the placed bytes is copied out.
func TestHostileWriteChunkOverclaim(t *testing.T) {
	for _, bounce := range []bool{false, true} {
		t.Run(map[bool]string{false: "registered", true: "bounce"}[bounce], func(t *testing.T) {
			fp := newFakePeer(t, peerOpts{Credits: 4})
			tr := fp.transport(Config{Version: Version1})
			pc := warmUp(t, fp, tr)
			var call *oncrpc.Call
			var dest []byte
			if bounce {
				dest = make([]byte, 2*exposedDest)
				fill(dest, guardPattern)
				call = &oncrpc.Call{XID: 70, Head: mkCall(70, procSource, be32(exposedDest)), ReplyBulk: oncrpc.Plain(dest[:exposedDest]), MaxReplySize: 128}
			} else {
				ec := newExposedCall(t, tr, 70)
				call, dest = ec.call, ec.dest
			}
			ch := goRoundTrip(fp.ctx, tr, call)
			m := pc.recvCall()
			w := m.Hdr.Writes[0]
			if len(w) != 1 || w[0].Length != exposedDest {
				t.Fatalf("Write chunk %v for a %d-byte destination", w, exposedDest)
			}
			data := pattern(100)
			if err := pc.write(w[0].Handle, w[0].Offset, data); err != nil {
				t.Fatal(err)
			}
			h := pc.replyHeader(m)
			h.Writes[0][0].Length = exposedDest // claims the whole chunk
			pc.replyWith(m, h, be32(exposedDest))
			r := fp.wait(ch)
			if r.err != nil {
				t.Fatal(r.err)
			}
			defer r.rep.Release()
			if !r.rep.BulkPlaced || r.rep.BulkLen != len(data) {
				t.Fatalf("4096 bytes claimed, 100 written: placed %v, BulkLen %d; want 100", r.rep.BulkPlaced, r.rep.BulkLen)
			}
			if !bytes.Equal(dest[:len(data)], data) {
				t.Fatal("placed bytes differ")
			}
			for i, b := range dest[len(data):] {
				if b != guardPattern {
					t.Fatalf("byte %d beyond the placed bytes changed", len(data)+i)
				}
			}
		})
	}
}

// TestHostileReplyChunkOverclaim: a responder whose returned Reply chunk
// claims more bytes than it RDMA-Wrote (8192 claimed, a 24-byte reply
// written) does not get the rest of the buffer, which held a marker,
// passed off as the reply (RFC 8166 s3.4.6: only the bytes it wrote are
// the reply). The call fails as on a broken connection; a reply that
// claims what it wrote is delivered, exactly those bytes.
func TestHostileReplyChunkOverclaim(t *testing.T) {
	for _, claim := range []string{"overclaim", "exact"} {
		t.Run(claim, func(t *testing.T) {
			fp := newFakePeer(t, peerOpts{Credits: 4})
			tr := fp.transport(Config{Version: Version1})
			pc := warmUp(t, fp, tr)
			// Whatever buffer the Reply chunk gets, it held the marker.
			pool := tr.Buffers()
			var held []*mrcache.Buffer
			for range 8 {
				b, err := pool.Get(8192)
				if err != nil {
					t.Fatal(err)
				}
				fill(b.Bytes(), guardPattern)
				held = append(held, b)
			}
			for _, b := range held {
				pool.Put(b)
			}
			ch := goRoundTrip(fp.ctx, tr, &oncrpc.Call{XID: 80, Head: mkCall(80, procBigRepl, be32(0)), MaxReplySize: 8192})
			m := pc.recvCall()
			if len(m.Hdr.Reply) != 1 || m.Hdr.Reply[0].Length < 8192 {
				t.Fatalf("Reply chunk %v offered for an 8192-byte reply", m.Hdr.Reply)
			}
			seg := m.Hdr.Reply[0]
			reply := rpcReply(m.RPCXID)
			if err := pc.write(seg.Handle, seg.Offset, reply); err != nil {
				t.Fatal(err)
			}
			h := pc.replyHeader(m)
			h.Proc = ProcNoMsg
			h.Reply = []Segment{seg}
			if claim == "exact" {
				h.Reply[0].Length = uint32(len(reply))
			}
			m.release()
			pc.send(h)
			r := fp.wait(ch)
			if claim == "exact" {
				if r.err != nil {
					t.Fatal(r.err)
				}
				defer r.rep.Release()
				if !bytes.Equal(r.rep.Msg, reply) {
					t.Fatalf("reply %d bytes, want the %d written", len(r.rep.Msg), len(reply))
				}
				return
			}
			if r.err == nil {
				defer r.rep.Release()
				t.Fatalf("%d bytes claimed, %d written: a %d-byte reply was delivered, %d bytes of it the buffer's old contents",
					seg.Length, len(reply), len(r.rep.Msg), bytes.Count(r.rep.Msg, []byte{guardPattern}))
			}
			if !errors.Is(r.err, oncrpc.ErrConnection) {
				t.Fatalf("RoundTrip: %v, want a connection error", r.err)
			}
		})
	}
}
