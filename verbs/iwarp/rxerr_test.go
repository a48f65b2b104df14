package iwarp

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/verbs"
)

// rxOnly builds a queue pair with no connection whose receive path reads
// stream; one receive buffer is posted and one region (STag 0x100) has
// remote access.
func rxOnly(t *testing.T, stream []byte, crc bool) (*QP, *verbs.MemoryRegion) {
	t.Helper()
	pd := NewProtectionDomain()
	mr, _ := pd.RegisterMemory(make([]byte, 64), verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	q := &QP{br: bufio.NewReader(bytes.NewReader(stream)), pd: TableOf(pd), crc: crc, ird: 1,
		scq: verbs.NewSoftCQ(), rcq: verbs.NewSoftCQ(), irq: make(chan readRequest, 1)}
	q.cond.L = &q.mu
	q.rq.push(recvEntry{wrid: 1, buf: make([]byte, 64)})
	return q, mr
}

// TestReceiveProtocolErrors feeds hand-made FPDUs (bytes on the wire) to
// the receive path and checks the Terminate it would send (RFC 5040 s7).
func TestReceiveProtocolErrors(t *testing.T) {
	tests := []struct {
		name               string
		crc                bool
		wire               string
		layer, etype, code byte
	}{
		// len 0x0014: ctl 41 (untagged, last, DDP v1) rdmap 43 (v1 Send),
		// rsvd, QN 0, MSN 2 (expected 1), MO 0, "hi", pad, CRC 0.
		{"Send MSN out of range", false, "0014 4143 00000000 00000000 00000002 00000000 6869 0000 00000000",
			LayerDDP, DDPEtypeUntaggedBuf, DDPCodeUMSNRange},
		{"Send on QN 1", false, "0012 4143 00000000 00000001 00000001 00000000 00000000",
			LayerDDP, DDPEtypeUntaggedBuf, DDPCodeUInvalidQN},
		{"QN 7", false, "0012 4143 00000000 00000007 00000001 00000000 00000000",
			LayerDDP, DDPEtypeUntaggedBuf, DDPCodeUInvalidQN},
		{"untagged DDP version 0", false, "0012 4043 00000000 00000000 00000001 00000000 00000000",
			LayerDDP, DDPEtypeUntaggedBuf, DDPCodeUVersion},
		{"tagged DDP version 2", false, "000e c200 00000100 0000000000000000 00000000",
			LayerDDP, DDPEtypeTaggedBuf, DDPCodeTVersion},
		{"RDMAP version 0", false, "0012 4103 00000000 00000000 00000001 00000000 00000000",
			LayerRDMAP, RDMAPEtypeRemoteOperation, RDMAPCodeInvalidVersion},
		{"untagged opcode 8", false, "0012 4148 00000000 00000000 00000001 00000000 00000000",
			LayerRDMAP, RDMAPEtypeRemoteOperation, RDMAPCodeUnexpectedOpcode},
		{"tagged Send", false, "000e c143 00000100 0000000000000000 00000000",
			LayerRDMAP, RDMAPEtypeRemoteOperation, RDMAPCodeUnexpectedOpcode},
		{"Read Response without request", false, "0010 c142 00000100 0000000000000000 abcd 00000000",
			LayerRDMAP, RDMAPEtypeRemoteOperation, RDMAPCodeUnexpectedOpcode},
		{"Write beyond region", false, "0010 c140 00000100 000000000000003f abcd 00000000",
			LayerDDP, DDPEtypeTaggedBuf, DDPCodeTBaseBounds},
		{"Write to unknown STag", false, "0010 c140 00000200 0000000000000000 abcd 00000000",
			LayerDDP, DDPEtypeTaggedBuf, DDPCodeTInvalidSTag},
		{"Send With Invalidate of unknown STag", false, "0012 4144 00000999 00000000 00000001 00000000 00000000",
			LayerRDMAP, RDMAPEtypeRemoteProtection, RDMAPCodeCannotInvalidate},
		{"Read Request of 27 bytes", false, "002d 4141 00000000 00000001 00000001 00000000" + "000000000000000000000000000000000000000000000000000000" + "00 00000000",
			LayerDDP, DDPEtypeUntaggedBuf, DDPCodeUTooLong},
		{"ULPDU shorter than header", false, "0004 4143 0000 00000000",
			LayerDDP, DDPEtypeCatastrophic, 0},
		{"CRC mismatch", true, "0012 4143 00000000 00000000 00000001 00000000 12345678",
			LayerLLP, LLPEtypeMPA, LLPCodeCRC},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, _ := rxOnly(t, unhex(t, tt.wire), tt.crc)
			err := q.receive(&rxState{sendMSN: 1, readMSN: 1})
			var f *rxFault
			if !errors.As(err, &f) {
				t.Fatalf("receive: %v, want a protocol fault", err)
			}
			if f.t.Layer != tt.layer || f.t.EType != tt.etype || f.t.Code != tt.code {
				t.Fatalf("terminate %v (%v), want layer %d etype %d code %#x", &f.t, f.cause, tt.layer, tt.etype, tt.code)
			}
		})
	}
}

