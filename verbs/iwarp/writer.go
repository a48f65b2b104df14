package iwarp

import (
	"encoding/binary"
	"hash/crc32"
	"net"
	"sync"
)

// castagnoli is the CRC32c table of MPA (RFC 5044 s4.4). Read-only.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var zeroPad [4]byte

// fpduWriter frames ULPDUs into MPA FPDUs (RFC 5044 s4.1: length, ULPDU,
// pad to 4 bytes, CRC) and writes each FPDU with one vectored write. The
// mutex keeps FPDUs of different senders from interleaving.
type fpduWriter struct {
	mu   sync.Mutex
	conn net.Conn
	crc  bool
	hdr  [2 + untaggedHdrLen + readReqLen + 64]byte
	trl  [8]byte
	vec  [][]byte
	bufs net.Buffers
}

// write sends one FPDU whose ULPDU is hdr followed by the payload pieces.
// The caller keeps the ULPDU within 65535 bytes.
func (w *fpduWriter) write(hdr []byte, pieces ...[]byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writeLocked(hdr, pieces)
}

func (w *fpduWriter) writeLocked(hdr []byte, pieces [][]byte) error {
	ulen := len(hdr)
	for _, p := range pieces {
		ulen += len(p)
	}
	binary.BigEndian.PutUint16(w.hdr[:], uint16(ulen))
	n := 2 + copy(w.hdr[2:], hdr)
	pad := -(2 + ulen) & 3
	w.vec = append(w.vec[:0], w.hdr[:n])
	w.vec = append(w.vec, pieces...)
	// RFC 5044 s4.4: CRC32c over length, ULPDU and pad; the value goes
	// on the wire least significant byte first (as Linux siw does).
	// Without CRC the field is present and zero.
	var c uint32
	if w.crc {
		c = crc32.Update(0, castagnoli, w.hdr[:n])
		for _, p := range pieces {
			c = crc32.Update(c, castagnoli, p)
		}
		c = crc32.Update(c, castagnoli, zeroPad[:pad])
	}
	copy(w.trl[:], zeroPad[:])
	binary.LittleEndian.PutUint32(w.trl[pad:], c)
	w.vec = append(w.vec, w.trl[:pad+4])
	w.bufs = w.vec
	_, err := w.bufs.WriteTo(w.conn)
	return err
}
