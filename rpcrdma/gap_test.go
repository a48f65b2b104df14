package rpcrdma

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// rawIWARP is an iWARP peer written by hand at the byte level (MPA
// request, then FPDUs without CRC), for a Send no queue pair would
// build: segments that leave a gap.
type rawIWARP struct {
	conn net.Conn
	br   *bufio.Reader
}

func dialRawIWARP(t *testing.T, addr string, priv []byte) *rawIWARP {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// RFC 5044 s7.1, RFC 6581 s5: key, flags (enhanced), revision 2,
	// private data length, the IRD/ORD word (16, 16) and the ULP's.
	pdata := append([]byte{0, 16, 0, 16}, priv...)
	req := append([]byte("MPA ID Req Frame"), 0x10, 2, 0, byte(len(pdata)))
	if _, err := conn.Write(append(req, pdata...)); err != nil {
		t.Fatal(err)
	}
	r := &rawIWARP{conn: conn, br: bufio.NewReader(conn)}
	var hdr [20]byte
	if _, err := io.ReadFull(r.br, hdr[:]); err != nil || string(hdr[:16]) != "MPA ID Rep Frame" || hdr[16]&0x20 != 0 {
		t.Fatalf("MPA reply %q: %v", hdr[:], err)
	}
	if hdr[16]&0x40 != 0 {
		t.Fatal("the responder asks for CRCs; this peer sends none")
	}
	if _, err := io.CopyN(io.Discard, r.br, int64(binary.BigEndian.Uint16(hdr[18:]))); err != nil {
		t.Fatal(err)
	}
	return r
}

// sendSegment writes one DDP segment of Send MSN msn at offset mo (RFC
// 5041 s4.3, RFC 5040 s4.3: opcode 3) as an FPDU with an empty CRC
// field.
func (r *rawIWARP) sendSegment(t *testing.T, msn, mo uint32, last bool, payload []byte) {
	t.Helper()
	ctl := byte(0x01) // DDP version 1, untagged
	if last {
		ctl |= 0x40
	}
	u := []byte{ctl, 0x43, 0, 0, 0, 0, 0, 0, 0, 0}
	u = binary.BigEndian.AppendUint32(u, msn)
	u = binary.BigEndian.AppendUint32(u, mo)
	u = append(u, payload...)
	f := binary.BigEndian.AppendUint16(nil, uint16(len(u)))
	f = append(f, u...)
	f = append(f, make([]byte, -len(f)&3+4)...)
	if _, err := r.conn.Write(f); err != nil {
		t.Fatal(err)
	}
}

// TestHostileGappedSendRelay is the relay case of a gapped Send: client
// A makes calls whose data is its own, then goes; client B connects
// (getting receive buffers A's calls were in) and sends a 32-byte Send
// whose last segment lies 2964 bytes further on. The handler never gets
// a byte of A's calls from B's connection: B's Send is refused with a
// Terminate (RFC 5041 s5.4, s7.2) and its connection closed.
func TestHostileGappedSendRelay(t *testing.T) {
	secret := bytes.Repeat([]byte("A's secret data "), 180) // 2880 bytes
	var mu sync.Mutex
	var calls [][]byte
	h := recordHandler{mu: &mu, calls: &calls}
	resp, err := Listen("127.0.0.1:0", ResponderConfig{Provider: &iwarp.Provider{}, Handler: h, Credits: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A fills every one of its receive buffers (credits + 4) with a call.
	trA := NewTransport(resp.Addr(), Config{Provider: &iwarp.Provider{}})
	clnt := oncrpc.NewClient(trA, echoProg, 1, oncrpc.ClientOptions{Timeout: 30 * time.Second, Retrans: 2})
	for range 3 * (4 + 4) {
		var e xdr.Encoder
		xid := clnt.StartCall(&e, procEcho, oncrpc.AuthNone)
		e.Opaque(secret)
		rep, err := clnt.Do(ctx, &oncrpc.Call{XID: xid, Head: e.Bytes(), MaxReplySize: 4000})
		if err != nil {
			t.Fatal(err)
		}
		rep.Release()
	}
	trA.Close()
	for {
		resp.mu.Lock()
		n := len(resp.conns)
		resp.mu.Unlock()
		if n == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("A's connection did not end at the responder")
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	before := len(calls)
	mu.Unlock()

	priv := PrivateData{Version: privDataVersion, InlineSend: 4096, InlineRecv: 4096}.Marshal()
	b := dialRawIWARP(t, resp.Addr(), priv)
	// 28 bytes of transport header and the RPC XID: an RDMA_MSG whose
	// call is whatever the gap holds.
	head := Header{XID: 0xb0b, Vers: Version1, Credit: 4, Proc: ProcMsg}
	var e xdr.Encoder
	head.Append(&e)
	first := append(e.Bytes(), be32(0xb0b)...)
	b.sendSegment(t, 1, 0, false, first)
	b.sendSegment(t, 1, 2996, true, be32(0))
	// Either B's connection ends (the responder refused the message)
	// or the handler gets a call from it.
	closed := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, b.br)
		closed <- err
	}()
	var cerr error
wait:
	for {
		select {
		case cerr = <-closed:
			break wait
		case <-ctx.Done():
			t.Fatal("B's connection neither closed nor reached the handler")
		case <-time.After(time.Millisecond):
		}
		mu.Lock()
		n := len(calls)
		mu.Unlock()
		if n > before {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, c := range calls[before:] {
		if i := bytes.Index(c, []byte("secret")); i >= 0 {
			t.Fatalf("B's %d-byte Send reached the handler as a %d-byte call holding A's data at %d", len(first)+4, len(c), i)
		}
	}
	if len(calls) != before {
		t.Fatalf("B's gapped Send reached the handler as %d call(s)", len(calls)-before)
	}
	if cerr != nil {
		t.Fatalf("B's connection: %v", cerr)
	}
}

// recordHandler is the echo handler that keeps a copy of every call.
type recordHandler struct {
	mu    *sync.Mutex
	calls *[][]byte
}

func (h recordHandler) HandleCall(msg []byte) []byte {
	h.mu.Lock()
	*h.calls = append(*h.calls, append([]byte(nil), msg...))
	h.mu.Unlock()
	return echoHandler{}.HandleCall(msg)
}
