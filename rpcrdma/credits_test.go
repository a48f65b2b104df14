package rpcrdma

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// Credits against the fake peer: it posts exactly as many receive
// buffers as it grants and keeps a call's buffer until it answers, so a
// requester that sent one message too many would find no buffer and lose
// the connection (RFC 5040 s5.3), besides the peer's own count.

// smallCall is a NULL-like echo call that goes inline.
func smallCall(xid uint32) *oncrpc.Call {
	return &oncrpc.Call{XID: xid, Head: mkCall(xid, procEcho, be32(0)), MaxReplySize: 128}
}

// serveWindow answers n calls, collecting as many as the window allows
// before answering them together, so that a requester sending fewer than
// it may would stall the test and one sending more would break the
// connection. The first call of a connection comes alone (RFC 8166
// s3.3.3).
func serveWindow(t *testing.T, pc *peerConn, n, window int) {
	t.Helper()
	pc.reply(pc.recvCall(), be32(0))
	for done := 1; done < n; {
		var held []*peerMsg
		for len(held) < min(window, n-done) {
			held = append(held, pc.recvCall())
		}
		for _, m := range held {
			pc.reply(m, be32(0))
		}
		done += len(held)
	}
}

// TestHostileCreditGrants: a grant of 0 counts as 1 (RFC 8166 s3.3.1
// forbids 0; treating it as 1 cannot deadlock), a grant above what we
// asked for is capped at our request (s3.3.1: the window is the smaller
// of the two; more would outrun our receive buffers), and in between the
// grant is the window, exactly.
func TestHostileCreditGrants(t *testing.T) {
	const ours = 8
	for _, tc := range []struct {
		grant  uint32
		window int
	}{{0, 1}, {1, 1}, {5, 5}, {1 << 31, ours}} {
		t.Run(fmt.Sprint(tc.grant), func(t *testing.T) {
			fp := newFakePeer(t, peerOpts{Recvs: tc.window, HoldCalls: true})
			tr := fp.transport(Config{Version: Version1, Credits: ours})
			const calls = 60
			chs := make([]<-chan result, calls)
			for i := range chs {
				chs[i] = goRoundTrip(fp.ctx, tr, smallCall(uint32(100+i)))
			}
			pc := fp.accept()
			pc.credits = tc.grant
			serveWindow(t, pc, calls, tc.window)
			for _, ch := range chs {
				if r := fp.wait(ch); r.err != nil {
					t.Fatal(r.err)
				} else {
					r.rep.Release()
				}
			}
			if got := pc.maxOutstanding(); got != tc.window {
				t.Fatalf("at most %d calls outstanding, want the window of %d", got, tc.window)
			}
			if st := tr.Stats(); st.Connects != 1 || st.Credits != tc.window {
				t.Fatalf("connections %d, credits %d; want 1, %d", st.Connects, st.Credits, tc.window)
			}
		})
	}
}

