package oncrpc

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"time"
)

// The backward direction over TCP: calls the server sends on the
// connection (NFSv4.1 callbacks, RFC 8881 s2.10.3.1). A server may have
// only as many of them outstanding as the back channel allows (RFC 8881
// s18.36: ca_maxrequests), each at most ca_maxrequestsize bytes; the
// transport holds it to that, so that what a hostile server sends costs
// bounded goroutines and memory.

// Defaults of the backward-call limits until SetBackwardLimits: a few
// calls of a size any callback the client asked for fits in.
const (
	DefaultBackwardCalls    = 16
	DefaultBackwardCallSize = 64 << 10
)

// BackwardLimiter is implemented by a Transport that bounds the
// backward-direction calls it serves.
type BackwardLimiter interface {
	// SetBackwardLimits bounds the backward calls served at once to
	// calls, and the size of one to size bytes (the RPC message, without
	// record marking); zero or less keeps the current value. A call
	// beyond the first limit waits (the transport stops reading), a call
	// beyond the second is not read whole but refused (TooBigHandler).
	SetBackwardLimits(calls, size int)
}

// TooBigHandler is implemented by a CallHandler that answers a backward
// call larger than the transport's size limit, as NFSv4.1 answers one
// larger than the back channel's ca_maxrequestsize with
// NFS4ERR_REQ_TOO_BIG (RFC 8881 s2.10.6.4). head is the call's first
// bytes (as many as the limit), size the whole call's length; the reply,
// or nil for none, is sent as HandleCall's would be. A CallHandler that
// does not implement it gets no such call: the call is dropped.
type TooBigHandler interface {
	HandleTooBig(head []byte, size int) []byte
}

// backwardLimits are a TCPTransport's limits on backward calls.
type backwardLimits struct {
	mu    sync.Mutex
	calls int
	size  int
}

func (l *backwardLimits) get() (calls, size int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return cmp0(l.calls, DefaultBackwardCalls), cmp0(l.size, DefaultBackwardCallSize)
}

func cmp0(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// SetBackwardLimits bounds the backward calls served at once and the size
// of one (BackwardLimiter). NFSv4.1 sets them to the back channel's
// ca_maxrequests and ca_maxrequestsize once CREATE_SESSION has
// negotiated them; until then they are DefaultBackwardCalls and
// DefaultBackwardCallSize.
func (t *TCPTransport) SetBackwardLimits(calls, size int) {
	t.bwLimits.mu.Lock()
	if calls > 0 {
		t.bwLimits.calls = calls
	}
	if size > 0 {
		t.bwLimits.size = size
	}
	t.bwLimits.mu.Unlock()
	t.mu.Lock()
	c := t.conn
	t.mu.Unlock()
	if c != nil {
		c.bw.wake() // a reader waiting for a call to end may go on
	}
}

// backwardGate counts a connection's backward calls being served. Its
// zero value is ready; one goroutine (the reader) acquires.
type backwardGate struct {
	mu   sync.Mutex
	busy int
	free chan struct{} // a token after a call ended or the limit changed
}

func (g *backwardGate) freeCh() chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.free == nil {
		g.free = make(chan struct{}, 1)
	}
	return g.free
}

// acquire waits until fewer than limit() calls are served and counts one
// more, or returns false once dead is closed.
func (g *backwardGate) acquire(limit func() int, dead <-chan struct{}) bool {
	free := g.freeCh()
	for {
		g.mu.Lock()
		if g.busy < limit() {
			g.busy++
			g.mu.Unlock()
			return true
		}
		g.mu.Unlock()
		select {
		case <-free:
		case <-dead:
			return false
		}
	}
}

func (g *backwardGate) release() {
	g.mu.Lock()
	g.busy--
	g.mu.Unlock()
	g.wake()
}

func (g *backwardGate) wake() {
	select {
	case g.freeCh() <- struct{}{}:
	default:
	}
}

// serveBackward serves a backward call on its own goroutine once fewer
// than the limit are served: until then the reader waits, and with it
// the connection (back-pressure: a server beyond its ca_maxrequests
// waits for its calls to be answered rather than costing memory). It
// returns false if the connection died while it waited.
func (c *tcpConn) serveBackward(msg *buffer, size int) bool {
	limit := func() int { n, _ := c.t.bwLimits.get(); return n }
	if !c.bw.acquire(limit, c.dead) {
		putBuffer(msg)
		return false
	}
	go func() {
		defer c.bw.release()
		c.serveCall(msg, size)
	}()
	return true
}

// serveCall runs the handler on a backward call of size bytes, of which
// msg holds all, or (size > len(msg.buf)) the first bytes only, and sends
// its reply.
func (c *tcpConn) serveCall(msg *buffer, size int) {
	defer putBuffer(msg)
	hp := c.t.handler.Load()
	var h CallHandler
	if hp != nil {
		h = *hp
	}
	var reply []byte
	switch {
	case size > len(msg.buf):
		if tb, ok := h.(TooBigHandler); ok {
			reply = tb.HandleTooBig(msg.buf, size)
		}
	case h != nil:
		reply = h.HandleCall(msg.buf)
	default:
		if ch, _, err := ParseCall(msg.buf); err == nil {
			var e xdrEncoder
			AppendAcceptedReply(&e.Encoder, ch.XID, ProgUnavail, 0, 0)
			reply = e.Bytes()
		}
	}
	if reply != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c.writeRecord(ctx, [][]byte{reply})
	}
}

// readRecord reads one record, joining its fragments (RFC 5531 s11), of
// at most maxRecord bytes. Of a call (msg_type CALL) only the first
// maxCall bytes are kept, the rest read and dropped; size is the whole
// record's length.
func readRecord(r io.Reader, maxRecord, maxCall int) (msg *buffer, size int, err error) {
	var hdr [4]byte
	msg = getBuffer(0)
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			putBuffer(msg)
			return nil, 0, err
		}
		w := binary.BigEndian.Uint32(hdr[:])
		n := int(w &^ lastFragment)
		if size+n > maxRecord {
			putBuffer(msg)
			return nil, 0, fmt.Errorf("%w: more than %d bytes", errRecordTooLarge, maxRecord)
		}
		size += n
		if err := readFragment(r, msg, n, maxCall); err != nil {
			putBuffer(msg)
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, 0, err
		}
		if w&lastFragment != 0 {
			return msg, size, nil
		}
	}
}

// fragmentChunk is the most a fragment's buffer grows ahead of the bytes
// read into it.
const fragmentChunk = 256 << 10

// readFragment appends a fragment of n bytes to msg, up to maxCall bytes
// in all once msg holds a call's header, and drops the rest.
func readFragment(r io.Reader, msg *buffer, n, maxCall int) error {
	for n > 0 {
		keep := n
		if len(msg.buf) < 8 {
			keep = min(n, 8-len(msg.buf)) // enough to tell a call
		} else if mt, _ := MessageType(msg.buf); mt == MsgCall {
			keep = min(n, max(0, maxCall-len(msg.buf)))
		}
		if keep == 0 {
			_, err := io.CopyN(io.Discard, r, int64(n))
			return err
		}
		// The buffer grows with the bytes that arrive, not with the
		// length a header claims: a peer that announces a 64 MiB
		// fragment and sends nothing more holds no 64 MiB.
		keep = min(keep, fragmentChunk)
		msg.grow(keep)
		if _, err := io.ReadFull(r, msg.buf[len(msg.buf)-keep:]); err != nil {
			return err
		}
		n -= keep
	}
	return nil
}
