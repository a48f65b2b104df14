package iwarp

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

const (
	hexKeyReq = "4d504120494420526571204672616d65" // "MPA ID Req Frame"
	hexKeyRep = "4d504120494420526570204672616d65" // "MPA ID Rep Frame"
	// RFC 8797 private data: magic, version 1, flags 0, send/recv 4096.
	hexCMPD = "f6ab0e18" + "01" + "00" + "03" + "03"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMPAFrameGolden spells out the frames on the wire (RFC 5044 s7.1,
// RFC 6581 s5); the first is what tools/mpaprobe.py sends to knfsd
// (case v2-S-irdord-cmpd), which knfsd accepts.
func TestMPAFrameGolden(t *testing.T) {
	cmpd := unhex(t, hexCMPD)
	tests := []struct {
		name  string
		frame mpaFrame
		wire  string
		ird   int
		ord   int
	}{
		{"request rev2 enhanced IRD16 ORD16 + RFC 8797", mpaFrame{flags: 0x10, rev: 2, pdata: enhancedPData(16, 16, cmpd)},
			hexKeyReq + "10 02 000c 0010 0010" + hexCMPD, 16, 16},
		{"request rev2 enhanced CRC IRD1 ORD2", mpaFrame{flags: 0x50, rev: 2, pdata: enhancedPData(1, 2, nil)},
			hexKeyReq + "50 02 0004 0001 0002", 1, 2},
		{"reply rev2 enhanced CRC IRD16 ORD16 + RFC 8797", mpaFrame{reply: true, flags: 0x50, rev: 2, pdata: enhancedPData(16, 16, cmpd)},
			hexKeyRep + "50 02 000c 0010 0010" + hexCMPD, 16, 16},
		{"reject reply rev1", mpaFrame{reply: true, flags: 0x20, rev: 1},
			hexKeyRep + "20 01 0000", 0, 0},
		{"request rev1 no private data", mpaFrame{rev: 1},
			hexKeyReq + "00 01 0000", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wire := unhex(t, tt.wire)
			if got := tt.frame.marshal(); !bytes.Equal(got, wire) {
				t.Fatalf("marshal:\n got %x\nwant %x", got, wire)
			}
			f, n, err := parseMPAFrame(wire)
			if err != nil || n != len(wire) {
				t.Fatalf("parse: n=%d err=%v", n, err)
			}
			if f.reply != tt.frame.reply || f.flags != tt.frame.flags || f.rev != tt.frame.rev || !bytes.Equal(f.pdata, tt.frame.pdata) {
				t.Fatalf("parse: %+v, want %+v", f, tt.frame)
			}
			ird, ord, _ := f.irdOrd()
			if ird != tt.ird || ord != tt.ord {
				t.Fatalf("IRD/ORD %d/%d, want %d/%d", ird, ord, tt.ird, tt.ord)
			}
		})
	}
}

func TestMPAParseErrors(t *testing.T) {
	for name, s := range map[string]string{
		"short":         hexKeyReq + "10 02",
		"bad key":       "4d504120494420526571204672616d66" + "10 02 0000",
		"pd too long":   hexKeyReq + "10 02 0201",
		"pd truncated":  hexKeyReq + "10 02 0008 0001 0001",
		"empty":         "",
		"key truncated": "4d5041",
	} {
		if _, _, err := parseMPAFrame(unhex(t, s)); !errors.Is(err, errMPA) {
			t.Errorf("%s: err %v, want errMPA", name, err)
		}
	}
}

// TestMPANegotiation: CRC is used if either side asks (RFC 5044 s7.1),
// ORD is limited by the peer's IRD (RFC 6581 s5), private data flows both
// ways and the passive side picks its reply from the request.
func TestMPANegotiation(t *testing.T) {
	tests := []struct {
		name                 string
		ccrc, scrc           bool
		cird, cord           int
		sird, sord           int
		wantCRC              bool
		wantClientORD, wantS int
	}{
		{"no crc", false, false, 4, 8, 16, 16, false, 8, 4},
		{"client crc", true, false, 16, 16, 2, 3, true, 2, 3},
		{"server crc", false, true, 1, 1, 1, 1, true, 1, 1},
		{"both crc", true, true, 0, 0, 0, 0, true, 16, 16},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var seen *verbs.ConnRequest
			sp := &verbs.ConnParams{CRC: tt.scrc, IRD: tt.sird, ORD: tt.sord, OnConnect: func(r *verbs.ConnRequest) ([]byte, error) {
				seen = r
				return append([]byte("reply-to-"), r.PrivateData...), nil
			}}
			cp := &verbs.ConnParams{CRC: tt.ccrc, IRD: tt.cird, ORD: tt.cord, PrivateData: []byte("hello")}
			c, s := pair(t, cp, sp)
			if c.CRC() != tt.wantCRC || s.CRC() != tt.wantCRC {
				t.Fatalf("CRC client %v server %v, want %v", c.CRC(), s.CRC(), tt.wantCRC)
			}
			if c.ORD() != tt.wantClientORD || s.ORD() != tt.wantS {
				t.Fatalf("ORD client %d server %d, want %d %d", c.ORD(), s.ORD(), tt.wantClientORD, tt.wantS)
			}
			if string(s.PeerPrivateData()) != "hello" || string(c.PeerPrivateData()) != "reply-to-hello" {
				t.Fatalf("private data: server saw %q, client saw %q", s.PeerPrivateData(), c.PeerPrivateData())
			}
			wantIRD := tt.cird
			if wantIRD == 0 {
				wantIRD = defaultDepth
			}
			if seen == nil || seen.CRC != tt.ccrc || seen.IRD != wantIRD {
				t.Fatalf("ConnRequest %+v", seen)
			}
		})
	}
}

