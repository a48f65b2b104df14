package nfsclient

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// TestBackChannelLimits: the transport's limits are the back channel's
// as the server accepted them, never above what the client offered.
func TestBackChannelLimits(t *testing.T) {
	for _, tc := range []struct {
		back        channelAttrs4
		calls, size int
	}{
		{channelAttrs4{maxrequests: 2, maxrequestsize: 1024}, 2, 1024},
		{channelAttrs4{maxrequests: cbSlots, maxrequestsize: cbMaxRequestSize}, cbSlots, cbMaxRequestSize},
		{channelAttrs4{maxrequests: 1 << 30, maxrequestsize: 1 << 30}, 64, cbMaxRequestSize},
		{channelAttrs4{}, 1, cbMaxRequestSize},
	} {
		calls, size := backChannelLimits(tc.back)
		if calls != tc.calls || size != tc.size {
			t.Errorf("backChannelLimits(%+v) = %d, %d; want %d, %d", tc.back, calls, size, tc.calls, tc.size)
		}
	}
}

// TestCallbackTooBigOverTCP: a CB_COMPOUND larger than the back
// channel's ca_maxrequestsize, sent by a fault peer on a real TCP
// transport, is answered NFS4ERR_REQ_TOO_BIG at its CB_SEQUENCE (RFC 8881
// s18.36.3) without being run, and leaves the slot as it was.
func TestCallbackTooBigOverTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if nc, err := ln.Accept(); err == nil {
			accepted <- nc
		}
	}()
	s := newTestCallbackServer()
	s.addDelegation(StateID{Seq: 1, Other: [12]byte{7}}, []byte{1, 2, 3}, false)
	tr := oncrpc.NewTCPTransport(ln.Addr().String(), oncrpc.TCPOptions{})
	defer tr.Close()
	tr.SetCallHandler(s)
	tr.SetBackwardLimits(backChannelLimits(channelAttrs4{maxrequests: 2, maxrequestsize: 1024}))
	if err := tr.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	var nc net.Conn
	select {
	case nc = <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("no connection")
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))

	ops := []func(*xdr.Encoder){cbSequence(testSession, 1, 0)}
	for range 100 {
		ops = append(ops, cbRecall)
	}
	big := cbCall(1, ops...)
	if len(big) <= 1024 {
		t.Fatalf("test call of %d bytes is not too big", len(big))
	}
	st, res := cbStatuses(t, roundTripRecord(t, nc, big))
	if st != ErrReqTooBig || len(res) != 1 || res[0] != [2]uint32{opCBSequence, uint32(ErrReqTooBig)} {
		t.Fatalf("too big a call: status %v results %v, want NFS4ERR_REQ_TOO_BIG at CB_SEQUENCE", st, res)
	}
	if n := s.c.Recalls(); n != 0 {
		t.Fatalf("%d recalls run from a call too big", n)
	}
	// The slot did not move: sequence 1 is still the next.
	st, res = cbStatuses(t, roundTripRecord(t, nc, cbCall(2, cbSequence(testSession, 1, 0), cbRecall)))
	if st != StatusOK || len(res) != 2 {
		t.Fatalf("call after: status %v results %v", st, res)
	}
}

// roundTripRecord sends msg as one record on nc and reads one record back.
func roundTripRecord(t *testing.T, nc net.Conn, msg []byte) []byte {
	t.Helper()
	rec := binary.BigEndian.AppendUint32(nil, uint32(len(msg))|1<<31)
	if _, err := nc.Write(append(rec, msg...)); err != nil {
		t.Fatal(err)
	}
	var hdr [4]byte
	if _, err := io.ReadFull(nc, hdr[:]); err != nil {
		t.Fatal(err)
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n&(1<<31) == 0 || n&^(1<<31) > 1<<20 {
		t.Fatalf("reply record mark %#x", n)
	}
	reply := make([]byte, n&^(1<<31))
	if _, err := io.ReadFull(nc, reply); err != nil {
		t.Fatal(err)
	}
	return reply
}

// FuzzCallbackTooBig feeds arbitrary call heads to HandleTooBig: it never
// panics, answers only a CB_COMPOUND, and then with its XID, the
// request's tag and NFS4ERR_REQ_TOO_BIG at CB_SEQUENCE; the slot table
// stays as it was.
func FuzzCallbackTooBig(f *testing.F) {
	f.Add(cbCall(1, cbSequence(testSession, 1, 0), cbRecall))
	f.Add(cbCall(2, cbRecall))
	f.Add(cbCall(3))
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, head []byte) {
		s := newTestCallbackServer()
		reply := s.HandleTooBig(head, len(head)+1)
		if reply == nil {
			return
		}
		h, args, err := oncrpc.ParseCall(head)
		if err != nil || h.Prog != cbProgram || h.Proc != cbProcCompound {
			t.Fatalf("answered a call that is no CB_COMPOUND (%v)", err)
		}
		xid, _, err := oncrpc.ParseReply(reply)
		if err != nil || xid != h.XID {
			t.Fatalf("reply to xid %#x: %v, for call %#x", xid, err, h.XID)
		}
		st, res := cbStatuses(t, reply)
		if st != ErrReqTooBig || len(res) != 1 || res[0] != [2]uint32{opCBSequence, uint32(ErrReqTooBig)} {
			t.Fatalf("status %v results %v", st, res)
		}
		tag := xdr.NewDecoder(args).Opaque(maxTagLen)
		_, rres, _ := oncrpc.ParseReply(reply)
		d := xdr.NewDecoder(rres)
		d.Uint32()
		if got := d.Opaque(maxTagLen); string(got) != string(tag) {
			t.Fatalf("tag %q, want %q", got, tag)
		}
		for i, sl := range s.slots {
			if sl.seq != 0 || sl.reply != nil {
				t.Fatalf("slot %d changed: %+v", i, sl)
			}
		}
	})
}
