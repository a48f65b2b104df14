package rpcrdma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// A scripted fake responder at the queue-pair level, for the faults a real
// peer cannot produce on demand. The requester under test dials it over a
// net.Pipe; the peer side is a real queue pair of the pure-Go iWARP
// provider, so whatever the script does (any transport header, RDMA Write
// or Read to any STag, offset and length, Send With Invalidate of any
// STag) reaches the requester exactly as it would from a server, and the
// requester's provider enforces STags, rights and bounds as it would. A
// test reads like the attack it is:
//
//	fp := newFakePeer(t, peerOpts{})
//	tr := fp.transport(Config{Version: Version1})
//	go roundTrip(...)
//	pc := fp.accept()
//	m := pc.recvCall()
//	pc.write(m.Hdr.Writes[0][0].Handle, 4096, []byte{1}) // past the segment
//	pc.waitTerminated()                                  // the requester refused it

// peerTimeout only keeps a broken test from hanging; no test relies on it.
const peerTimeout = 60 * time.Second

// peerOpts configure a fakePeer.
type peerOpts struct {
	// NoPrivateData makes the peer send no RFC 8797 private data (the
	// requester must then assume 1024-byte thresholds).
	NoPrivateData bool
	// InlineSend and InlineRecv go into the private data; zero means
	// 4096.
	InlineSend, InlineRecv int
	// RecvBufSize is the size of the receive buffers posted; zero
	// means InlineRecv. A larger one receives what a requester should
	// not have sent, where the provider would otherwise refuse it.
	RecvBufSize int
	// RemoteInvalidate is the private data's Send With Invalidate flag.
	RemoteInvalidate bool
	// Credits is the grant reply and replyTo send; zero means 32.
	Credits uint32
	// Recvs is how many receive buffers the peer has; zero means
	// Credits + 8. Posted is how many of them are posted at first
	// (zero: all); postMore posts the others.
	Recvs, Posted int
	// HoldCalls keeps a call's receive buffer until the call is
	// answered (reply, replyWith, release): with Recvs == Credits a
	// requester that exceeds the grant finds no buffer and its Send
	// breaks the connection (RFC 5040 s5.3), on top of the count the
	// peer keeps (maxOutstanding).
	HoldCalls bool
}

// fakePeer accepts the requester's connections.
type fakePeer struct {
	t    testing.TB
	opts peerOpts
	pd   *verbs.ProtectionDomain
	pl   *pipeListener
	ln   *iwarp.Listener
	ctx  context.Context
	mem  sync.Map // *iwarp.QP -> *peerMem, filled by Setup
	log  *syncBuffer

	mu    sync.Mutex
	gates []*gate // the peer's ends of the connections, in dial order
}

// peerMem is one connection's receive buffers.
type peerMem struct {
	bufs [][]byte
	sgl  [][]verbs.SGE
}

func newFakePeer(t testing.TB, opts peerOpts) *fakePeer {
	t.Helper()
	if opts.Credits == 0 {
		opts.Credits = 32
	}
	if opts.Recvs == 0 {
		opts.Recvs = int(opts.Credits) + 8
	}
	if opts.Posted == 0 {
		opts.Posted = opts.Recvs
	}
	if opts.InlineSend == 0 {
		opts.InlineSend = 4096
	}
	if opts.InlineRecv == 0 {
		opts.InlineRecv = 4096
	}
	ctx, cancel := context.WithTimeout(context.Background(), peerTimeout)
	fp := &fakePeer{t: t, opts: opts, pd: iwarp.NewProtectionDomain(), pl: newPipeListener(), ctx: ctx, log: &syncBuffer{}}
	var priv []byte
	if !opts.NoPrivateData {
		priv = PrivateData{Version: privDataVersion, RemoteInvalidate: opts.RemoteInvalidate,
			InlineSend: opts.InlineSend, InlineRecv: opts.InlineRecv}.Marshal()
	}
	fp.ln = iwarp.NewListener(fp.pl, &verbs.ConnParams{PD: fp.pd, PrivateData: priv, Setup: fp.setup})
	t.Cleanup(func() {
		cancel()
		fp.ln.Close()
		if t.Failed() {
			t.Logf("requester trace:\n%s", fp.log.String())
		}
	})
	return fp
}

