package rpcrdma

import (
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

func TestHeaderGolden(t *testing.T) {
	tests := []struct {
		name string
		h    Header
		hex  string
	}{
		// RFC 8166 s4.3: three empty lists make a 28-byte header.
		{"NULL call", Header{XID: 1, Vers: 1, Credit: 32, Proc: ProcMsg},
			"00000001 00000001 00000020 00000000 00000000 00000000 00000000"},
		{"WRITE with a read chunk and a write chunk", Header{XID: 2, Vers: 1, Credit: 1, Proc: ProcMsg,
			Reads:  []ReadSegment{{Position: 176, Segment: Segment{Handle: 0x100, Length: 4096, Offset: 8}}},
			Writes: [][]Segment{{{Handle: 0x200, Length: 1001}}}},
			"00000002 00000001 00000001 00000000" +
				" 00000001 000000b0 00000100 00001000 0000000000000008 00000000" +
				" 00000001 00000001 00000200 000003e9 0000000000000000 00000000" +
				" 00000000"},
		{"NOMSG with reply chunk", Header{XID: 3, Vers: 1, Credit: 64, Proc: ProcNoMsg, Reply: []Segment{{Handle: 7, Length: 8192}}},
			"00000003 00000001 00000040 00000001 00000000 00000000 00000001 00000001 00000007 00002000 0000000000000000"},
		{"ERR_VERS", Header{XID: 4, Vers: 2, Credit: 0, Proc: ProcError, ErrCode: ErrVers, VersLow: 1, VersHigh: 1},
			"00000004 00000002 00000000 00000004 00000001 00000001 00000001"},
		{"ERR_CHUNK", Header{XID: 5, Vers: 1, Proc: ProcError, ErrCode: ErrChunk},
			"00000005 00000001 00000000 00000004 00000002"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var e xdr.Encoder
			tt.h.Append(&e)
			want := strings.Join(strings.Fields(tt.hex), "")
			if got := hex.EncodeToString(e.Bytes()); got != want {
				t.Fatalf("encode\n got %s\nwant %s", got, want)
			}
			var h Header
			n, err := h.Decode(e.Bytes(), false)
			if err != nil || n != e.Len() {
				t.Fatalf("decode: n=%d err=%v", n, err)
			}
			if h.XID != tt.h.XID || h.Proc != tt.h.Proc || len(h.Reads) != len(tt.h.Reads) || len(h.Writes) != len(tt.h.Writes) {
				t.Fatalf("decoded %+v", h)
			}
		})
	}
}

func TestHeaderRejects(t *testing.T) {
	tests := []struct{ name, hex string }{
		{"RDMA_MSGP", "00000001 00000001 00000001 00000002 00000000 00000000"},
		{"RDMA_DONE", "00000001 00000001 00000001 00000003"},
		{"unknown proc", "00000001 00000001 00000001 00000007"},
		{"RDMA_OPTIONAL in v1", "00000001 00000001 00000001 00000005 00000001 00000000"},
		{"truncated read list", "00000001 00000001 00000001 00000000 00000001 000000b0"},
		{"too many segments", "00000001 00000001 00000001 00000000 00000000 00000001 00010000"},
		{"bad presence word", "00000001 00000001 00000001 00000000 00000002"},
		{"unknown error code", "00000001 00000001 00000001 00000004 00000009"},
		{"short", "000000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h Header
			if _, err := h.Decode(unhex(t, tt.hex), false); !errors.Is(err, ErrBadHeader) {
				t.Fatalf("err = %v, want ErrBadHeader", err)
			}
		})
	}
}

func TestPrivateData(t *testing.T) {
	// RFC 8797 s5.1: magic, version 1, flags, sizes as size/1024 - 1.
	b := PrivateData{Version: 1, RemoteInvalidate: true, InlineSend: 4096, InlineRecv: 8192}.Marshal()
	if got := hex.EncodeToString(b); got != "f6ab0e1801010307" {
		t.Fatalf("private data %s", got)
	}
	p, ok, err := ParsePrivateData(b)
	if !ok || err != nil || p.InlineSend != 4096 || p.InlineRecv != 8192 || !p.RemoteInvalidate {
		t.Fatalf("parse: %+v %v %v", p, ok, err)
	}
	// No private data: RFC 8166 s3.3.3 defaults.
	p, ok, _ = ParsePrivateData(nil)
	if ok || p.InlineSend != 1024 || p.InlineRecv != 1024 {
		t.Fatalf("defaults: %+v %v", p, ok)
	}
	if _, _, err := ParsePrivateData([]byte{0xf6, 0xab, 0x0e, 0x18, 9, 0, 0, 0}); err == nil {
		t.Fatal("unknown version accepted")
	}
}

// TestHeaderDecodeReuse decodes messages one after another into the same
// Header, as the requester's receive path does: each decodes as into a
// new Header (a Reply chunk present with no segments stays present, an
// absent one nil), and a message shaped as the one before allocates
// nothing.
func TestHeaderDecodeReuse(t *testing.T) {
	msgs := []Header{
		{XID: 1, Vers: 1, Credit: 8, Proc: ProcMsg, Writes: [][]Segment{{{Handle: 1, Length: 10}, {Handle: 2, Length: 20}}, {{Handle: 3, Length: 30}}},
			Reply: []Segment{{Handle: 4, Length: 40}, {Handle: 5, Length: 50}}},
		{XID: 2, Vers: 1, Credit: 8, Proc: ProcMsg, Writes: [][]Segment{{{Handle: 6, Length: 60}}}},
		{XID: 3, Vers: 1, Credit: 8, Proc: ProcNoMsg, Reply: []Segment{}},
		{XID: 4, Vers: 1, Credit: 8, Proc: ProcMsg, Writes: [][]Segment{{}, {{Handle: 7, Length: 70}, {Handle: 8, Length: 80}, {Handle: 9, Length: 90}}}},
		{XID: 5, Vers: 1, Credit: 8, Proc: ProcError, ErrCode: ErrChunk},
	}
	var encoded [][]byte
	for _, m := range msgs {
		var e xdr.Encoder
		m.Append(&e)
		encoded = append(encoded, e.Bytes())
	}
	var reused Header
	for round := range 2 {
		for i, msg := range encoded {
			var fresh Header
			n1, err1 := fresh.Decode(msg, false)
			n2, err2 := reused.Decode(msg, false)
			if err1 != nil || err2 != nil || n1 != n2 || !reflect.DeepEqual(normalize(fresh), normalize(reused)) {
				t.Fatalf("round %d, message %d: reused Header decodes %+v (%v), a new one %+v (%v)", round, i, reused, err2, fresh, err1)
			}
			if (fresh.Reply == nil) != (reused.Reply == nil) {
				t.Fatalf("round %d, message %d: Reply chunk present %v in a reused Header, %v in a new one", round, i, reused.Reply != nil, fresh.Reply != nil)
			}
		}
	}
	// A message shaped as the last one decoded (a READ reply after a
	// READ reply) reuses every list.
	for i, msg := range encoded {
		if _, err := reused.Decode(msg, false); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(100, func() {
			if _, err := reused.Decode(msg, false); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("message %d decoded again into the same Header: %v allocations, want 0", i, allocs)
		}
	}
}
