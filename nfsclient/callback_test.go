package nfsclient

import (
	"bytes"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

func newTestCallbackServer() *callbackServer {
	c := &Client{}
	c.cb = newCallbackServer(c)
	c.cb.setSession(testSession, 2)
	return c.cb
}

// cbCall encodes a CB_COMPOUND call with the given op bodies.
func cbCall(xid uint32, ops ...func(e *xdr.Encoder)) []byte {
	var e xdr.Encoder
	oncrpc.AppendCallHeader(&e, xid, cbProgram, cbVersion, cbProcCompound, oncrpc.AuthNone)
	e.String("tag")
	e.Uint32(1)
	e.Uint32(0)
	e.Uint32(uint32(len(ops)))
	for _, op := range ops {
		op(&e)
	}
	return e.Bytes()
}

func cbSequence(id SessionID, seq, slot uint32) func(e *xdr.Encoder) {
	return func(e *xdr.Encoder) {
		e.Uint32(opCBSequence)
		e.FixedOpaque(id[:])
		e.Uint32(seq)
		e.Uint32(slot)
		e.Uint32(slot)
		e.Bool(false)
		e.Uint32(0)
	}
}

func cbRecall(e *xdr.Encoder) {
	e.Uint32(opCBRecall)
	StateID{Seq: 1, Other: [12]byte{7}}.encode(e)
	e.Bool(false)
	e.Opaque([]byte{1, 2, 3})
}

// cbStatuses decodes a CB_COMPOUND reply into its status and per-op
// (op, status) pairs, skipping the CB_SEQUENCE result body.
func cbStatuses(t *testing.T, reply []byte) (Status, [][2]uint32) {
	t.Helper()
	_, res, err := oncrpc.ParseReply(reply)
	if err != nil {
		t.Fatalf("reply: %v", err)
	}
	d := xdr.NewDecoder(res)
	st := Status(d.Uint32())
	d.Opaque(100)
	n := d.Uint32()
	var out [][2]uint32
	for range n {
		op, s := d.Uint32(), d.Uint32()
		out = append(out, [2]uint32{op, s})
		if op == opCBSequence && s == 0 {
			d.Skip(16 + 16)
		}
	}
	if d.Err() != nil || d.Remaining() != 0 {
		t.Fatalf("reply body: %v, %d bytes left", d.Err(), d.Remaining())
	}
	return st, out
}

func TestCallbackRecallAndReplay(t *testing.T) {
	s := newTestCallbackServer()
	s.addDelegation(StateID{Seq: 1, Other: [12]byte{7}}, []byte{1, 2, 3}, false)
	call := cbCall(1, cbSequence(testSession, 1, 0), cbRecall)
	reply := s.HandleCall(call)
	st, ops := cbStatuses(t, reply)
	if st != StatusOK || len(ops) != 2 || ops[1] != [2]uint32{opCBRecall, 0} {
		t.Fatalf("status %v ops %v", st, ops)
	}
	if s.c.Recalls() != 1 {
		t.Fatalf("recalls = %d", s.c.Recalls())
	}
	// Same slot and sequence again: the cached reply, not a second recall.
	again := s.HandleCall(cbCall(1, cbSequence(testSession, 1, 0), cbRecall))
	if !bytes.Equal(again, reply) || s.c.Recalls() != 1 {
		t.Fatalf("replay was not served from the slot cache (recalls %d)", s.c.Recalls())
	}
	// Skipping a sequence number is misordered.
	st, ops = cbStatuses(t, s.HandleCall(cbCall(2, cbSequence(testSession, 5, 0))))
	if st != ErrSeqMisordered || ops[0][1] != uint32(ErrSeqMisordered) {
		t.Fatalf("misordered: %v %v", st, ops)
	}
}

func TestCallbackErrors(t *testing.T) {
	other := SessionID{9}
	tests := []struct {
		name string
		call []byte
		want Status
		last uint32 // op of the last result
	}{
		{"no CB_SEQUENCE first", cbCall(1, cbRecall), ErrOpNotInSession, opCBRecall},
		{"wrong session", cbCall(1, cbSequence(other, 1, 0)), ErrBadSession, opCBSequence},
		{"bad slot", cbCall(1, cbSequence(testSession, 1, 9)), ErrBadSlot, opCBSequence},
		{"unsupported op", cbCall(1, cbSequence(testSession, 1, 1), func(e *xdr.Encoder) {
			e.Uint32(opCBGetAttr)
		}), ErrNotSupp, opCBGetAttr},
		{"unknown op", cbCall(1, cbSequence(testSession, 1, 1), func(e *xdr.Encoder) {
			e.Uint32(999)
		}), ErrOpIllegal, opCBIllegal},
		{"second CB_SEQUENCE", cbCall(1, cbSequence(testSession, 1, 1), cbSequence(testSession, 2, 1)), ErrSequencePos, opCBSequence},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestCallbackServer()
			st, ops := cbStatuses(t, s.HandleCall(tt.call))
			if st != tt.want || len(ops) == 0 || ops[len(ops)-1][0] != tt.last {
				t.Fatalf("status %v ops %v, want %v on op %d", st, ops, tt.want, tt.last)
			}
		})
	}
}

func TestCallbackRPCLevel(t *testing.T) {
	s := newTestCallbackServer()
	var e xdr.Encoder
	oncrpc.AppendCallHeader(&e, 5, cbProgram, cbVersion, cbProcNull, oncrpc.AuthNone)
	if _, _, err := oncrpc.ParseReply(s.HandleCall(e.Bytes())); err != nil {
		t.Fatalf("CB_NULL: %v", err)
	}
	e.Reset(nil)
	oncrpc.AppendCallHeader(&e, 6, cbProgram, 9, cbProcNull, oncrpc.AuthNone)
	if _, _, err := oncrpc.ParseReply(s.HandleCall(e.Bytes())); err == nil {
		t.Fatal("wrong version accepted")
	}
	// Truncated CB_SEQUENCE arguments: NFS4ERR_BADXDR, not a panic.
	call := cbCall(7, cbSequence(testSession, 1, 0))
	if st, _ := cbStatuses(t, s.HandleCall(call[:len(call)-10])); st != ErrBadXDR {
		t.Fatalf("truncated CB_SEQUENCE: status %v", st)
	}
	// Truncated CB_COMPOUND header: GARBAGE_ARGS.
	if _, _, err := oncrpc.ParseReply(s.HandleCall(call[:44])); err == nil {
		t.Fatal("truncated compound header accepted")
	}
	if s.HandleCall([]byte{1, 2}) != nil {
		t.Fatal("garbage got a reply")
	}
}
