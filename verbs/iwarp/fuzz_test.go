package iwarp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

// FuzzMPAFrame: the MPA Request/Reply parser (RFC 5044 s7.1) never
// panics, and what it accepts re-encodes to the same bytes.
func FuzzMPAFrame(f *testing.F) {
	for _, s := range []string{
		hexKeyReq + "1002000c00100010" + hexCMPD,
		hexKeyRep + "5002000c00100010" + hexCMPD,
		hexKeyRep + "20010000",
		hexKeyReq + "80010000",
		hexKeyReq + "10020002ffff",
		hexKeyReq + "000302000000",
	} {
		if b, err := hex.DecodeString(s); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, n, err := parseMPAFrame(b)
		if err != nil {
			return
		}
		if n > len(b) || len(fr.pdata) > mpaMaxPrivateData {
			t.Fatalf("n=%d of %d, pdata %d", n, len(b), len(fr.pdata))
		}
		if got := fr.marshal(); !bytes.Equal(got, b[:n]) {
			t.Fatalf("re-encoded %x, parsed from %x", got, b[:n])
		}
		ird, ord, _ := fr.irdOrd()
		if ird > irdOrdMask || ord > irdOrdMask || len(fr.ulpData()) > len(fr.pdata) {
			t.Fatalf("ird %d ord %d", ird, ord)
		}
	})
}

// FuzzDDPHeader: the DDP/RDMAP header and Read Request parsers (RFC 5041
// s4, RFC 5040 s4.4) never panic and round-trip.
func FuzzDDPHeader(f *testing.F) {
	var b [untaggedHdrLen + readReqLen]byte
	putTagged(b[:], true, opWrite, 0x1234, 0x99)
	f.Add(append([]byte(nil), b[:taggedHdrLen]...))
	putUntagged(b[:], true, opSend, 0, qnSend, 1, 0)
	f.Add(append([]byte(nil), b[:untaggedHdrLen]...))
	n := putUntagged(b[:], true, opReadReq, 0, qnReadReq, 1, 0)
	(&readRequest{sinkSTag: 1, sinkTO: 2, size: 3, srcSTag: 4, srcTO: 5}).put(b[n:])
	f.Add(append([]byte(nil), b[:]...))
	f.Add([]byte{0x41, 0x43})
	f.Add([]byte{0xc1})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseDDPHeader(b)
		if err != nil {
			return
		}
		var enc [untaggedHdrLen]byte
		if h.tagged() {
			putTagged(enc[:], h.last(), h.opcode(), h.stag, h.to)
		} else {
			putUntagged(enc[:], h.last(), h.opcode(), h.rsvd, h.qn, h.msn, h.mo)
		}
		// Reserved bits and versions are not re-encoded; compare the rest.
		if !bytes.Equal(enc[2:h.hdlen], b[2:h.hdlen]) || enc[0]&0xc0 != b[0]&0xc0 || enc[1]&0x0f != b[1]&0x0f {
			t.Fatalf("round trip %x -> %x", b[:h.hdlen], enc[:h.hdlen])
		}
		if rr, err := parseReadRequest(b[h.hdlen:]); err == nil {
			var out [readReqLen]byte
			rr.put(out[:])
			if !bytes.Equal(out[:], b[h.hdlen:]) {
				t.Fatalf("read request round trip")
			}
		}
	})
}

// FuzzTerminate: the Terminate parser (RFC 5040 s4.8) never panics and
// what it accepts re-encodes to a prefix of the input.
func FuzzTerminate(f *testing.F) {
	var hb [untaggedHdrLen]byte
	putUntagged(hb[:], true, opSend, 0, qnSend, 1, 0)
	f.Add((&Terminate{Layer: LayerDDP, EType: DDPEtypeUntaggedBuf, Code: DDPCodeUNoBuffer, SegLenValid: true, SegLen: 20, DDPHeader: hb[:]}).marshal(nil))
	f.Add((&Terminate{Layer: LayerRDMAP, EType: RDMAPEtypeRemoteProtection, Code: RDMAPCodeInvalidSTag, ReadRequest: make([]byte, readReqLen)}).marshal(nil))
	f.Add((&Terminate{Layer: LayerLLP, Code: LLPCodeCRC}).marshal(nil))
	f.Add([]byte{0x10, 0x00, 0xc0, 0x00, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		tm, err := parseTerminate(b)
		if err != nil {
			return
		}
		enc := tm.marshal(nil)
		t2, err := parseTerminate(enc)
		if err != nil {
			t.Fatalf("re-parse of %x: %v", enc, err)
		}
		if t2.Layer != tm.Layer || t2.EType != tm.EType || t2.Code != tm.Code || t2.SegLen != tm.SegLen ||
			!bytes.Equal(t2.DDPHeader, tm.DDPHeader) || !bytes.Equal(t2.ReadRequest, tm.ReadRequest) {
			t.Fatalf("round trip %+v -> %+v", tm, t2)
		}
		_ = tm.status()
	})
}