// setup posts the peer's receive buffers before the connection is
// accepted.
func (fp *fakePeer) setup(qp verbs.QueuePair) error {
	size := fp.opts.InlineRecv
	if fp.opts.RecvBufSize > 0 {
		size = fp.opts.RecvBufSize
	}
	mem := make([]byte, fp.opts.Recvs*size)
	mr, err := fp.pd.RegisterMemory(mem, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	pm := &peerMem{}
	for i := range fp.opts.Recvs {
		pm.bufs = append(pm.bufs, mem[i*size:(i+1)*size])
		pm.sgl = append(pm.sgl, []verbs.SGE{{MR: mr, Offset: uint64(i * size), Length: uint32(size)}})
		if i >= fp.opts.Posted {
			continue
		}
		if err := qp.PostRecv(verbs.RecvWR{WRID: uint64(i), SGL: pm.sgl[i]}); err != nil {
			return err
		}
	}
	fp.mem.Store(qp, pm)
	return nil
}

// provider is the requester's verbs.Provider: every Dial reaches this
// peer.
func (fp *fakePeer) provider() verbs.Provider {
	return &iwarp.Provider{DialConn: func(ctx context.Context, _ string) (net.Conn, error) {
		c, s := net.Pipe()
		g := newGate(s)
		fp.mu.Lock()
		fp.gates = append(fp.gates, g)
		fp.mu.Unlock()
		select {
		case fp.pl.conns <- g:
			return c, nil
		case <-ctx.Done():
			c.Close()
			s.Close()
			return nil, ctx.Err()
		}
	}}
}

// transport returns a requester connected (on its first call) to the
// peer, closed at the end of the test.
func (fp *fakePeer) transport(cfg Config) *Transport {
	if cfg.Provider == nil {
		cfg.Provider = fp.provider()
	}
	if os.Getenv("RDMAFS_TEST_TRACE") != "" {
		cfg.Tracer = trace.New(os.Stderr, trace.RDMA|trace.MR)
	} else {
		cfg.Tracer = trace.New(fp.log, trace.RDMA|trace.MR)
	}
	tr := NewTransport("fakepeer", cfg)
	fp.t.Cleanup(func() { tr.Close() })
	return tr
}

// accept returns the next connection the requester made.
func (fp *fakePeer) accept() *peerConn {
	fp.t.Helper()
	qp, err := fp.ln.AcceptQP(fp.ctx)
	if err != nil {
		fp.t.Fatalf("peer: accept: %v", err)
	}
	v, _ := fp.mem.Load(qp)
	fp.mu.Lock()
	g := fp.gates[len(fp.gates)-1]
	fp.mu.Unlock()
	pc := &peerConn{fp: fp, t: fp.t, qp: qp, mem: v.(*peerMem), gate: g, credits: fp.opts.Credits}
	fp.t.Cleanup(func() { qp.Close() })
	return pc
}

// peerConn is one connection, seen from the peer.
type peerConn struct {
	fp      *fakePeer
	t       testing.TB
	qp      *iwarp.QP
	mem     *peerMem
	gate    *gate
	credits uint32 // grant sent by reply and replyTo

	mu      sync.Mutex // serializes send queue operations
	nextWR  uint64
	recvSeq int   // messages received
	held    int   // calls not yet answered (HoldCalls)
	oneWay  []int // one-way messages (RDMA_OPTIONAL, RDMA_ERROR) not yet followed by the reply to a later call
	maxHeld int   // the most of held + oneWay at once
}

// peerMsg is a message the peer received.
type peerMsg struct {
	pc       *peerConn
	seq      int // arrival order
	buf      int // receive buffer, -1 once reposted
	Raw      []byte
	Hdr      Header
	HdrErr   error
	Payload  []byte // after the transport header (RDMA_MSG)
	Inv      uint32 // STag a Send With Invalidate named
	WithInv  bool
	IsCall   bool   // the payload is an RPC call
	RPCXID   uint32 // its RPC XID
	Proc     uint32 // its procedure
	CallArgs []byte
}

// tryRecv waits for the next message; an error means the connection
// broke.
func (pc *peerConn) tryRecv() (*peerMsg, error) {
	var wc [1]verbs.Completion
	for {
		n, err := pc.qp.RecvCQ().Poll(pc.fp.ctx, wc[:])
		if err != nil {
			return nil, fmt.Errorf("peer: receive: %w (queue pair: %v)", err, pc.qp.Err())
		}
		if n == 0 {
			continue
		}
		w := wc[0]
		if w.Status != verbs.StatusSuccess {
			return nil, fmt.Errorf("peer: receive completion %v (queue pair: %v)", w.Status, pc.qp.Err())
		}
		i := int(w.WRID)
		m := &peerMsg{pc: pc, buf: i, Raw: append([]byte(nil), pc.mem.bufs[i][:w.ByteLen]...)}
		if w.Opcode == verbs.OpRecvWithInvalidate {
			m.Inv, m.WithInv = w.InvalidatedSTag, true
		}
		hl, err := m.Hdr.Decode(m.Raw, true)
		m.HdrErr = err
		if err == nil {
			m.Payload = m.Raw[hl:]
			if ch, args, err := oncrpc.ParseCall(m.Payload); err == nil && m.Hdr.Proc == ProcMsg {
				m.IsCall, m.RPCXID, m.Proc, m.CallArgs = true, ch.XID, ch.Proc, args
			}
		}
		pc.mu.Lock()
		pc.recvSeq++
		m.seq = pc.recvSeq
		if pc.fp.opts.HoldCalls {
			// A requester counts every message against the grant:
			// a call until its reply, a one-way message until the
			// reply to a call sent after it.
			if m.holds() {
				pc.held++
			} else {
				pc.oneWay = append(pc.oneWay, m.seq)
			}
			pc.maxHeld = max(pc.maxHeld, pc.held+len(pc.oneWay))
		}
		pc.mu.Unlock()
		if !pc.fp.opts.HoldCalls || !m.holds() {
			m.release()
		}
		return m, nil
	}
}

// recv waits for the next message.
func (pc *peerConn) recv() *peerMsg {
	pc.t.Helper()
	m, err := pc.tryRecv()
	if err != nil {
		pc.t.Fatal(err)
	}
	return m
}

// recvCall waits for the next message and requires an RPC call.
func (pc *peerConn) recvCall() *peerMsg {
	pc.t.Helper()
	m := pc.recv()
	if m.HdrErr != nil || (!m.IsCall && m.Hdr.Proc != ProcNoMsg) {
		pc.t.Fatalf("peer: expected a call, got %d bytes proc %d (%v)", len(m.Raw), m.Hdr.Proc, m.HdrErr)
	}
	return m
}

// holds reports whether the message is a call, held until answered.
func (m *peerMsg) holds() bool { return m.IsCall || m.Hdr.Proc == ProcNoMsg }

// release reposts the message's receive buffer; for a call, as its reply
// is about to be sent.
func (m *peerMsg) release() {
	if m.buf < 0 {
		return
	}
	pc := m.pc
	if err := pc.qp.PostRecv(verbs.RecvWR{WRID: uint64(m.buf), SGL: pc.mem.sgl[m.buf]}); err != nil {
		pc.t.Errorf("peer: repost receive: %v", err)
	}
	if pc.fp.opts.HoldCalls && m.holds() {
		pc.mu.Lock()
		pc.held--
		k := 0
		for _, s := range pc.oneWay {
			if s > m.seq {
				pc.oneWay[k] = s
				k++
			}
		}
		pc.oneWay = pc.oneWay[:k]
		pc.mu.Unlock()
	}
	m.buf = -1
}

// postMore posts the receive buffers that were not posted at first.
func (pc *peerConn) postMore() {
	for i := pc.fp.opts.Posted; i < pc.fp.opts.Recvs; i++ {
		if err := pc.qp.PostRecv(verbs.RecvWR{WRID: uint64(i), SGL: pc.mem.sgl[i]}); err != nil {
			pc.t.Fatalf("peer: post receive: %v", err)
		}
	}
}

// maxOutstanding is the most messages of the requester that the peer
// held unanswered at once (HoldCalls).
func (pc *peerConn) maxOutstanding() int {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.maxHeld
}

// post posts one send queue work request and waits for its completion.
func (pc *peerConn) post(wr verbs.SendWR) error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.nextWR++
	wr.WRID = pc.nextWR
	if err := pc.qp.PostSend(wr); err != nil {
		return err
	}
	var wc [1]verbs.Completion
	for {
		n, err := pc.qp.SendCQ().Poll(pc.fp.ctx, wc[:])
		if err != nil {
			return fmt.Errorf("peer: %v: %w", wr.Opcode, err)
		}
		if n == 1 && wc[0].WRID == wr.WRID {
			if wc[0].Status != verbs.StatusSuccess {
				return fmt.Errorf("peer: %v completed %v (queue pair: %v)", wr.Opcode, wc[0].Status, pc.qp.Err())
			}
			return nil
		}
	}
}

