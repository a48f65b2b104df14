package rpcrdma

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

func unhex(tb testing.TB, s string) []byte {
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// FuzzHeader decodes arbitrary transport headers: no panic, and whatever
// decodes re-encodes to the same bytes.
func FuzzHeader(f *testing.F) {
	f.Add(unhex(f, "00000001 00000001 00000020 00000000 00000000 00000000 00000000"), false)
	f.Add(unhex(f, "00000001 00000001 00000020 00000000 00000001 000000b0 00000100 00001000 0000000000000000 00000000 00000001 00000001 00000200 00001001 0000000000000000 00000000 00000001 00000001 00000300 00010000 0000000000000000"), false)
	f.Add(unhex(f, "00000001 00000002 00000020 00000004 00000001 00000001 00000001"), false)
	f.Add(unhex(f, "00000001 00000001 00000020 00000004 00000002"), false)
	f.Add(unhex(f, "00000001 00000002 00000020 00000005 00000001 00000004 00000001 00000002"), true)
	f.Fuzz(func(t *testing.T, msg []byte, v2 bool) {
		var h Header
		n, err := h.Decode(msg, v2)
		if err != nil {
			return
		}
		if n > len(msg) {
			t.Fatalf("header length %d > message %d", n, len(msg))
		}
		var e xdr.Encoder
		h.Append(&e)
		if string(e.Bytes()) != string(msg[:n]) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", msg[:n], e.Bytes())
		}
	})
}

// FuzzPrivateData parses arbitrary RFC 8797 private data.
func FuzzPrivateData(f *testing.F) {
	f.Add(PrivateData{Version: 1, InlineSend: 4096, InlineRecv: 4096}.Marshal())
	f.Add([]byte{0xf6, 0xab, 0x0e, 0x18, 2, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, ok, err := ParsePrivateData(b)
		if err == nil && ok && (p.InlineSend < 1024 || p.InlineRecv < 1024) {
			t.Fatalf("inline sizes %d/%d below 1024", p.InlineSend, p.InlineRecv)
		}
	})
}