// FuzzReceive feeds an arbitrary byte stream to the receive path of a
// queue pair (with and without CRC): it must never panic and never write
// outside the registered regions and posted buffers.
func FuzzReceive(f *testing.F) {
	frame := func(crc bool, ulpdu []byte) []byte {
		b := binary.BigEndian.AppendUint16(nil, uint16(len(ulpdu)))
		b = append(b, ulpdu...)
		b = append(b, make([]byte, -len(b)&3)...)
		var c uint32
		if crc {
			c = crc32.Checksum(b, castagnoli)
		}
		return binary.LittleEndian.AppendUint32(b, c)
	}
	var h [untaggedHdrLen + readReqLen]byte
	n := putUntagged(h[:], true, opSend, 0, qnSend, 1, 0)
	send := frame(false, append(h[:n:n], "hello"...))
	n = putTagged(h[:], true, opWrite, 1<<8, 10)
	write := frame(false, append(h[:n:n], "data"...))
	n = putTagged(h[:], true, opReadResp, 2<<8, 0)
	resp := frame(false, append(h[:n:n], make([]byte, 16)...))
	n = putUntagged(h[:], true, opReadReq, 0, qnReadReq, 1, 0)
	(&readRequest{sinkSTag: 5, size: 8, srcSTag: 1 << 8}).put(h[n:])
	rreq := frame(false, h[:])
	n = putUntagged(h[:], true, opSendInv, 1<<8, qnSend, 2, 0)
	inv := frame(false, h[:n])
	f.Add(false, append(append(append(send, write...), resp...), inv...))
	f.Add(false, rreq)
	f.Add(true, send)
	f.Add(false, []byte{0, 1, 2, 3})
	f.Fuzz(func(t *testing.T, crc bool, data []byte) {
		pd := NewProtectionDomain()
		backing := make([]byte, 300)
		mr1, _ := pd.RegisterMemory(backing[100:200], verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
		mr2, _ := pd.RegisterMemory(backing[0:16], verbs.AccessLocalWrite)
		if mr1.STag() != 1<<8 || mr2.STag() != 2<<8 {
			t.Fatalf("stags %#x %#x", mr1.STag(), mr2.STag())
		}
		recv := make([]byte, 300)
		q := &QP{br: bufio.NewReader(bytes.NewReader(data)), pd: TableOf(pd), crc: crc, ird: 2,
			scq: verbs.NewSoftCQ(), rcq: verbs.NewSoftCQ(), irq: make(chan readRequest, 2)}
		q.cond.L = &q.mu
		q.rq.push(recvEntry{wrid: 1, buf: recv[0:50]})
		q.rq.push(recvEntry{wrid: 2, buf: recv[100:150]})
		q.sq.push(sqEntry{wr: verbs.SendWR{Opcode: verbs.OpRDMARead}})
		q.orq.push(readCtx{seq: 0, sinkSTag: mr2.STag(), size: 16})
		rs := &rxState{sendMSN: 1, readMSN: 1}
		_ = q.receive(rs)
		for i, b := range backing {
			if (i < 16 || i >= 100 && i < 200) || b == 0 {
				continue
			}
			t.Fatalf("backing byte %d written", i)
		}
		for i, b := range recv {
			if (i < 50 || i >= 100 && i < 150) || b == 0 {
				continue
			}
			t.Fatalf("receive byte %d written", i)
		}
	})
}