// local registers b for a work request of the peer.
func (pc *peerConn) local(b []byte) (verbs.SGE, func()) {
	mr, err := pc.fp.pd.RegisterMemory(b, verbs.AccessLocalWrite)
	if err != nil {
		pc.t.Fatalf("peer: register: %v", err)
	}
	return verbs.SGE{MR: mr, Length: uint32(len(b))}, func() { _ = mr.Deregister() }
}

// sendRaw sends b as one Send (With Invalidate of inv when withInv).
func (pc *peerConn) sendRawInv(b []byte, withInv bool, inv uint32) error {
	sge, done := pc.local(b)
	defer done()
	wr := verbs.SendWR{Opcode: verbs.OpSend, SGL: []verbs.SGE{sge}}
	if len(b) == 0 {
		wr.SGL = nil
	}
	if withInv {
		wr.Opcode, wr.InvalidateSTag = verbs.OpSendWithInvalidate, inv
	}
	return pc.post(wr)
}

func (pc *peerConn) sendRaw(b []byte) {
	pc.t.Helper()
	if err := pc.sendRawInv(b, false, 0); err != nil {
		pc.t.Fatal(err)
	}
}

// send sends a transport header followed by payload.
func (pc *peerConn) send(h Header, payload ...[]byte) {
	pc.t.Helper()
	pc.sendRaw(encodeMsg(h, payload...))
}

