package iwarp

import (
	"bufio"
	"net"
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

// TestListenerBoundsPendingConns: connections that stay silent in the MPA
// exchange hold a Listener's slots only up to maxPendingConns; the next
// connection is closed at once (RFC 5042 s6.4), and a slot freed by a
// connection that goes away serves a new one.
func TestListenerBoundsPendingConns(t *testing.T) {
	ctx := testCtx(t)
	ln, err := Listen("127.0.0.1:0", &verbs.ConnParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	silent := make([]net.Conn, maxPendingConns)
	for i := range silent {
		silent[i] = dial()
	}
	// Accepted after the silent ones (in connection order): no slot,
	// its MPA Request gets no Reply.
	req := mpaFrame{flags: mpaFlagEnhanced, rev: 2, pdata: enhancedPData(1, 1, nil)}
	extra := dial()
	if _, err := extra.Write(req.marshal()); err != nil {
		t.Fatal(err)
	}
	if rep, err := readMPAFrame(bufio.NewReader(extra)); err == nil {
		t.Fatalf("connection past the bound was served: %+v", rep)
	}
	// One silent connection goes away; its slot serves a connection
	// that speaks MPA (attempts that still find no slot are closed).
	silent[0].Close()
	for attempt := 1; ; attempt++ {
		if ctx.Err() != nil {
			t.Fatalf("no connection served after a slot was freed: %v", ctx.Err())
		}
		c := dial()
		if _, err := c.Write(req.marshal()); err != nil {
			continue
		}
		rep, err := readMPAFrame(bufio.NewReader(c))
		if err != nil {
			continue
		}
		if !rep.reply || rep.flags&mpaFlagReject != 0 {
			t.Fatalf("MPA reply %+v", rep)
		}
		t.Logf("served on attempt %d", attempt)
		break
	}
	qp, err := ln.AcceptQP(ctx)
	if err != nil {
		t.Fatal(err)
	}
	qp.Close()
}