func TestMPARejected(t *testing.T) {
	ctx := testCtx(t)
	ln, err := Listen("127.0.0.1:0", &verbs.ConnParams{OnConnect: func(r *verbs.ConnRequest) ([]byte, error) {
		return nil, errors.New("go away")
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = Dial(ctx, ln.Addr().String(), nil)
	var rej *RejectedError
	if !errors.Is(err, verbs.ErrRejected) || !errors.As(err, &rej) || rej.Rev != 2 {
		t.Fatalf("dial: %v, want ErrRejected with rev 2", err)
	}
}

// rawExchange sends a raw request frame to a Listener and returns the
// reply frame and what follows it until the peer closes (if it does).
func rawExchange(t *testing.T, sp *verbs.ConnParams, req string) (mpaFrame, net.Conn) {
	t.Helper()
	ln, err := Listen("127.0.0.1:0", sp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.Write(unhex(t, req)); err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, mpaHeaderLen)
	if _, err := io.ReadFull(conn, hdr); err != nil {
		t.Fatal(err)
	}
	f, n, err := parseMPAHeader(hdr)
	if err != nil {
		t.Fatal(err)
	}
	f.pdata = make([]byte, n)
	if _, err := io.ReadFull(conn, f.pdata); err != nil {
		t.Fatal(err)
	}
	return f, conn
}

// TestMPAPassiveRevisions: the passive side accepts revision 1 (RFC 5044)
// and 2 (RFC 6581), refuses markers and unknown revisions with R.
func TestMPAPassiveRevisions(t *testing.T) {
	tests := []struct {
		name     string
		req      string
		wantFlag byte
		wantRev  byte
		wantPD   string
	}{
		{"rev1 no pd", hexKeyReq + "00 01 0000", 0x00, 1, ""},
		{"rev1 crc with pd", hexKeyReq + "40 01 0003 616263", 0x40, 1, ""},
		{"rev2 enhanced", hexKeyReq + "10 02 0004 0002 0003", 0x10, 2, "0010 0002"},
		{"rev2 not enhanced", hexKeyReq + "00 02 0000", 0x00, 2, ""},
		{"markers refused", hexKeyReq + "80 01 0000", 0x20, 1, ""},
		{"rev3 refused", hexKeyReq + "00 03 0000", 0x20, 2, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, _ := rawExchange(t, &verbs.ConnParams{}, tt.req)
			if !f.reply || f.flags != tt.wantFlag || f.rev != tt.wantRev || !bytes.Equal(f.pdata, unhex(t, tt.wantPD)) {
				t.Fatalf("reply %+v %x, want flags %#x rev %d pd %s", f, f.pdata, tt.wantFlag, tt.wantRev, tt.wantPD)
			}
		})
	}
}