// TestV2GrantOneInitXch: version 2 with transport characteristics and a
// grant of 1 completes 1000 calls, never more than one message
// outstanding: our ROPT_INITXCH is one-way and would hold the only credit
// until a reply that could never come, so it waits. When the grant grows
// to 2 it goes out; the peer refuses it with INVAL_OPTION, which returns
// its credit, and calls go on within the window of 2.
func TestV2GrantOneInitXch(t *testing.T) {
	fp := newFakePeer(t, peerOpts{Credits: 1, Recvs: 2, Posted: 1, HoldCalls: true})
	tr := fp.transport(Config{XChars: true, Credits: 8})
	const calls = 1000
	errs := make(chan error, calls)
	go func() {
		// Eight callers keep the requester's window full.
		sem := make(chan struct{}, 8)
		for i := range calls {
			sem <- struct{}{}
			go func() {
				defer func() { <-sem }()
				rep, err := tr.RoundTrip(fp.ctx, smallCall(uint32(1000+i)))
				rep.Release()
				errs <- err
			}()
		}
	}()
	pc := fp.accept()
	// The peer announces its own characteristics once version 2 is
	// confirmed (xcharext s4.1); the requester takes them whatever its
	// credits.
	m := pc.recvCall()
	if m.Hdr.Vers != Version2 {
		t.Fatalf("first call is version %d, want the version-2 probe", m.Hdr.Vers)
	}
	pc.reply(m, be32(0))
	pc.send(Header{XID: 77, Vers: Version2, Credit: 1, Proc: ProcOptional, OptType: OptInitXch,
		OptInfo: InitXch{Start: []XCharVal{Uint32Val(XCharRBSize, 4096)}}.Marshal()})
	for range calls - 1 {
		m := pc.recv()
		if !m.IsCall {
			t.Fatalf("message of proc %d type %d with a grant of 1: the requester exceeded the window", m.Hdr.Proc, m.Hdr.OptType)
		}
		pc.reply(m, be32(0))
	}
	for range calls {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := pc.maxOutstanding(); got != 1 {
		t.Fatalf("up to %d messages outstanding with a grant of 1", got)
	}
	st := tr.Stats()
	if st.Version != 2 || !st.PeerAnnounced || st.Connects != 1 {
		t.Fatalf("after %d calls: %+v", calls, st)
	}

	// A grant of 2: INITXCH goes out with the next reply's credit.
	pc.postMore()
	pc.credits = 2
	ch := goRoundTrip(fp.ctx, tr, smallCall(5000))
	pc.reply(pc.recvCall(), be32(0))
	if r := fp.wait(ch); r.err != nil {
		t.Fatal(r.err)
	}
	ch = goRoundTrip(fp.ctx, tr, smallCall(5001))
	var call *peerMsg
	var initXch *peerMsg
	for call == nil || initXch == nil {
		m := pc.recv()
		switch {
		case m.IsCall:
			call = m
		case m.Hdr.Proc == ProcOptional && m.Hdr.OptType == OptInitXch:
			initXch = m
		default:
			t.Fatalf("unexpected message proc %d", m.Hdr.Proc)
		}
	}
	// INVAL_OPTION: the peer does not take characteristics (v2 draft
	// s3.1); it comes before the call's reply, in order.
	pc.send(Header{XID: initXch.Hdr.XID, Vers: Version2, Credit: 2, Proc: ProcError, ErrCode: ErrOption})
	pc.reply(call, be32(0))
	if r := fp.wait(ch); r.err != nil {
		t.Fatal(r.err)
	}
	chs := make([]<-chan result, 40)
	for i := range chs {
		chs[i] = goRoundTrip(fp.ctx, tr, smallCall(uint32(6000+i)))
	}
	for done := 0; done < len(chs); {
		a, b := pc.recvCall(), pc.recvCall()
		pc.reply(a, be32(0))
		pc.reply(b, be32(0))
		done += 2
	}
	for _, ch := range chs {
		if r := fp.wait(ch); r.err != nil {
			t.Fatal(r.err)
		}
	}
	if got := pc.maxOutstanding(); got != 2 {
		t.Fatalf("up to %d messages outstanding with a grant of 2", got)
	}
	if st := tr.Stats(); st.OptionalErrors != 1 || st.Connects != 1 {
		t.Fatalf("after INITXCH was refused: %+v", st)
	}
}

// TestHostileInvalOptionStorm: RDMA_OPTIONALs of an unknown type in bulk
// draw INVAL_OPTION (v2 draft s3.1) only as far as credits allow, one
// credit always staying free for calls; the rest go unanswered. Nothing
// grows with their number: no goroutines, no sends beyond the window.
// (Each burst stays within the receive buffers we post, credits plus
// backward slots: a peer that sends more than that finds no buffer and
// loses the connection, RFC 8166 s3.3.)
func TestHostileInvalOptionStorm(t *testing.T) {
	const grant, rounds, burst = 4, 50, 10
	fp := newFakePeer(t, peerOpts{Credits: grant, Recvs: grant, HoldCalls: true})
	tr := fp.transport(Config{Credits: 8})
	goroutines := runtime.NumGoroutine()
	answers := 0
	var pc *peerConn
	for round := range rounds {
		ch := goRoundTrip(fp.ctx, tr, smallCall(uint32(10+round)))
		if pc == nil {
			pc = fp.accept()
		}
		var m *peerMsg
		for m == nil {
			msg := pc.recv()
			switch {
			case msg.IsCall:
				m = msg
			case msg.Hdr.Proc == ProcError && msg.Hdr.ErrCode == ErrOption && msg.Hdr.Credit != 0 &&
				msg.Hdr.Vers == Version2 && msg.Hdr.XID>>8 < rounds && msg.Hdr.XID&0xff < burst:
				// The answer echoes an RDMA_OPTIONAL's XID and
				// version (RFC 8166 s4.5).
				answers++
			default:
				t.Fatalf("unexpected message: proc %d err %d credit %d", msg.Hdr.Proc, msg.Hdr.ErrCode, msg.Hdr.Credit)
			}
		}
		if round > 0 {
			for i := range burst {
				pc.send(Header{XID: uint32(round<<8 | i), Vers: Version2, Credit: grant, Proc: ProcOptional, OptType: 0x7fff})
			}
		}
		pc.reply(m, be32(0))
		if r := fp.wait(ch); r.err != nil {
			t.Fatal(r.err)
		} else {
			r.rep.Release()
		}
	}
	if got := pc.maxOutstanding(); got > grant {
		t.Fatalf("%d messages outstanding with a grant of %d", got, grant)
	}
	st := tr.Stats()
	sent := uint64((rounds - 1) * burst)
	// The answers to the last burst are on their way.
	for uint64(answers) < sent-st.OptionalAnswersDropped {
		if m := pc.recv(); m.Hdr.Proc != ProcError || m.Hdr.ErrCode != ErrOption || m.Hdr.XID>>8 != rounds-1 {
			t.Fatalf("unexpected message: proc %d", m.Hdr.Proc)
		}
		answers++
	}
	if st.OptionalsRejected != sent || st.OptionalAnswersDropped+uint64(answers) != sent || answers == 0 {
		t.Fatalf("%d optionals: %d rejected, %d answers received, %d dropped", sent, st.OptionalsRejected, answers, st.OptionalAnswersDropped)
	}
	if st.Connects != 1 {
		t.Fatalf("%d connections", st.Connects)
	}
	if n := runtime.NumGoroutine(); n > goroutines+10 {
		t.Fatalf("%d goroutines after the storm, %d before", n, goroutines)
	}
}

// TestV2RespXchWithinCredits: our ROPT_RESPXCH answering the peer's
// ROPT_REQXCH (xcharext s4.2) is one-way and counts against the grant:
// with a grant of 1 it waits, calls going on, and it goes out, with the
// request's XID (s4.3), once a second credit is granted.
func TestV2RespXchWithinCredits(t *testing.T) {
	fp := newFakePeer(t, peerOpts{Credits: 1, Recvs: 2, Posted: 1, HoldCalls: true})
	tr := fp.transport(Config{Version: Version2, Credits: 8})
	pc := warmUp(t, fp, tr)
	pc.send(Header{XID: 0x4242, Vers: Version2, Credit: 1, Proc: ProcOptional, OptType: OptReqXch,
		OptInfo: ReqXch{Want: []XCharVal{Uint32Val(XCharRBSize, 2048)}}.Marshal()})
	for i := range 20 {
		ch := goRoundTrip(fp.ctx, tr, smallCall(uint32(100+i)))
		m := pc.recv()
		if !m.IsCall {
			t.Fatalf("message proc %d type %d with a grant of 1", m.Hdr.Proc, m.Hdr.OptType)
		}
		pc.reply(m, be32(0))
		if r := fp.wait(ch); r.err != nil {
			t.Fatal(r.err)
		}
	}
	pc.postMore()
	pc.credits = 2
	ch := goRoundTrip(fp.ctx, tr, smallCall(200))
	pc.reply(pc.recvCall(), be32(0))
	if r := fp.wait(ch); r.err != nil {
		t.Fatal(r.err)
	}
	m := pc.recv()
	if m.Hdr.Proc != ProcOptional || m.Hdr.OptType != OptRespXch || m.Hdr.XID != 0x4242 {
		t.Fatalf("got proc %d type %d xid %#x, want the RESPXCH for xid 0x4242", m.Hdr.Proc, m.Hdr.OptType, m.Hdr.XID)
	}
	resp, err := ParseRespXch(m.Hdr.OptInfo)
	if err != nil || !resp.Done.Has(0) {
		t.Fatalf("RESPXCH %+v (%v): a smaller RBSIZ is done", resp, err)
	}
	if got := pc.maxOutstanding(); got > 2 {
		t.Fatalf("%d messages outstanding", got)
	}
}

// TestTimeoutReconnects checks that a call the peer never answers is sent
// again, once the Client's timeout passes, over a new connection and not
// on the one it went out on (rfc5666bis s7.3.2, checklist B4-7.3.2-a;
// RFC 8881 s2.9.2), and that the old connection is gone.
func TestTimeoutReconnects(t *testing.T) {
	fp := newFakePeer(t, peerOpts{Credits: 4})
	tr := fp.transport(Config{Version: Version1, Credits: 8})
	clnt := oncrpc.NewClient(tr, echoProg, 1, oncrpc.ClientOptions{Timeout: 50 * time.Millisecond, Hard: true})
	call := &oncrpc.Call{XID: 7, Head: mkCall(7, procEcho, be32(0)), MaxReplySize: 128}
	ch := make(chan error, 1)
	go func() {
		rep, err := clnt.Do(fp.ctx, call)
		if err == nil {
			rep.Release()
		}
		ch <- err
	}()
	first := fp.accept()
	if m := first.recvCall(); m.RPCXID != 7 {
		t.Fatalf("first transmission XID %#x", m.RPCXID)
	} // and never answered
	second := fp.accept()
	m := second.recvCall()
	if m.RPCXID != 7 {
		t.Fatalf("retransmission XID %#x, want 7", m.RPCXID)
	}
	second.reply(m, be32(0))
	select {
	case err := <-ch:
		if err != nil {
			t.Fatal(err)
		}
	case <-fp.ctx.Done():
		t.Fatal("call did not return")
	}
	if _, err := first.tryRecv(); err == nil {
		t.Fatal("first connection still carries messages after the timeout")
	}
}
