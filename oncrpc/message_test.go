package oncrpc

import (
	"encoding/hex"
	"errors"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

func TestParseReply(t *testing.T) {
	tests := []struct {
		name    string
		hex     string
		wantErr error
		results string
	}{
		{"success", "00000001 00000001 00000000 00000000 00000000 00000000 cafebabe", nil, "cafebabe"},
		{"prog mismatch", "00000002 00000001 00000000 00000000 00000000 00000002 00000004 00000004", ErrProgMismatch, ""},
		{"proc unavail", "00000002 00000001 00000000 00000000 00000000 00000003", ErrProcUnavail, ""},
		{"auth error", "00000003 00000001 00000001 00000001 00000005", ErrDenied, ""},
		{"rpc mismatch", "00000003 00000001 00000001 00000000 00000002 00000002", ErrDenied, ""},
		{"a call", "00000003 00000000 00000002", ErrBadReply, ""},
		{"truncated", "00000003 00000001 00000000 00000000", ErrBadReply, ""},
		{"verifier too long", "00000003 00000001 00000000 00000000 00001000", ErrBadReply, ""},
		{"bad reply_stat", "00000003 00000001 00000007", ErrBadReply, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustHex(t, tt.hex)
			_, res, err := ParseReply(b)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err == nil && hex.EncodeToString(res) != tt.results {
				t.Fatalf("results %x, want %s", res, tt.results)
			}
		})
	}
}

func TestCallHeaderGolden(t *testing.T) {
	var e xdr.Encoder
	AppendCallHeader(&e, 0x11223344, 100003, 4, 1, AuthSys{Stamp: 5, MachineName: "ab", UID: 1000, GID: 100, GIDs: []uint32{7}}.Credential())
	want := "11223344 00000000 00000002 000186a3 00000004 00000001" +
		" 00000001 0000001c 00000005 00000002 61620000 000003e8 00000064 00000001 00000007" +
		" 00000000 00000000"
	if got := hex.EncodeToString(e.Bytes()); got != string(mustHexString(want)) {
		t.Fatalf("got  %s\nwant %s", got, mustHexString(want))
	}
	h, args, err := ParseCall(e.Bytes())
	if err != nil || h.XID != 0x11223344 || h.Prog != 100003 || len(args) != 0 {
		t.Fatalf("ParseCall: %+v %v", h, err)
	}
	a, err := ParseAuthSys(h.Cred.Body)
	if err != nil || a.UID != 1000 || a.GID != 100 || len(a.GIDs) != 1 || a.MachineName != "ab" {
		t.Fatalf("ParseAuthSys: %+v %v", a, err)
	}
}

func mustHexString(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != ' ' {
			out = append(out, s[i])
		}
	}
	return string(out)
}

func mustHex(t testing.TB, s string) []byte {
	b, err := hex.DecodeString(mustHexString(s))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