func encodeMsg(h Header, payload ...[]byte) []byte {
	var e xdr.Encoder
	h.Append(&e)
	b := e.Bytes()
	for _, p := range payload {
		b = append(b, p...)
	}
	return b
}

// replyHeader is the header of a well-formed reply to m: same XID and
// version, the peer's grant, and m's Write chunks echoed as unused.
func (pc *peerConn) replyHeader(m *peerMsg) Header {
	h := Header{XID: m.Hdr.XID, Vers: m.Hdr.Vers, Credit: pc.credits, Proc: ProcMsg}
	for _, w := range m.Hdr.Writes {
		unused := make([]Segment, len(w))
		for i, s := range w {
			unused[i] = Segment{Handle: s.Handle, Offset: s.Offset}
		}
		h.Writes = append(h.Writes, unused)
	}
	return h
}

// reply answers call m inline with an accepted reply carrying results.
func (pc *peerConn) reply(m *peerMsg, results ...[]byte) {
	pc.t.Helper()
	pc.replyWith(m, pc.replyHeader(m), results...)
}

// replyWith answers call m with header h and an accepted reply carrying
// results; m's buffer is reposted first (RFC 8166 s3.3.1: Receives for
// the grant are posted before the reply that announces it).
func (pc *peerConn) replyWith(m *peerMsg, h Header, results ...[]byte) {
	pc.t.Helper()
	m.release()
	pc.send(h, append([][]byte{rpcReply(m.RPCXID)}, results...)...)
}

// rpcReply is an accepted, successful RPC reply header for xid.
func rpcReply(xid uint32) []byte {
	var e xdr.Encoder
	oncrpc.AppendAcceptedReply(&e, xid, oncrpc.Success, 0, 0)
	return e.Bytes()
}

// write RDMA-Writes data to [off, off+len) of the requester's stag. A nil
// error means the Write left; whether it landed shows in the requester's
// memory, or in a Terminate (waitTerminated).
func (pc *peerConn) write(stag uint32, off uint64, data []byte) error {
	sge, done := pc.local(data)
	defer done()
	return pc.post(verbs.SendWR{Opcode: verbs.OpRDMAWrite, SGL: []verbs.SGE{sge}, RemoteSTag: stag, RemoteOffset: off})
}

// postRead posts an RDMA Read of n bytes at off of stag without waiting
// for it.
func (pc *peerConn) postRead(stag uint32, off uint64, n int) {
	pc.t.Helper()
	b := make([]byte, n)
	sge, _ := pc.local(b)
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.nextWR++
	if err := pc.qp.PostSend(verbs.SendWR{WRID: pc.nextWR, Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{sge}, RemoteSTag: stag, RemoteOffset: off, Length: uint32(n)}); err != nil {
		pc.t.Fatal(err)
	}
}

