package krb5

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jcmturner/gokrb5/v8/crypto"
	"github.com/jcmturner/gokrb5/v8/iana/keyusage"
	"github.com/jcmturner/gokrb5/v8/types"
)

// Wrap tokens with confidentiality (RFC 4121 s4.2.4, s4.2.6.2): a
// 16-byte header (TOK_ID 05 04, flags, a filler byte, EC, RRC, the
// sequence number), then the encryption of the plaintext, EC filler
// bytes and a copy of the header whose RRC is zero. This side writes EC
// and RRC as zero; the acceptor's tokens may rotate the ciphertext by
// RRC bytes, which is undone.

const wrapHeaderLen = 16

var tokWrap = []byte{0x05, 0x04}

// Wrap seals msg in a Wrap token.
func (m *Initiator) Wrap(msg []byte) ([]byte, error) {
	key, fl, seq, err := m.next()
	if err != nil {
		return nil, err
	}
	hdr := make([]byte, wrapHeaderLen)
	copy(hdr, tokWrap)
	hdr[2] = fl | flagSealed
	hdr[3] = 0xff
	binary.BigEndian.PutUint64(hdr[8:], seq)
	et, err := crypto.GetEtype(key.KeyType)
	if err != nil {
		return nil, fmt.Errorf("krb5: wrap: %w", err)
	}
	plain := make([]byte, 0, len(msg)+wrapHeaderLen)
	plain = append(append(plain, msg...), hdr...)
	_, sealed, err := et.EncryptMessage(key.KeyValue, plain, keyusage.GSSAPI_INITIATOR_SEAL)
	if err != nil {
		return nil, fmt.Errorf("krb5: wrap: %w", err)
	}
	return append(hdr, sealed...), nil
}

// Unwrap opens a sealed Wrap token from the acceptor and returns the
// plaintext. A token that is not sealed, is under another key, or whose
// encrypted header copy differs is refused.
func (m *Initiator) Unwrap(tok []byte) ([]byte, error) {
	key, fl, err := m.peer()
	if err != nil {
		return nil, err
	}
	if len(tok) < wrapHeaderLen || tok[0] != tokWrap[0] || tok[1] != tokWrap[1] || tok[3] != 0xff {
		return nil, errors.New("krb5: not a Wrap token")
	}
	hdr := tok[:wrapHeaderLen]
	switch {
	case hdr[2]&flagSealed == 0:
		return nil, errors.New("krb5: a Wrap token without confidentiality where sealing was asked")
	case hdr[2]&(flagSentByAcceptor|flagAcceptorSubkey) != fl:
		return nil, errors.New("krb5: a Wrap token not from the acceptor, or under another key")
	}
	ec := int(binary.BigEndian.Uint16(hdr[4:6]))
	rrc := int(binary.BigEndian.Uint16(hdr[6:8]))
	sealed := tok[wrapHeaderLen:]
	if len(sealed) > 0 && rrc > 0 {
		// RFC 4121 s4.2.5: the last RRC bytes were rotated to the front.
		r := rrc % len(sealed)
		sealed = append(append([]byte(nil), sealed[r:]...), sealed[:r]...)
	}
	plain, err := decrypt(sealed, key, keyusage.GSSAPI_ACCEPTOR_SEAL)
	if err != nil {
		return nil, fmt.Errorf("krb5: unwrap: %w", err)
	}
	if len(plain) < ec+wrapHeaderLen {
		return nil, errors.New("krb5: unwrap: too short for its filler and header")
	}
	inner := plain[len(plain)-wrapHeaderLen:]
	want := append([]byte(nil), hdr...)
	want[6], want[7] = 0, 0 // the encrypted copy's RRC is zero
	if !equalHeader(inner, want) {
		return nil, errors.New("krb5: unwrap: the encrypted header differs from the token's")
	}
	return plain[:len(plain)-wrapHeaderLen-ec], nil
}

// decrypt is crypto.DecryptMessage for ciphertext from the network:
// gokrb5 slices it without checking that it holds a confounder and a
// checksum (a short one panics), so that is checked first, and a panic
// it still raises becomes an error.
func decrypt(ciphertext []byte, key types.EncryptionKey, usage uint32) (plain []byte, err error) {
	et, err := crypto.GetEtype(key.KeyType)
	if err != nil {
		return nil, err
	}
	if min := et.GetConfounderByteSize() + et.GetHMACBitLength()/8; len(ciphertext) < min {
		return nil, fmt.Errorf("ciphertext of %d bytes, shorter than its confounder and checksum (%d)", len(ciphertext), min)
	}
	defer func() {
		if r := recover(); r != nil {
			plain, err = nil, fmt.Errorf("malformed ciphertext: %v", r)
		}
	}()
	return crypto.DecryptMessage(ciphertext, key, usage)
}
