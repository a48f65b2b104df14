package rpcrdma

import (
	"fmt"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// Inline thresholds and the decisions that depend on them, against the
// fake peer.

// offersReplyChunk sends a call with the given largest reply and reports
// whether it offered a Reply chunk; the peer answers it inline.
func offersReplyChunk(t *testing.T, fp *fakePeer, tr *Transport, pc *peerConn, xid uint32, maxReply int) bool {
	t.Helper()
	ch := goRoundTrip(fp.ctx, tr, &oncrpc.Call{XID: xid, Head: mkCall(xid, procBigRepl, be32(0)), MaxReplySize: maxReply})
	m := pc.recvCall()
	pc.reply(m, be32(0))
	if r := fp.wait(ch); r.err != nil {
		t.Fatal(r.err)
	} else {
		r.rep.Release()
	}
	return m.Hdr.Reply != nil
}

// TestReplyThresholdV1: on version 1 the reply threshold is the smaller of
// the responder's largest Send and our receive buffers (RFC 8166 s3.3.2),
// from RFC 8797 private data, 1024 without it (s3.3.3); a reply that could
// exceed it, transport header included, gets a Reply chunk (s4.3.3).
func TestReplyThresholdV1(t *testing.T) {
	for _, tc := range []struct {
		opts      peerOpts
		threshold int
	}{
		{peerOpts{NoPrivateData: true}, 1024},
		{peerOpts{InlineSend: 2048}, 2048},
		{peerOpts{InlineSend: 16384}, 4096}, // our receive buffers
	} {
		t.Run(fmt.Sprint(tc.threshold), func(t *testing.T) {
			fp := newFakePeer(t, tc.opts)
			tr := fp.transport(Config{Version: Version1})
			pc := warmUp(t, fp, tr)
			if !offersReplyChunk(t, fp, tr, pc, 10, tc.threshold) {
				t.Fatalf("%d-byte reply, threshold %d: no Reply chunk", tc.threshold, tc.threshold)
			}
			if offersReplyChunk(t, fp, tr, pc, 11, tc.threshold-replyHeaderRoom) {
				t.Fatalf("%d-byte reply, threshold %d: Reply chunk offered", tc.threshold-replyHeaderRoom, tc.threshold)
			}
			// The call threshold follows the peer's receive size:
			// 1024 without private data, so a 3000-byte call is a
			// long call.
			if tc.opts.NoPrivateData {
				head := mkCall(12, procEcho, make([]byte, 3000))
				ch := goRoundTrip(fp.ctx, tr, &oncrpc.Call{XID: 12, Head: head, MaxReplySize: 128})
				m := pc.recv()
				if m.Hdr.Proc != ProcNoMsg || len(m.Raw) > 1024 {
					t.Fatalf("3000-byte call to a peer without private data: proc %d, %d-byte Send", m.Hdr.Proc, len(m.Raw))
				}
				m.RPCXID = 12
				pc.reply(m, be32(0))
				if r := fp.wait(ch); r.err != nil {
					t.Fatal(r.err)
				}
			}
		})
	}
}

// TestReplyThresholdV2: on version 2 the reply threshold is 4096 (v2
// draft s2.3) even after our ROPT_INITXCH announced larger receive
// buffers: the peer may not have taken note (xcharext s4.1), so a 6000-
// byte reply still gets a Reply chunk.
func TestReplyThresholdV2(t *testing.T) {
	fp := newFakePeer(t, peerOpts{Credits: 4})
	tr := fp.transport(Config{XChars: true, InlineRecv: 8192, InlineSend: 8192})
	pc := warmUp(t, fp, tr)
	ch := goRoundTrip(fp.ctx, tr, smallCall(2))
	var initXch bool
	for {
		m := pc.recv()
		if m.IsCall {
			pc.reply(m, be32(0))
			break
		}
		if m.Hdr.Proc == ProcOptional && m.Hdr.OptType == OptInitXch {
			x, err := ParseInitXch(m.Hdr.OptInfo)
			var c Chars
			if err == nil {
				err = c.applySpec(x.Start)
			}
			if err != nil || c.RBSize != 8192 {
				t.Fatalf("INITXCH announces %+v (%v), want RBSIZ 8192", c, err)
			}
			initXch = true
		}
	}
	if r := fp.wait(ch); r.err != nil || !initXch {
		t.Fatalf("INITXCH sent %v, call: %v", initXch, r.err)
	}
	if !offersReplyChunk(t, fp, tr, pc, 3, 6000) {
		t.Fatal("6000-byte reply on version 2 without a Reply chunk: our INITXCH was trusted")
	}
}

// TestV2ReceivesAtLeast4096: version 2 receivers accept 4096-byte
// messages (v2 draft s2.3), so a requester that may speak version 2 posts
// receive buffers of 4096 bytes even with a smaller inline threshold; the
// threshold still decides when a reply needs a Reply chunk.
func TestV2ReceivesAtLeast4096(t *testing.T) {
	fp := newFakePeer(t, peerOpts{})
	tr := fp.transport(Config{InlineRecv: 2048})
	pc := warmUp(t, fp, tr)
	if st := tr.Stats(); st.Version != Version2 || st.InlineRecv < 4096 {
		t.Fatalf("with a 2048-byte threshold: version %d, receive buffers of %d bytes", st.Version, st.InlineRecv)
	}
	ch := goRoundTrip(fp.ctx, tr, smallCall(2))
	m := pc.recvCall()
	big := make([]byte, 4096-MinHeaderLen-len(rpcReply(m.RPCXID)))
	pc.reply(m, big) // a 4096-byte Send
	if r := fp.wait(ch); r.err != nil {
		t.Fatalf("4096-byte reply on version 2: %v", r.err)
	}
	if !offersReplyChunk(t, fp, tr, pc, 3, 3000) {
		t.Fatal("3000-byte reply with a 2048-byte threshold: no Reply chunk")
	}
}

// TestCallHeaderSize: the call's transport header is counted exactly,
// with a Reply chunk (4 + 16 bytes beyond its presence word) and Write
// chunks of several segments (8 + 16 per segment): a call that fits
// the threshold with its header goes inline, one 4 bytes larger goes as a
// long call; neither fails to marshal. The call threshold is the smaller
// of our largest Send and the peer's receive size (RFC 8166 s3.3.2, from
// RFC 8797 private data): with a peer that receives 2048 bytes and our
// Sends of up to 8192, it is 2048. (The peer posts 16 KiB buffers, so a
// call sent beyond its announced size would arrive and show.)
func TestCallHeaderSize(t *testing.T) {
	for _, sizes := range []struct{ ourSend, peerRecv int }{{4096, 4096}, {8192, 2048}} {
		t.Run(fmt.Sprintf("send%d-recv%d", sizes.ourSend, sizes.peerRecv), func(t *testing.T) {
			callHeaderSize(t, sizes.ourSend, sizes.peerRecv)
		})
	}
}

func callHeaderSize(t *testing.T, ourSend, peerRecv int) {
	fp := newFakePeer(t, peerOpts{InlineRecv: peerRecv, RecvBufSize: 16 << 10})
	tr := fp.transport(Config{Version: Version1, InlineSend: ourSend})
	pc := warmUp(t, fp, tr)
	threshold := min(ourSend, peerRecv)
	if st := tr.Stats(); st.InlineSend != threshold {
		t.Fatalf("call threshold %d, want %d", st.InlineSend, threshold)
	}
	xid := uint32(20)
	for _, tc := range []struct {
		name      string
		replyBulk []byte
		hdr       int
	}{
		{"reply chunk", nil, MinHeaderLen + 4 + writeSegLen},
		{"3-segment write chunk and reply chunk", make([]byte, 2*bounceSize+1), MinHeaderLen + chunkHdrLen + 3*writeSegLen + 4 + writeSegLen},
	} {
		for _, extra := range []int{0, 4} {
			xid++
			head := mkCall(xid, procEcho)
			head = append(head, make([]byte, threshold-tc.hdr+extra-len(head))...)
			call := &oncrpc.Call{XID: xid, Head: head, ReplyBulk: oncrpc.Plain(tc.replyBulk), MaxReplySize: 8000}
			ch := goRoundTrip(fp.ctx, tr, call)
			m := pc.recv()
			wantProc := uint32(ProcMsg)
			if extra > 0 {
				wantProc = ProcNoMsg
			}
			if m.HdrErr != nil || m.Hdr.Proc != wantProc || len(m.Raw) > threshold {
				t.Fatalf("%s, %d bytes over: proc %d (%v), %d-byte Send", tc.name, extra, m.Hdr.Proc, m.HdrErr, len(m.Raw))
			}
			if extra == 0 && len(m.Raw) != threshold {
				t.Fatalf("%s: %d-byte Send, want exactly %d", tc.name, len(m.Raw), threshold)
			}
			m.RPCXID = xid
			pc.reply(m, be32(0))
			if r := fp.wait(ch); r.err != nil {
				t.Fatalf("%s, %d bytes over: %v", tc.name, extra, r.err)
			}
		}
	}
}

// TestInlineRecvFloor: RFC 8797 private data cannot announce a receive
// size below 1024 bytes, and RFC 8166 s3.3.3 makes 1024 the least every
// connection provides; a Config.InlineRecv below it is raised to it, so
// the receive buffers hold what the private data announced: a reply of
// that size arrives whole.
func TestInlineRecvFloor(t *testing.T) {
	fp := newFakePeer(t, peerOpts{InlineSend: 8192})
	tr := fp.transport(Config{Version: Version1, InlineRecv: 512})
	ch := goRoundTrip(fp.ctx, tr, &oncrpc.Call{XID: 1, Head: mkCall(1, procEcho, be32(0)), MaxReplySize: 64})
	pc := fp.accept()
	priv, ok, err := ParsePrivateData(pc.qp.PeerPrivateData())
	if !ok || err != nil {
		t.Fatalf("requester private data: %v %v", ok, err)
	}
	m := pc.recvCall()
	// A reply of exactly the announced receive size, transport header
	// included.
	h := pc.replyHeader(m)
	var e xdr.Encoder
	h.Append(&e)
	pad := priv.InlineRecv - e.Len() - len(rpcReply(m.RPCXID)) - 4
	if pad < 0 {
		t.Fatalf("announced receive size %d", priv.InlineRecv)
	}
	var res xdr.Encoder
	res.Opaque(make([]byte, pad))
	pc.replyWith(m, h, res.Bytes()[:4+pad])
	r := fp.wait(ch)
	if r.err != nil {
		t.Fatalf("a %d-byte reply, the receive size the requester announced: %v", priv.InlineRecv, r.err)
	}
	r.rep.Release()
	if st := tr.Stats(); st.InlineRecv < priv.InlineRecv {
		t.Fatalf("receive buffers of %d bytes, %d announced", st.InlineRecv, priv.InlineRecv)
	}
}