// read RDMA-Reads n bytes at off of the requester's stag.
func (pc *peerConn) read(stag uint32, off uint64, n int) ([]byte, error) {
	b := make([]byte, n)
	sge, done := pc.local(b)
	defer done()
	err := pc.post(verbs.SendWR{Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{sge}, RemoteSTag: stag, RemoteOffset: off, Length: uint32(n)})
	return b, err
}

// writeRefused RDMA-Writes data and requires the requester to refuse it
// (the Write's own completion may already be flushed by the Terminate).
func (pc *peerConn) writeRefused(stag uint32, off uint64, data []byte, what string) {
	pc.t.Helper()
	_ = pc.write(stag, off, data)
	pc.requireRefused(what)
}

// readRefused RDMA-Reads and requires the requester to refuse it.
func (pc *peerConn) readRefused(stag uint32, off uint64, n int, what string) {
	pc.t.Helper()
	if _, err := pc.read(stag, off, n); err == nil {
		pc.t.Fatalf("%s: the peer read %d bytes of STag %#x", what, n, stag)
	}
	pc.requireRefused(what)
}

// pullChunk reads a Read chunk (a list of segments) whole.
func (pc *peerConn) pullChunk(segs []ReadSegment) []byte {
	pc.t.Helper()
	var out []byte
	for _, s := range segs {
		b, err := pc.read(s.Handle, s.Offset, int(s.Length))
		if err != nil {
			pc.t.Fatalf("peer: pull Read chunk: %v", err)
		}
		out = append(out, b...)
	}
	return out
}

// waitTerminated waits for the connection to break and returns the
// Terminate the requester sent (nil if it broke otherwise).
func (pc *peerConn) waitTerminated() *iwarp.TerminateError {
	pc.t.Helper()
	select {
	case <-pc.qp.Done():
	case <-pc.fp.ctx.Done():
		pc.t.Fatal("peer: the connection did not break")
	}
	var te *iwarp.TerminateError
	if errors.As(pc.qp.Err(), &te) {
		return te
	}
	return nil
}

// waitClosed waits for the requester to close the connection.
func (pc *peerConn) waitClosed() {
	pc.t.Helper()
	select {
	case <-pc.qp.Done():
	case <-pc.fp.ctx.Done():
		pc.t.Fatal("peer: the requester did not close the connection")
	}
}

// requireRefused checks that the requester answered an access with a
// Terminate: a tagged buffer error (RDMA Write) or a remote protection
// error (RDMA Read), RFC 5040 s7.
func (pc *peerConn) requireRefused(what string) {
	pc.t.Helper()
	te := pc.waitTerminated()
	if te == nil {
		// The requester closes its queue pair as soon as it breaks,
		// which can cut the Terminate it is writing (the pure-Go
		// provider's Close does not wait for it). The access still
		// failed; the callers check the memory.
		if !errors.Is(pc.qp.Err(), verbs.ErrConnectionLost) {
			pc.t.Fatalf("%s: connection broke without a Terminate: %v", what, pc.qp.Err())
		}
		pc.t.Logf("%s: connection closed under the Terminate: %v", what, pc.qp.Err())
		return
	}
	tagged := te.Terminate.Layer == iwarp.LayerDDP && te.Terminate.EType == iwarp.DDPEtypeTaggedBuf
	prot := te.Terminate.Layer == iwarp.LayerRDMAP && te.Terminate.EType == iwarp.RDMAPEtypeRemoteProtection
	if !tagged && !prot {
		pc.t.Fatalf("%s: Terminate %v, want a tagged buffer or remote protection error", what, &te.Terminate)
	}
}

// pipeListener is a net.Listener of the peer ends of net.Pipes.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "fakepeer" }

// gate is the peer's end of a connection: it can stop the peer's output
// after a given number of bytes, in the middle of a frame, to stall a
// transfer the requester is placing.
type gate struct {
	net.Conn
	mu       sync.Mutex
	cond     sync.Cond
	budget   int64 // bytes the peer may still write; < 0: no limit
	readLeft int64 // bytes the peer may still read; < 0: no limit
	reads    int64 // bytes the peer has read
	closed   bool
}