// TestReceiveGood: a valid Send, Write and Send With Invalidate on the
// wire, with CRC (the CRC of the first FPDU was computed independently
// with tools/mpaprobe.py's crc32c).
func TestReceiveGood(t *testing.T) {
	var h [untaggedHdrLen]byte
	n := putUntagged(h[:], true, opSend, 0, qnSend, 1, 0)
	stream := frameCRC(append(h[:n:n], "hi"...))
	n = putTagged(h[:], true, opWrite, 0x100, 4)
	stream = append(stream, frameCRC(append(h[:n:n], "data"...))...)
	q, mr := rxOnly(t, stream, true)
	if err := q.receive(&rxState{sendMSN: 1, readMSN: 1}); err == nil || errors.As(err, new(*rxFault)) {
		t.Fatalf("receive: %v, want end of stream", err)
	}
	if c := q.rcq.Len(); c != 1 || string(mr.Bytes()[4:8]) != "data" {
		t.Fatalf("%d completions, region %q", c, mr.Bytes()[:8])
	}
}

// frameCRC frames a ULPDU as an FPDU with CRC, computing the CRC32c with
// a bitwise implementation independent of hash/crc32 (the polynomial
// 0x82F63B78, as tools/mpaprobe.py does) and appending it least
// significant byte first (RFC 5044 s4.4, as Linux siw sends it).
func frameCRC(ulpdu []byte) []byte {
	b := append([]byte{byte(len(ulpdu) >> 8), byte(len(ulpdu))}, ulpdu...)
	b = append(b, make([]byte, -len(b)&3)...)
	c := crc32cBitwise(b)
	return append(b, byte(c), byte(c>>8), byte(c>>16), byte(c>>24))
}

func crc32cBitwise(b []byte) uint32 {
	c := ^uint32(0)
	for _, x := range b {
		c ^= uint32(x)
		for range 8 {
			if c&1 != 0 {
				c = c>>1 ^ 0x82F63B78
			} else {
				c >>= 1
			}
		}
	}
	return ^c
}

// TestCRC32cGolden pins the CRC: the standard check value of CRC32c and
// the trailer of a zero-length Send FPDU as it appears on the wire.
func TestCRC32cGolden(t *testing.T) {
	if c := crc32cBitwise([]byte("123456789")); c != 0xe3069283 {
		t.Fatalf("crc32c check value %#x", c)
	}
	var h [untaggedHdrLen]byte
	putUntagged(h[:], true, opSend, 0, qnSend, 1, 0)
	got := frameCRC(h[:])
	var buf bytes.Buffer
	w := &fpduWriter{crc: true, conn: writerConn{&buf}}
	if err := w.write(h[:]); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), got) {
		t.Fatalf("writer %x, independent %x", buf.Bytes(), got)
	}
	if want := unhex(t, "0012 4143 00000000 00000000 00000001 00000000"); !bytes.Equal(got[:20], want) {
		t.Fatalf("FPDU %x", got)
	}
}

// writerConn is a net.Conn that only writes to an io.Writer.
type writerConn struct{ w io.Writer }

func (c writerConn) Write(b []byte) (int, error) { return c.w.Write(b) }

// The remaining methods satisfy net.Conn and are unused.
func (writerConn) Read([]byte) (int, error)         { return 0, io.EOF }
func (writerConn) Close() error                     { return nil }
func (writerConn) LocalAddr() net.Addr              { return nil }
func (writerConn) RemoteAddr() net.Addr             { return nil }
func (writerConn) SetDeadline(time.Time) error      { return nil }
func (writerConn) SetReadDeadline(time.Time) error  { return nil }
func (writerConn) SetWriteDeadline(time.Time) error { return nil }
