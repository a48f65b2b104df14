package rpcrdma

import (
	"encoding/hex"
	"reflect"
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
// decodes re-encodes to a header that decodes the same (byte equality
// would fail only on non-zero XDR padding, which the decoder tolerates).
func FuzzHeader(f *testing.F) {
	f.Add(unhex(f, "00000001 00000001 00000020 00000000 00000000 00000000 00000000"), false)
	f.Add(unhex(f, "00000001 00000001 00000020 00000000 00000001 000000b0 00000100 00001000 0000000000000000 00000000 00000001 00000001 00000200 00001001 0000000000000000 00000000 00000001 00000001 00000300 00010000 0000000000000000"), false)
	f.Add(unhex(f, "00000001 00000002 00000020 00000004 00000001 00000001 00000001"), false)
	f.Add(unhex(f, "00000001 00000001 00000020 00000004 00000002"), false)
	f.Add(unhex(f, "00000001 00000002 00000020 00000005 00000001 00000004 00000001 00000002"), true)
	rich := unhex(f, "00000001 00000001 00000020 00000000 00000001 000000b0 00000100 00001000 0000000000000000 00000000 00000001 00000001 00000200 00001001 0000000000000000 00000000 00000001 00000001 00000300 00010000 0000000000000000")
	f.Fuzz(func(t *testing.T, msg []byte, v2 bool) {
		var h Header
		n, err := h.Decode(msg, v2)
		// Decoding into a Header that held lists before (their arrays
		// are reused) gives the same.
		var reused Header
		if _, err := reused.Decode(rich, false); err != nil {
			t.Fatal(err)
		}
		nr, errR := reused.Decode(msg, v2)
		if (err == nil) != (errR == nil) || err == nil && (nr != n || !reflect.DeepEqual(normalize(h), normalize(reused)) || (h.Reply == nil) != (reused.Reply == nil)) {
			t.Fatalf("a reused Header decodes %x differently: %+v (%v), a new one %+v (%v)", msg, reused, errR, h, err)
		}
		if err != nil {
			return
		}
		if n > len(msg) {
			t.Fatalf("header length %d > message %d", n, len(msg))
		}
		var e xdr.Encoder
		h.Append(&e)
		var h2 Header
		n2, err := h2.Decode(e.Bytes(), v2)
		if err != nil || n2 != n || !reflect.DeepEqual(normalize(h), normalize(h2)) {
			t.Fatalf("re-encoding differs (err %v):\n in %x\nout %x", err, msg[:n], e.Bytes())
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

// normalize makes empty and nil slices compare equal.
func normalize(h Header) Header {
	if len(h.Reads) == 0 {
		h.Reads = nil
	}
	if len(h.Writes) == 0 {
		h.Writes = nil
	}
	for i, w := range h.Writes {
		if len(w) == 0 {
			h.Writes[i] = nil
		}
	}
	if h.Reply != nil && len(h.Reply) == 0 {
		h.Reply = []Segment{}
	}
	if len(h.OptInfo) == 0 {
		h.OptInfo = nil
	}
	return h
}

// FuzzOptional decodes arbitrary RDMA_OPTIONAL optinfo with every
// characteristics decoder and applies what decodes: no panic, no read
// past the optinfo, and values in range.
func FuzzOptional(f *testing.F) {
	f.Add(uint32(OptInitXch), InitXch{Start: DefaultChars.Spec(), NoChg: Subset{7}}.Marshal())
	f.Add(uint32(OptReqXch), ReqXch{Want: []XCharVal{Uint32Val(XCharRBSize, 8192)}}.Marshal())
	f.Add(uint32(OptRespXch), RespXch{Done: Subset{1}, Rej: Subset{2}, Pend: Subset{4}}.Marshal())
	f.Add(uint32(OptUpdXch), UpdXch{Now: Uint32Val(XCharRBSize, 8192), PendClr: true}.Marshal())
	f.Add(uint32(OptInitXch), []byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, opt uint32, info []byte) {
		var e xdr.Encoder
		(&Header{XID: 1, Vers: 2, Proc: ProcOptional, OptType: opt, OptInfo: info}).Append(&e)
		var h Header
		if _, err := h.Decode(e.Bytes(), true); err != nil {
			t.Fatalf("own RDMA_OPTIONAL does not decode: %v", err)
		}
		c := DefaultChars
		check := func() {
			if c.RBSize < minRBSize || c.RBSize > maxRBSize || c.BRS > BRSGenl {
				t.Fatalf("characteristics out of range: %+v", c)
			}
		}
		switch opt % 4 {
		case 0:
			if m, err := ParseInitXch(h.OptInfo); err == nil {
				c.applySpec(m.Start)
				m.NoChg.Has(int(opt % 300))
			}
		case 1:
			if m, err := ParseReqXch(h.OptInfo); err == nil {
				c.applySpec(m.Want)
			}
		case 2:
			if m, err := ParseRespXch(h.OptInfo); err == nil {
				m.Done.Has(40)
				m.Rej.Has(0)
			}
		case 3:
			if m, err := ParseUpdXch(h.OptInfo); err == nil {
				c.apply(m.Now)
			}
		}
		check()
	})
}