// Read is the peer's input; once the read limit is used up the
// requester's writes block (a net.Pipe has no buffer).
func (g *gate) Read(p []byte) (int, error) {
	g.mu.Lock()
	for g.readLeft == 0 && !g.closed {
		g.cond.Wait()
	}
	closed := g.closed
	if g.readLeft > 0 && int64(len(p)) > g.readLeft {
		p = p[:g.readLeft]
	}
	g.mu.Unlock()
	if closed {
		return 0, net.ErrClosed
	}
	n, err := g.Conn.Read(p)
	g.mu.Lock()
	g.reads += int64(n)
	if g.readLeft > 0 {
		g.readLeft -= int64(n)
	}
	g.cond.Broadcast()
	g.mu.Unlock()
	return n, err
}

// holdReads lets the peer read n more bytes, then stops it reading, and
// returns how much it has read so far. A byte count, not "the read in
// progress": whether the peer's receiving goroutine is already waiting
// in Read when the hold starts is up to the scheduler.
func (g *gate) holdReads(n int64) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.readLeft = n
	return g.reads
}

// waitRead waits until the peer has read more than n bytes.
func (g *gate) waitRead(ctx context.Context, n int64) error {
	return g.waitCond(ctx, func() bool { return g.reads > n })
}

func (g *gate) waitCond(ctx context.Context, cond func() bool) error {
	stop := context.AfterFunc(ctx, func() {
		g.mu.Lock()
		g.cond.Broadcast()
		g.mu.Unlock()
	})
	defer stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	for !cond() {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		g.cond.Wait()
	}
	return nil
}

func newGate(c net.Conn) *gate {
	g := &gate{Conn: c, budget: -1, readLeft: -1}
	g.cond.L = &g.mu
	return g
}

func (g *gate) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		g.mu.Lock()
		for g.budget == 0 && !g.closed {
			g.cond.Wait()
		}
		if g.closed {
			g.mu.Unlock()
			return n, net.ErrClosed
		}
		k := len(p) - n
		if g.budget > 0 && int64(k) > g.budget {
			k = int(g.budget)
		}
		g.mu.Unlock()
		w, err := g.Conn.Write(p[n : n+k])
		n += w
		g.mu.Lock()
		if g.budget > 0 {
			g.budget -= int64(w)
		}
		g.cond.Broadcast()
		g.mu.Unlock()
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// limit lets the peer write n more bytes, then stalls it.
func (g *gate) limit(n int64) {
	g.mu.Lock()
	g.budget = n
	g.mu.Unlock()
}

// waitStalled waits until the bytes limit allowed have been read by the
// requester (a net.Pipe write returns once its bytes are read).
func (g *gate) waitStalled(ctx context.Context) error {
	return g.waitCond(ctx, func() bool { return g.budget == 0 })
}

// open lets the peer read and write again.
func (g *gate) open() {
	g.mu.Lock()
	g.budget, g.readLeft = -1, -1
	g.cond.Broadcast()
	g.mu.Unlock()
}

func (g *gate) Close() error {
	g.mu.Lock()
	g.closed = true
	g.cond.Broadcast()
	g.mu.Unlock()
	return g.Conn.Close()
}

// mkCall builds an RPC call to the echo program with the given XID,
// procedure and arguments.
func mkCall(xid, proc uint32, args ...[]byte) []byte {
	var e xdr.Encoder
	oncrpc.AppendCallHeader(&e, xid, echoProg, 1, proc, oncrpc.AuthNone)
	b := e.Bytes()
	for _, a := range args {
		b = append(b, a...)
	}
	return b
}

// be32 encodes v as an XDR unsigned int.
func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

// result is a RoundTrip's outcome, delivered on a channel.
type result struct {
	rep *oncrpc.Reply
	err error
}

// goRoundTrip runs RoundTrip in a goroutine; the test collects it.
func goRoundTrip(ctx context.Context, tr *Transport, call *oncrpc.Call) <-chan result {
	ch := make(chan result, 1)
	go func() {
		rep, err := tr.RoundTrip(ctx, call)
		ch <- result{rep, err}
	}()
	return ch
}

// wait collects a RoundTrip started by goRoundTrip.
func (fp *fakePeer) wait(ch <-chan result) result {
	fp.t.Helper()
	select {
	case r := <-ch:
		return r
	case <-fp.ctx.Done():
		fp.t.Fatal("RoundTrip did not return")
		return result{}
	}
}
