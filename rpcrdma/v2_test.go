package rpcrdma

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// Tests of RPC-over-RDMA version 2 (draft-cel-nfsv4-rpcrdma-version-two-00)
// and transport characteristics (draft-dnoveck-nfsv4-rpcrdma-xcharext-02)
// against the in-process responder. CONFORMANCE.md maps the checklist's
// requirement ids to these tests.

func ctxMinute(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond for up to ten seconds (no timing assertion: it only
// keeps a broken test from hanging).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 1000 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// respondOptional plays a version-2 peer's part: the responder sends an
// RDMA_OPTIONAL of type opt, with any info, on each of its version-2
// connections, as the peer's side of a test.
func respondOptional(s *Responder, opt uint32, info []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.mu.Lock()
		v2 := c.vers == Version2
		c.mu.Unlock()
		if v2 {
			c.sendOptional(opt, info, 0)
		}
	}
}

// sendOptional has tr send a one-way RDMA_OPTIONAL of type opt, with any
// info (unknown types, malformed bodies), on its version-2 connection,
// the way it sends its own INITXCH.
func sendOptional(ctx context.Context, tr *Transport, opt uint32, info []byte) error {
	c, err := tr.connection(ctx)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	if c.neg.st != negV2 {
		return errors.New("RDMA_OPTIONAL needs a version-2 connection")
	}
	h := Header{XID: c.optXIDLocked(), Vers: Version2, Credit: uint32(tr.cfg.Credits), Proc: ProcOptional, OptType: opt, OptInfo: info}
	if !c.sendOneWayLocked(&h) {
		return errors.New("no credit free for a one-way RDMA_OPTIONAL")
	}
	c.neg.optXIDs[h.XID] = optSent{opt: opt, seq: c.oneWay[len(c.oneWay)-1]}
	return nil
}

// bigCall sends a procedure-1 echo of n bytes entirely in the Head (no
// DDP-eligible part), so it goes inline only if it fits the threshold.
func (env *testEnv) bigCall(ctx context.Context, n int) error {
	var e xdr.Encoder
	xid := env.clnt.StartCall(&e, procEcho, oncrpc.AuthNone)
	e.Opaque(pattern(n))
	rep, err := env.clnt.Do(ctx, &oncrpc.Call{XID: xid, Head: e.Bytes(), MaxReplySize: n + 200})
	if err != nil {
		return err
	}
	rep.Release()
	return nil
}

func TestV2Negotiated(t *testing.T) {
	env := newEnv(t, Version2, ResponderConfig{}, Config{})
	ctx := ctxMinute(t)
	if err := env.echo(ctx, []byte("probe"), nil); err != nil {
		t.Fatal(err)
	}
	st := env.tr.Stats()
	// V2-5.1-a: after a non-error v2 reply both sides use 4096.
	if st.Version != 2 || st.Fallbacks != 0 || st.InlineSend != 4096 {
		t.Fatalf("after the probe: %+v", st)
	}
	// A 4000-byte call now goes inline (V2-2.3-b).
	before := env.tr.Stats().InlineCalls
	if err := env.bigCall(ctx, 3900); err != nil {
		t.Fatal(err)
	}
	if env.tr.Stats().InlineCalls != before+1 {
		t.Fatal("3900-byte call did not go inline on version 2")
	}
	// Our INITXCH reached the responder and its INITXCH reached us.
	waitFor(t, "the responder's INITXCH", func() bool { _, ok := env.tr.PeerChars(); return ok })
}

func TestV2ProbeIsSmall(t *testing.T) {
	// V2-5-b: the first message is at most 1024 bytes even when the first
	// call is larger; it goes as a long call.
	env := newEnv(t, Version2, ResponderConfig{}, Config{})
	if err := env.bigCall(ctxMinute(t), 2000); err != nil {
		t.Fatal(err)
	}
	if st := env.tr.Stats(); st.PosZeroChunks != 1 || st.InlineCalls != 0 {
		t.Fatalf("2000-byte probe: %+v, want a Position-Zero Read chunk", st)
	}
}

func TestV2FallbackToV1(t *testing.T) {
	// V2-5.2-a, V2-5.2-d: ERR_VERS 1..1 switches the same connection to
	// version 1 and the probe call completes.
	env := newEnv(t, Version1, ResponderConfig{}, Config{})
	ctx := ctxMinute(t)
	if err := env.echo(ctx, []byte("probe"), nil); err != nil {
		t.Fatalf("probe call: %v", err)
	}
	st := env.tr.Stats()
	if st.Version != 1 || st.Fallbacks != 1 || st.Connects != 1 || st.InlineSend != 4096 {
		t.Fatalf("after fallback: %+v", st)
	}
	// No RDMA_OPTIONAL ever goes to a version-1 peer (V2-5-d): not
	// our INITXCH, and a characteristics change is refused.
	if err := env.tr.RequestChange(ctx, []XCharVal{Uint32Val(XCharRBSize, 8192)}); err == nil {
		t.Fatal("REQXCH sent on a version-1 connection")
	}
	if st := env.tr.Stats(); st.OptionalErrors != 0 || env.resp.OptionalErrors() != 0 {
		t.Fatalf("RDMA_OPTIONALs on a version-1 connection: %+v, responder refused %d", st, env.resp.OptionalErrors())
	}
}

func TestV2StrictAgainstV1Peer(t *testing.T) {
	// rdmavers=2 against a version-1 peer: a clear error, no loop.
	env := newEnv(t, Version1, ResponderConfig{}, Config{Version: Version2})
	env.clnt = oncrpc.NewClient(env.tr, echoProg, 1, oncrpc.ClientOptions{Timeout: 5 * time.Second, Retrans: 1})
	err := env.echo(ctxMinute(t), []byte("x"), nil)
	if !errors.Is(err, ErrVersion) {
		t.Fatalf("err = %v, want ErrVersion", err)
	}
}

func TestV2LossAfterErrVersStartsAtV1(t *testing.T) {
	// V2-5.2-b: the connection drops right after ERR_VERS; the next
	// connection starts at version 1 with no second probe.
	var n atomic.Int32
	env := newFaultEnv(t, Version1, ResponderConfig{}, func(uint32) fault {
		if n.Add(1) == 1 {
			return hangUp
		}
		return serveCall
	}, Config{})
	if err := env.echo(ctxMinute(t), []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	st := env.tr.Stats()
	if st.Connects != 2 || st.Fallbacks != 1 || st.Version != 1 {
		t.Fatalf("stats %+v: want 2 connections, 1 fallback, version 1", st)
	}
}

func TestV2InitXchRaisesThreshold(t *testing.T) {
	// XC-3.1-c, XC-4.1-b: the responder does not do characteristics (it
	// answers our INITXCH with INVAL_OPTION and we carry on); a 6000-byte
	// call is a long call. Then it announces RBSIZ=8192 and the same call
	// goes inline.
	env := newEnv(t, Version2, ResponderConfig{InlineRecv: 8192, InlineSend: 8192}, Config{InlineSend: 8192, InlineRecv: 8192})
	env.resp.cfg.XChars = false
	ctx := ctxMinute(t)
	if err := env.echo(ctx, []byte("probe"), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "INVAL_OPTION for our INITXCH", func() bool { return env.tr.Stats().OptionalErrors == 1 })
	before := env.tr.Stats()
	if err := env.bigCall(ctx, 6000); err != nil {
		t.Fatal(err)
	}
	if st := env.tr.Stats(); st.InlineCalls != before.InlineCalls || st.PosZeroChunks != before.PosZeroChunks+1 {
		t.Fatalf("6000-byte call before RBSIZ: %+v", st)
	}
	respondOptional(env.resp, OptInitXch, InitXch{Start: []XCharVal{Uint32Val(XCharRBSize, 8192)}}.Marshal())
	waitFor(t, "RBSIZ=8192", func() bool { c, _ := env.tr.PeerChars(); return c.RBSize == 8192 })
	before = env.tr.Stats()
	if err := env.bigCall(ctx, 6000); err != nil {
		t.Fatal(err)
	}
	if st := env.tr.Stats(); st.InlineCalls != before.InlineCalls+1 || st.InlineSend != 8192 {
		t.Fatalf("6000-byte call after RBSIZ=8192: %+v", st)
	}
}

func TestV2RemoteInvalidateFollowsReqRemInv(t *testing.T) {
	// XC-3.2-a: while the requester says XCHAR_REQREMINV=FALSE, no Send
	// With Invalidate arrives; with TRUE the responder may use it.
	for _, accept := range []bool{false, true} {
		env := newEnv(t, Version2, ResponderConfig{RemoteInvalidate: true}, Config{AcceptInvalidate: accept})
		ctx := ctxMinute(t)
		if err := env.echo(ctx, []byte("probe"), nil); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			data := pattern(100 << 10)
			if err := env.echo(ctx, data, make([]byte, len(data))); err != nil {
				t.Fatal(err)
			}
		}
		if got := env.resp.SendInvalidates(); (got > 0) != accept {
			t.Fatalf("REQREMINV=%v: %d replies used Send With Invalidate", accept, got)
		}
		if n := env.tr.PD().LiveRemoteRegions(); n != 0 {
			t.Fatalf("%d live regions", n)
		}
	}
}

func TestV2ReqXchDoneRejPend(t *testing.T) {
	env := newEnv(t, Version2, ResponderConfig{InlineSend: 16384}, Config{InlineSend: 16384, InlineRecv: 16384})
	ctx := ctxMinute(t)
	if err := env.echo(ctx, []byte("probe"), nil); err != nil {
		t.Fatal(err)
	}
	// XC-4.2-a, XC-4.3-b: RBSIZ growth is pending; BRS (not changeable
	// there), an experimental id and a duplicate RBSIZ are rejected.
	want := []XCharVal{Uint32Val(XCharRBSize, 16384), Uint32Val(XCharBRS, BRSGenl),
		Uint32Val(xcharExperimentalFirst+1, 1), Uint32Val(XCharRBSize, 2048)}
	if err := env.tr.RequestChange(ctx, want); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pending RBSIZ change", func() bool { return env.tr.PendingChange(XCharRBSize) })
	// XC-4.4-d: an UPDXCH with pendclr=FALSE applies at once and leaves
	// the request pending.
	respondOptional(env.resp, OptUpdXch, UpdXch{Now: Uint32Val(XCharRBSize, 8192)}.Marshal())
	waitFor(t, "interim RBSIZ=8192", func() bool { c, _ := env.tr.PeerChars(); return c.RBSize == 8192 })
	if !env.tr.PendingChange(XCharRBSize) {
		t.Fatal("pendclr=FALSE closed the pending request")
	}
	// XC-4.3-d, XC-4.4-c: the responder replaces its receive buffers as
	// they are used, then reports the size with UPDXCH pendclr=TRUE.
	// Until then a 10000-byte call is a long call.
	for i := 0; env.tr.PendingChange(XCharRBSize) && i < 200; i++ {
		if err := env.echo(ctx, []byte("tick"), nil); err != nil {
			t.Fatal(err)
		}
		if c, _ := env.tr.PeerChars(); c.RBSize > 8192 && env.tr.PendingChange(XCharRBSize) {
			t.Fatal("RBSIZ applied before pendclr")
		}
	}
	waitFor(t, "UPDXCH pendclr", func() bool { return !env.tr.PendingChange(XCharRBSize) })
	if c, _ := env.tr.PeerChars(); c.RBSize != 16384 {
		t.Fatalf("peer RBSIZ %d after UPDXCH, want 16384", c.RBSize)
	}
	before := env.tr.Stats().InlineCalls
	if err := env.bigCall(ctx, 10000); err != nil {
		t.Fatal(err)
	}
	if env.tr.Stats().InlineCalls != before+1 {
		t.Fatal("10000-byte call not inline after the receive buffers grew")
	}
	// XC-4.3-c: "done" applies at once: asking for a smaller buffer.
	if err := env.tr.RequestChange(ctx, []XCharVal{Uint32Val(XCharRBSize, 2048)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "RBSIZ=2048 done", func() bool { c, _ := env.tr.PeerChars(); return c.RBSize == 2048 })
	before = env.tr.Stats().InlineCalls
	if err := env.bigCall(ctx, 3000); err != nil {
		t.Fatal(err)
	}
	if env.tr.Stats().InlineCalls != before {
		t.Fatal("3000-byte call went inline after RBSIZ=2048")
	}
}

func TestV2UnknownAndMalformedOptionals(t *testing.T) {
	env := newEnv(t, Version2, ResponderConfig{}, Config{})
	ctx := ctxMinute(t)
	if err := env.echo(ctx, []byte("probe"), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "INITXCH", func() bool { _, ok := env.tr.PeerChars(); return ok })
	// V2-3.1-a: an unknown opttype from the peer draws INVAL_OPTION.
	respondOptional(env.resp, 0x7fff, []byte{1, 2, 3, 4})
	waitFor(t, "INVAL_OPTION", func() bool { return env.tr.Stats().OptionalsRejected == 1 })
	// XC-2.1-a: xchv_data running past the message: BAD_HEADER.
	bad := []byte{0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0xff, 0xff}
	respondOptional(env.resp, OptInitXch, bad)
	waitFor(t, "BAD_HEADER", func() bool { return env.tr.Stats().OptionalsRejected == 2 })
	// XC-2.1-b, XC-7-a: RBSIZ of 2 bytes, RBSIZ of 16: BAD_HEADER, and
	// the old value stays.
	short := InitXch{Start: []XCharVal{{Which: XCharRBSize, Data: []byte{0, 1}}}}.Marshal()
	respondOptional(env.resp, OptInitXch, short)
	tiny := InitXch{Start: []XCharVal{Uint32Val(XCharRBSize, 16)}}.Marshal()
	respondOptional(env.resp, OptInitXch, tiny)
	waitFor(t, "two more BAD_HEADERs", func() bool { return env.tr.Stats().OptionalsRejected == 4 })
	if c, _ := env.tr.PeerChars(); c.RBSize != 4096 {
		t.Fatalf("RBSIZ %d after malformed INITXCHs", c.RBSize)
	}
	// XC-2.1-c, XC-6.2-a: unknown and experimental ids are ignored, the
	// rest applies.
	mixed := InitXch{Start: []XCharVal{Uint32Val(0x80000000, 1), Uint32Val(xcharExperimentalFirst, 7), Uint32Val(XCharRBSize, 8192)}}.Marshal()
	respondOptional(env.resp, OptInitXch, mixed)
	waitFor(t, "RBSIZ=8192", func() bool { c, _ := env.tr.PeerChars(); return c.RBSize == 8192 })
	if st := env.tr.Stats(); st.OptionalsRejected != 4 {
		t.Fatalf("unknown ids drew an error: %+v", st)
	}
	// Our unknown opttype and a malformed INITXCH to the responder.
	before := env.resp.OptionalErrors()
	if err := sendOptional(ctx, env.tr, 0x7fff, nil); err != nil {
		t.Fatal(err)
	}
	if err := sendOptional(ctx, env.tr, OptInitXch, bad); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "responder errors", func() bool { return env.resp.OptionalErrors() == before+2 })
	waitFor(t, "their arrival", func() bool { return env.tr.Stats().OptionalErrors >= 2 })
	// The connection survived all of it.
	if err := env.echo(ctx, []byte("still here"), nil); err != nil {
		t.Fatal(err)
	}
	if st := env.tr.Stats(); st.Connects != 1 {
		t.Fatalf("%d connections", st.Connects)
	}
}

func TestXCharSubsetBits(t *testing.T) {
	// XC-2.1-e: entry N is bit N mod 32 of word N div 32, bit 0 the LSB.
	s := Subset{}.With(0).With(33)
	if len(s) != 2 || s[0] != 1 || s[1] != 2 {
		t.Fatalf("subset %v", s)
	}
	if !s.Has(33) || s.Has(32) || s.Has(64) || (Subset{1}).Has(32) {
		t.Fatal("Has")
	}
}

func TestOptionalGolden(t *testing.T) {
	// xdr.x header note: RDMA_OPTIONAL with INITXCH {RBSIZ=8192}, nochg
	// {0} is 48 octets; INVAL_OPTION is 20.
	var e xdr.Encoder
	h := Header{XID: 1, Vers: 2, Credit: 1, Proc: ProcOptional, OptType: OptInitXch,
		OptInfo: InitXch{Start: []XCharVal{Uint32Val(XCharRBSize, 8192)}, NoChg: Subset{0}}.Marshal()}
	h.Append(&e)
	if e.Len() != 48 {
		t.Fatalf("INITXCH message %d octets, want 48: %x", e.Len(), e.Bytes())
	}
	e.Reset(nil)
	(&Header{XID: 1, Vers: 2, Proc: ProcError, ErrCode: ErrOption}).Append(&e)
	if e.Len() != 20 {
		t.Fatalf("INVAL_OPTION %d octets", e.Len())
	}
	var d Header
	if _, err := d.Decode(e.Bytes(), true); err != nil || d.ErrCode != ErrOption {
		t.Fatalf("decode: %v %+v", err, d)
	}
	if _, err := d.Decode(e.Bytes(), false); err == nil {
		t.Fatal("INVAL_OPTION accepted by a version-1 decoder")
	}
}

// TestAnswerReqXchDisjoint checks the loop both sides answer REQXCH
// with (xcharext s4.3): done, rej and pend are disjoint and cover the
// request; duplicates, unknown ids and malformed values are rejected
// without reaching decide, which sees ours with the one entry applied.
func TestAnswerReqXchDisjoint(t *testing.T) {
	ours := Chars{RBSize: 4096, BRS: BRSInline}
	want := []XCharVal{
		Uint32Val(XCharRBSize, 8192),                // 0: pend
		Uint32Val(XCharBRS, BRSGenl),                // 1: done
		Uint32Val(XCharRBSize, 2048),                // 2: duplicate id
		Uint32Val(xcharExperimentalFirst, 1),        // 3: unknown
		{Which: XCharReqRemInv, Data: []byte{0, 0}}, // 4: malformed
		BoolVal(XCharReqRemInv, true),               // 5: a duplicate of a malformed id
	}
	var seen []Chars
	decide := func(v XCharVal, w Chars) xchAnswer {
		seen = append(seen, w)
		switch v.Which {
		case XCharRBSize:
			return xchPend
		case XCharBRS:
			return xchDone
		}
		return xchRej
	}
	check := func(r RespXch, in []string) {
		t.Helper()
		for i := range in {
			var got []string
			for name, s := range map[string]Subset{"done": r.Done, "rej": r.Rej, "pend": r.Pend} {
				if s.Has(i) {
					got = append(got, name)
				}
			}
			if len(got) != 1 || got[0] != in[i] {
				t.Errorf("entry %d in %v, want [%s]", i, got, in[i])
			}
		}
		if r.Done.Has(len(in)) || r.Rej.Has(len(in)) || r.Pend.Has(len(in)) {
			t.Errorf("answer %+v names an entry past the %d requested", r, len(in))
		}
	}
	check(answerReqXch(ReqXch{Want: want}, ours, decide), []string{"pend", "done", "rej", "rej", "rej", "rej"})
	wantSeen := []Chars{{RBSize: 8192, BRS: BRSInline}, {RBSize: 4096, BRS: BRSGenl}}
	if !slices.Equal(seen, wantSeen) {
		t.Errorf("decide saw %+v, want %+v", seen, wantSeen)
	}
	seen = nil
	check(answerReqXch(ReqXch{Want: []XCharVal{BoolVal(XCharReqRemInv, true)}}, ours, decide), []string{"rej"})
	if want := []Chars{{RBSize: 4096, ReqRemInv: true, BRS: BRSInline}}; !slices.Equal(seen, want) {
		t.Errorf("decide saw %+v, want %+v", seen, want)
	}
}
