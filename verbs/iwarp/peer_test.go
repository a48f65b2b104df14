package iwarp

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/verbs"
)

// scriptPeer is a scripted iWARP peer at the DDP/RDMAP level: a raw TCP
// connection that has done the MPA exchange with a queue pair under test,
// on which the test writes hand-made FPDUs, whole or cut anywhere (a real
// peer cannot misbehave on demand), and reads what the queue pair sends.
// Frames carry no CRC. A new attack is a few lines of writes.
type scriptPeer struct {
	t       testing.TB
	conn    net.Conn
	br      *bufio.Reader
	readMSN uint32 // next MSN of our Read Requests (QN 1)
}

// newScriptPeer listens with sp (whose Setup may post receives: it runs
// before anything arrives), connects a scripted peer with IRD and ORD 16
// and returns the accepted queue pair.
func newScriptPeer(t testing.TB, sp *verbs.ConnParams) (*QP, *scriptPeer) {
	t.Helper()
	return newScriptPeerConn(t, sp, nil)
}

// newScriptPeerConn is newScriptPeer with the queue pair's end of the
// connection wrapped by wrap (nil: not wrapped), as a test sees or
// shapes what the queue pair reads and writes.
func newScriptPeerConn(t testing.TB, sp *verbs.ConnParams, wrap func(net.Conn) net.Conn) (*QP, *scriptPeer) {
	t.Helper()
	ctx := testCtx(t)
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := NewListener(wrapListener{tl, wrap}, sp)
	defer ln.Close()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p := &scriptPeer{t: t, conn: conn, br: bufio.NewReader(conn), readMSN: 1}
	req := mpaFrame{flags: mpaFlagEnhanced, rev: 2, pdata: enhancedPData(16, 16, nil)}
	if _, err := conn.Write(req.marshal()); err != nil {
		t.Fatal(err)
	}
	if rep, err := readMPAFrame(p.br); err != nil || !rep.reply || rep.flags&mpaFlagReject != 0 {
		t.Fatalf("MPA reply %+v: %v", rep, err)
	}
	qp, err := ln.AcceptQP(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		qp.Close()
	})
	return qp, p
}

// wrapListener wraps the connections it accepts with wrap, if set.
type wrapListener struct {
	net.Listener
	wrap func(net.Conn) net.Conn
}

func (l wrapListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil || l.wrap == nil {
		return c, err
	}
	return l.wrap(c), nil
}

// fpdu frames a ULPDU (RFC 5044 s4.1) with a zero CRC field.
func fpdu(ulpdu []byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(ulpdu)))
	b = append(b, ulpdu...)
	return append(b, make([]byte, -len(b)&3+4)...)
}

// taggedFPDU is the FPDU of one tagged segment (RDMA Write or Read
// Response) carrying payload to stag at to.
func taggedFPDU(op byte, last bool, stag uint32, to uint64, payload []byte) []byte {
	var h [taggedHdrLen]byte
	putTagged(h[:], last, op, stag, to)
	return fpdu(append(h[:], payload...))
}

// readRequestFPDU is the FPDU of an RDMA Read Request (RFC 5040 s4.4)
// with the peer's next read MSN.
func (p *scriptPeer) readRequestFPDU(rr readRequest) []byte {
	var b [untaggedHdrLen + readReqLen]byte
	n := putUntagged(b[:], true, opReadReq, 0, qnReadReq, p.readMSN, 0)
	p.readMSN++
	rr.put(b[n:])
	return fpdu(b[:])
}

// write sends raw bytes: whole FPDUs or any part of them.
func (p *scriptPeer) write(b []byte) error {
	_, err := p.conn.Write(b)
	return err
}

// mustWrite is write that fails the test on error.
func (p *scriptPeer) mustWrite(b []byte) {
	p.t.Helper()
	if err := p.write(b); err != nil {
		p.t.Fatalf("scripted peer: write: %v", err)
	}
}

// next reads the next FPDU the queue pair sent: its DDP header and
// payload.
func (p *scriptPeer) next() (ddpHeader, []byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(p.br, l[:]); err != nil {
		return ddpHeader{}, nil, err
	}
	ulen := int(binary.BigEndian.Uint16(l[:]))
	b := make([]byte, ulen+(-(2+ulen)&3)+4)
	if _, err := io.ReadFull(p.br, b); err != nil {
		return ddpHeader{}, nil, err
	}
	h, err := parseDDPHeader(b[:ulen])
	if err != nil {
		return h, nil, err
	}
	return h, b[h.hdlen:ulen], nil
}

// awaitData waits, until ctx ends, for the queue pair to send something,
// and leaves it unread.
func (p *scriptPeer) awaitData(ctx context.Context, what string) {
	p.t.Helper()
	if d, ok := ctx.Deadline(); ok {
		_ = p.conn.SetReadDeadline(d)
		defer p.conn.SetReadDeadline(time.Time{})
	}
	if _, err := p.br.Peek(1); err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
}

// terminate reads FPDUs until a Terminate (RFC 5040 s4.8) and returns
// it; other FPDUs go to skip, if set.
func (p *scriptPeer) terminate(skip func(ddpHeader, []byte)) (Terminate, error) {
	for {
		h, payload, err := p.next()
		if err != nil {
			return Terminate{}, fmt.Errorf("no Terminate: %w", err)
		}
		if !h.tagged() && h.opcode() == opTerminate {
			return parseTerminate(payload)
		}
		if skip != nil {
			skip(h, payload)
		}
	}
}

// scriptParams returns ConnParams for a scripted peer's queue pair:
// pd, IRD and ORD, and no receives posted.
func scriptParams(pd *verbs.ProtectionDomain, ird, ord int) *verbs.ConnParams {
	return &verbs.ConnParams{PD: pd, IRD: ird, ORD: ord}
}

// wait receives from ch or fails the test when ctx ends.
func wait(ctx context.Context, t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatalf("%s: %v", what, ctx.Err())
	}
}
