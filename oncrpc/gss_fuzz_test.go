package oncrpc

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzParseGSSCred: any body either fails cleanly or decodes to a
// credential that encodes back to the same bytes.
func FuzzParseGSSCred(f *testing.F) {
	f.Add(GSSCred{Proc: gssData, Seq: 7, Service: GSSIntegrity, Handle: []byte("handle16bytes...")}.Credential().Body)
	f.Add(GSSCred{Proc: gssInit, Service: GSSNone}.Credential().Body)
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, body []byte) {
		c, err := ParseGSSCred(body)
		if err != nil {
			return
		}
		if len(c.Handle) > maxGSSHandle {
			t.Fatalf("handle of %d bytes accepted", len(c.Handle))
		}
		// The same length and fields (XDR padding may differ: the
		// decoder does not insist on zeros).
		got := c.Credential().Body
		again, err := ParseGSSCred(got)
		if len(got) != len(body) || err != nil || again.Proc != c.Proc || again.Seq != c.Seq || again.Service != c.Service || !bytes.Equal(again.Handle, c.Handle) {
			t.Fatalf("re-encoded %x (%v), parsed from %x", got, err, body)
		}
	})
}

// FuzzParseGSSInitRes: bounded fields or a clean error, never a panic.
func FuzzParseGSSInitRes(f *testing.F) {
	f.Add([]byte{0, 0, 0, 4, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0, 0, 1, 9, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseGSSInitRes(b)
		if err != nil {
			return
		}
		if len(r.handle) > maxGSSHandle || len(r.token) > maxGSSToken || len(r.handle)+len(r.token) > len(b) {
			t.Fatalf("handle %d, token %d bytes from %d", len(r.handle), len(r.token), len(b))
		}
	})
}

// FuzzGSSOpen: whatever a server sends as results and verifier, open
// delivers results only when the mechanism vouched for them.
func FuzzGSSOpen(f *testing.F) {
	f.Add(uint32(FlavorGSS), []byte("mic:1"), []byte{0, 0, 0, 8, 0, 0, 0, 1, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 4, 's', 'u', 'm', '!'}, uint8(GSSIntegrity))
	f.Add(uint32(FlavorGSS), []byte("mic:1"), []byte{0, 0, 0, 8, 0, 0, 0, 1, 1, 2, 3, 4}, uint8(GSSPrivacy))
	f.Add(uint32(FlavorNone), []byte{}, []byte{}, uint8(GSSNone))
	f.Fuzz(func(t *testing.T, flavor uint32, verf, results []byte, svc uint8) {
		g := &GSSContext{mech: stubMech{}, service: GSSService(svc%3 + 1), handle: []byte("h")}
		out, err := g.open(Credential{Flavor: flavor, Body: verf}, results, &gssSent{seqs: []uint32{1}}, gssData)
		if err != nil {
			if !errors.Is(err, errGSSReply) {
				t.Fatalf("error %v does not say the reply was dropped", err)
			}
			return
		}
		if flavor != FlavorGSS || string(verf) != "mic:1" {
			t.Fatalf("results delivered under verifier %d %q", flavor, verf)
		}
		if len(out) > len(results) {
			t.Fatalf("%d bytes of results from %d", len(out), len(results))
		}
	})
}
