package rpcrdma

import (
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// The backward direction against the fake peer: the peer calls us.

// cbHandler answers backward calls with a reply of size bytes of
// results, after gate (if set) lets it; it counts calls in progress.
type cbHandler struct {
	size    int
	gate    chan struct{}
	running atomic.Int32
	most    atomic.Int32
}

func (h *cbHandler) HandleCall(msg []byte) []byte {
	n := h.running.Add(1)
	defer h.running.Add(-1)
	for {
		m := h.most.Load()
		if n <= m || h.most.CompareAndSwap(m, n) {
			break
		}
	}
	if h.gate != nil {
		<-h.gate
	}
	ch, _, err := oncrpc.ParseCall(msg)
	if err != nil {
		return nil
	}
	var e xdr.Encoder
	oncrpc.AppendAcceptedReply(&e, ch.XID, oncrpc.Success, 0, 0)
	e.Reserve(h.size)
	return e.Bytes()
}

// backwardCall is a backward call from the peer: header h, then an RPC
// call with XID rpcXID.
func backwardCallMsg(h Header, rpcXID uint32) []byte {
	var e xdr.Encoder
	oncrpc.AppendCallHeader(&e, rpcXID, 0x40000000, 1, 1, oncrpc.AuthNone)
	return encodeMsg(h, e.Bytes())
}

// TestBackwardCallHeaders: backward calls are checked as a responder
// checks calls (RFC 8166 s4.5): an unsupported version draws ERR_VERS with
// the range this connection speaks (s4.5.1), chunks or an rdma_xid that
// is not the RPC XID draw ERR_CHUNK (s4.5.2); each RDMA_ERROR echoes the
// call's XID and version and carries our backward credits. A good call is
// answered in its own version (v2 draft s5.3) with the same XID. A
// message that cannot be read as a call is dropped, not answered.
func TestBackwardCallHeaders(t *testing.T) {
	for _, v := range []uint32{Version1, Version2} {
		t.Run(map[uint32]string{1: "v1", 2: "v2"}[v], func(t *testing.T) {
			fp := newFakePeer(t, peerOpts{Credits: 4})
			tr := fp.transport(Config{Version: int(v), XChars: false})
			tr.SetCallHandler(&cbHandler{size: 16})
			pc := warmUp(t, fp, tr)
			slots := uint32(tr.cfg.BackchannelSlots)
			other := Version1 + Version2 - v
			cases := []struct {
				name     string
				msg      []byte
				wantCode uint32 // 0: a reply
			}{
				{"good", backwardCallMsg(Header{XID: 0x51, Vers: v, Credit: 1, Proc: ProcMsg}, 0x51), 0},
				{"version 3", backwardCallMsg(Header{XID: 0x52, Vers: 3, Credit: 1, Proc: ProcMsg}, 0x52), ErrVers},
				{"the other version", backwardCallMsg(Header{XID: 0x53, Vers: other, Credit: 1, Proc: ProcMsg}, 0x53), ErrVers},
				{"XID mismatch", backwardCallMsg(Header{XID: 0x54, Vers: v, Credit: 1, Proc: ProcMsg}, 0x99), ErrChunk},
				{"Write list", backwardCallMsg(Header{XID: 0x55, Vers: v, Credit: 1, Proc: ProcMsg,
					Writes: [][]Segment{{{Handle: 1, Length: 8}}}}, 0x55), ErrChunk},
				{"Reply chunk", backwardCallMsg(Header{XID: 0x56, Vers: v, Credit: 1, Proc: ProcMsg,
					Reply: []Segment{{Handle: 1, Length: 8}}}, 0x56), ErrChunk},
			}
			for _, c := range cases {
				pc.sendRaw(c.msg)
				m := pc.recv()
				if m.HdrErr != nil || m.Hdr.XID != binary.BigEndian.Uint32(c.msg) || m.Hdr.Credit != slots {
					t.Fatalf("%s: answer xid %#x credit %d (%v)", c.name, m.Hdr.XID, m.Hdr.Credit, m.HdrErr)
				}
				if c.wantCode == 0 {
					if m.Hdr.Proc != ProcMsg || m.Hdr.Vers != v || len(m.Payload) < 4 || binary.BigEndian.Uint32(m.Payload) != 0x51 {
						t.Fatalf("%s: answered proc %d vers %d", c.name, m.Hdr.Proc, m.Hdr.Vers)
					}
					continue
				}
				if m.Hdr.Proc != ProcError || m.Hdr.ErrCode != c.wantCode || m.Hdr.Vers != binary.BigEndian.Uint32(c.msg[4:]) {
					t.Fatalf("%s: answered proc %d code %d vers %d; want RDMA_ERROR %d in the call's version", c.name, m.Hdr.Proc, m.Hdr.ErrCode, m.Hdr.Vers, c.wantCode)
				}
				if c.wantCode == ErrVers && (m.Hdr.VersLow != v || m.Hdr.VersHigh != v) {
					t.Fatalf("%s: ERR_VERS %d..%d on a version-%d connection", c.name, m.Hdr.VersLow, m.Hdr.VersHigh, v)
				}
			}
			// Not readable as calls: dropped without an answer
			// (RFC 8166 s4.5 has a requester discard bad replies,
			// and these may be replies). A forward call then
			// shows that nothing was answered in between.
			dropped := tr.Stats().Dropped
			pc.sendRaw(encodeMsg(Header{XID: 0x57, Vers: v, Credit: 1, Proc: ProcNoMsg}))
			pc.sendRaw(encodeMsg(Header{XID: 0x58, Vers: v, Credit: 1, Proc: ProcMsgP}))
			pc.sendRaw(encodeMsg(Header{XID: 0x59, Vers: v, Credit: 1, Proc: ProcError, ErrCode: ErrChunk}))
			ch := goRoundTrip(fp.ctx, tr, smallCall(0x60))
			pc.reply(pc.recvCall(), be32(0))
			if r := fp.wait(ch); r.err != nil {
				t.Fatal(r.err)
			}
			if got := tr.Stats().Dropped - dropped; got != 3 {
				t.Fatalf("%d of 3 unreadable messages dropped", got)
			}
		})
	}
}

// TestBackwardSlots: backward calls beyond the slots we grant are dropped
// (RFC 8167 s4.1: the responder stays within them), so a responder cannot
// make us serve more at once; the forward direction is not affected.
func TestBackwardSlots(t *testing.T) {
	fp := newFakePeer(t, peerOpts{Credits: 4})
	tr := fp.transport(Config{Version: Version1, BackchannelSlots: 2})
	h := &cbHandler{size: 16, gate: make(chan struct{})}
	tr.SetCallHandler(h)
	pc := warmUp(t, fp, tr)
	const calls = 5
	for i := range calls {
		pc.sendRaw(backwardCallMsg(Header{XID: uint32(0x70 + i), Vers: Version1, Credit: 1, Proc: ProcMsg}, uint32(0x70+i)))
	}
	// A forward call goes through while the handler is blocked, and
	// shows that all five backward calls were seen.
	ch := goRoundTrip(fp.ctx, tr, smallCall(0x80))
	pc.reply(pc.recvCall(), be32(0))
	if r := fp.wait(ch); r.err != nil {
		t.Fatal(r.err)
	}
	if st := tr.Stats(); st.BackwardCalls != calls || st.BackwardDropped != calls-2 {
		t.Fatalf("%d backward calls, %d dropped; want %d, %d", st.BackwardCalls, st.BackwardDropped, calls, calls-2)
	}
	// Both slots' calls reach the handler (they were seen, not yet
	// necessarily in it) before it lets them go: a third would show.
	for h.running.Load() < 2 && fp.ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	close(h.gate)
	for range 2 {
		if m := pc.recv(); m.Hdr.Proc != ProcMsg || m.Hdr.XID < 0x70 || m.Hdr.XID > 0x71 {
			t.Fatalf("backward reply xid %#x proc %d", m.Hdr.XID, m.Hdr.Proc)
		}
	}
	if h.most.Load() != 2 {
		t.Fatalf("%d backward calls served at once, slots 2", h.most.Load())
	}
	// The slots are free again once the replies were posted.
	pc.sendRaw(backwardCallMsg(Header{XID: 0x90, Vers: Version1, Credit: 1, Proc: ProcMsg}, 0x90))
	if m := pc.recv(); m.Hdr.XID != 0x90 {
		t.Fatalf("backward reply xid %#x", m.Hdr.XID)
	}
}

// TestBackwardReplyTooLarge: a backward reply we cannot send (larger than
// the responder's inline threshold: backward messages are inline only,
// RFC 8167) closes the connection, so that the responder learns it is
// lost (RFC 8166 s4.5.4); forward calls in flight are retransmitted. The
// refusal is ours: the peer announces 4096-byte receives but posts
// 16 KiB buffers, so an oversize reply sent anyway would arrive (its
// provider would not break the connection for us).
func TestBackwardReplyTooLarge(t *testing.T) {
	fp := newFakePeer(t, peerOpts{Credits: 4, RecvBufSize: 16 << 10})
	tr := fp.transport(Config{Version: Version1})
	tr.SetCallHandler(&cbHandler{size: 5000})
	pc := warmUp(t, fp, tr)
	ch := goRoundTrip(fp.ctx, tr, smallCall(0xa0))
	pc.recvCall()
	pc.sendRaw(backwardCallMsg(Header{XID: 0xa1, Vers: Version1, Credit: 1, Proc: ProcMsg}, 0xa1))
	if m, err := pc.tryRecv(); err == nil {
		t.Fatalf("a %d-byte backward reply was sent beyond the peer's 4096-byte receive threshold", len(m.Raw))
	}
	pc.waitClosed()
	if r := fp.wait(ch); !errors.Is(r.err, oncrpc.ErrConnection) {
		t.Fatalf("forward call returned %v, want a connection error", r.err)
	}
}
