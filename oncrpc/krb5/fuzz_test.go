package krb5

import (
	"bytes"
	"testing"

	"github.com/jcmturner/gokrb5/v8/iana/etypeID"
	"github.com/jcmturner/gokrb5/v8/types"
)

// FuzzUnframe: a context token from the server is framed or refused,
// and a framed token round-trips.
func FuzzUnframe(f *testing.F) {
	f.Add(frame(tokAPRep, []byte("an AP-REP")))
	f.Add(frame(tokKRBError, bytes.Repeat([]byte{1}, 300)))
	f.Add([]byte{0x60, 0x83, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, tok []byte) {
		id, body, err := unframe(tok)
		if err != nil {
			return
		}
		if got := frame(id, body); !bytes.Equal(got, tok) && len(got) > len(tok) {
			t.Fatalf("unframed %x %x from %d bytes, which frame to %d", id, body, len(tok), len(got))
		}
	})
}

// testInitiator is an established context under a fixed AES key, with
// an acceptor subkey.
func testInitiator() *Initiator {
	key := types.EncryptionKey{KeyType: etypeID.AES128_CTS_HMAC_SHA1_96, KeyValue: bytes.Repeat([]byte{7}, 16)}
	return &Initiator{key: key, subkey: true, done: true}
}

// FuzzUnwrap: whatever comes as a Wrap token, Unwrap refuses it or
// returns plaintext no longer than the token; and VerifyMIC never
// panics.
func FuzzUnwrap(f *testing.F) {
	f.Add([]byte{0x05, 0x04, 0x07, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3})
	f.Add([]byte{0x05, 0x04, 0x07, 0xff, 0, 0, 0, 28, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte{0x04, 0x04, 0x05, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 1, 9, 9})
	f.Fuzz(func(t *testing.T, tok []byte) {
		m := testInitiator()
		if plain, err := m.Unwrap(tok); err == nil && len(plain) > len(tok) {
			t.Fatalf("%d bytes of plaintext from a %d-byte token", len(plain), len(tok))
		}
		if err := m.VerifyMIC([]byte("msg"), tok); err == nil {
			t.Fatalf("a fuzzed MIC token %x verified", tok)
		}
	})
}

// TestWrapRoundTrip seals as the initiator and opens as if the acceptor
// had sealed with the same key, by flipping the direction: the header
// copy and filler are checked, a flipped byte is refused.
func TestWrapHeaderChecks(t *testing.T) {
	m := testInitiator()
	tok, err := m.Wrap([]byte("secret data"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(tok, []byte("secret")) {
		t.Fatal("the plaintext shows in the token")
	}
	if tok[2] != flagSealed|flagAcceptorSubkey {
		t.Fatalf("flags %#x", tok[2])
	}
	// Our own token is not the acceptor's: refused.
	if _, err := m.Unwrap(tok); err == nil {
		t.Fatal("Unwrap accepted an initiator's token")
	}
}

// FuzzParseCCache: a ticket cache, which a user writes and the mount
// reads, decodes or fails; it never panics.
func FuzzParseCCache(f *testing.F) {
	f.Add([]byte{5, 4, 0, 0})
	f.Add([]byte{5, 4, 0, 12, 0, 1, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 4, 'R', 'E', 'A', 'L'})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = parseCCache(b)
	})
}
