package oncrpc

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// backwardPeer is a fault peer: a raw TCP server speaking record marking
// that, once the transport connects, sends backward calls of its own.
type backwardPeer struct {
	ln   net.Listener
	conn chan net.Conn
}

func newBackwardPeer(t *testing.T) *backwardPeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &backwardPeer{ln: ln, conn: make(chan net.Conn, 1)}
	go func() {
		nc, err := ln.Accept()
		if err == nil {
			p.conn <- nc
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return p
}

// accept returns the transport's connection to the peer.
func (p *backwardPeer) accept(t *testing.T) net.Conn {
	t.Helper()
	select {
	case nc := <-p.conn:
		t.Cleanup(func() { nc.Close() })
		return nc
	case <-time.After(10 * time.Second):
		t.Fatal("the transport did not connect")
		return nil
	}
}

// backwardRecord is a record-marked call to the NFSv4.1 callback program,
// with body (opaque bytes) as arguments.
func backwardRecord(xid, proc uint32, body []byte) []byte {
	var e xdr.Encoder
	e.Uint32(0) // record mark, set below
	AppendCallHeader(&e, xid, 0x40000000, 1, proc, AuthNone)
	if body != nil {
		e.FixedOpaque(body)
	}
	b := e.Bytes()
	binary.BigEndian.PutUint32(b, uint32(len(b)-4)|lastFragment)
	return b
}

type nullAnswerer struct{}

func (nullAnswerer) HandleCall(msg []byte) []byte {
	h, _, err := ParseCall(msg)
	if err != nil {
		return nil
	}
	var e xdr.Encoder
	AppendAcceptedReply(&e, h.XID, Success, 0, 0)
	return e.Bytes()
}

// TestTCPBackwardFloodBounded: a peer that floods CB_NULL calls and never
// reads a reply costs the transport at most its limit of calls being
// served: it stops reading, and the peer's writes stall, rather than a
// goroutine and a buffer per call (102,000 goroutines and 951 MiB from
// 300,000 calls before).
func TestTCPBackwardFloodBounded(t *testing.T) {
	const limit = 4
	p := newBackwardPeer(t)
	tr := NewTCPTransport(p.ln.Addr().String(), TCPOptions{})
	defer tr.Close()
	tr.SetCallHandler(nullAnswerer{})
	tr.SetBackwardLimits(limit, 4096)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	if err := tr.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	nc := p.accept(t)

	const perChunk, total = 1000, 1_000_000 // 44 MB: more than socket buffers hold
	var chunk []byte
	for i := range perChunk {
		chunk = append(chunk, backwardRecord(uint32(i), 0, nil)...)
	}
	// The transport's reader and at most limit callers: a margin for the
	// runtime's and the test's own.
	const margin = 16
	sent := 0
	for ; sent < total; sent += perChunk {
		nc.SetWriteDeadline(time.Now().Add(2 * time.Second))
		if _, err := nc.Write(chunk); err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("peer write: %v", err)
			}
			break // the transport stopped reading
		}
		if g := runtime.NumGoroutine(); g > g0+1+limit+margin {
			t.Fatalf("%d goroutines after %d backward calls, %d before", g, sent+perChunk, g0)
		}
	}
	if sent == total {
		t.Fatalf("the transport read all %d calls it could not answer", total)
	}
	if g := runtime.NumGoroutine(); g > g0+1+limit+margin {
		t.Fatalf("%d goroutines after %d backward calls, %d before", g, sent, g0)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 16<<20 {
		t.Fatalf("heap grew by %d bytes for %d backward calls", grew, sent)
	}
	t.Logf("peer stalled after %d calls; %d goroutines, %d before", sent, runtime.NumGoroutine(), g0)
}

// tooBigRecorder answers calls as nullAnswerer does and records the
// calls it got whole and the heads of those too big.
type tooBigRecorder struct {
	nullAnswerer
	mu    sync.Mutex
	whole []int // sizes of the calls HandleCall got
	heads []int // len(head) of each HandleTooBig
	sizes []int // and size
}

func (r *tooBigRecorder) HandleCall(msg []byte) []byte {
	r.mu.Lock()
	r.whole = append(r.whole, len(msg))
	r.mu.Unlock()
	return r.nullAnswerer.HandleCall(msg)
}

func (r *tooBigRecorder) HandleTooBig(head []byte, size int) []byte {
	r.mu.Lock()
	r.heads = append(r.heads, len(head))
	r.sizes = append(r.sizes, size)
	r.mu.Unlock()
	return r.nullAnswerer.HandleCall(head)
}

// TestTCPBackwardCallTooBig: a backward call larger than the size limit
// is not given to HandleCall: the handler's HandleTooBig gets its first
// bytes only (the rest is read and dropped), and answers it; the calls
// after it are served as usual.
func TestTCPBackwardCallTooBig(t *testing.T) {
	const size = 4096
	p := newBackwardPeer(t)
	tr := NewTCPTransport(p.ln.Addr().String(), TCPOptions{})
	defer tr.Close()
	h := &tooBigRecorder{}
	tr.SetCallHandler(h)
	tr.SetBackwardLimits(4, size)
	if err := tr.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	nc := p.accept(t)
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	big := backwardRecord(1, 1, make([]byte, 1<<20))
	small := backwardRecord(2, 0, nil)
	if _, err := nc.Write(append(big, small...)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	xids := map[uint32]bool{}
	for range 2 {
		msg, _, err := readRecord(br, 1<<20, 1<<20)
		if err != nil {
			t.Fatalf("reading replies: %v", err)
		}
		xid, _, err := ParseReply(msg.buf)
		if err != nil {
			t.Fatalf("reply: %v", err)
		}
		xids[xid] = true
	}
	if !xids[1] || !xids[2] {
		t.Fatalf("replies to %v, want to xids 1 and 2", xids)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.heads) != 1 || h.heads[0] != size || h.sizes[0] != len(big)-4 {
		t.Errorf("HandleTooBig got heads %v of sizes %v, want one of %d bytes of %d", h.heads, h.sizes, size, len(big)-4)
	}
	if len(h.whole) != 1 || h.whole[0] != len(small)-4 {
		t.Errorf("HandleCall got calls of %v bytes, want one of %d", h.whole, len(small)-4)
	}
}

// TestTCPBackwardCallTooBigDropped: a handler that cannot answer a call
// too big gets none; it is dropped and the next call served.
func TestTCPBackwardCallTooBigDropped(t *testing.T) {
	p := newBackwardPeer(t)
	tr := NewTCPTransport(p.ln.Addr().String(), TCPOptions{})
	defer tr.Close()
	tr.SetCallHandler(nullAnswerer{})
	tr.SetBackwardLimits(0, 1024)
	if err := tr.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	nc := p.accept(t)
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write(append(backwardRecord(1, 1, make([]byte, 2048)), backwardRecord(2, 0, nil)...)); err != nil {
		t.Fatal(err)
	}
	msg, _, err := readRecord(bufio.NewReader(nc), 1<<20, 1<<20)
	if err != nil {
		t.Fatalf("reading reply: %v", err)
	}
	if xid, _, err := ParseReply(msg.buf); err != nil || xid != 2 {
		t.Fatalf("first reply is to xid %d (%v), want 2", xid, err)
	}
}
