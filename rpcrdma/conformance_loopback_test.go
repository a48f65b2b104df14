package rpcrdma

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// Conformance tests against the in-process responder, over a version-1
// and a version-2 connection. CONFORMANCE.md maps the checklist ids to
// them.

// TestConformanceInlineDespiteChunks: the requester accepts an inline
// reply to a call that offered a Reply chunk (the responder sends a
// reply inline whenever it fits: RFC 8166 s4.3.3), and invalidates the
// unused chunk; a READ whose result fits inline offers no Write chunk and
// gets its data inline (s4.3.2).
func TestConformanceInlineDespiteChunks(t *testing.T) {
	forEachVersion(t, func(t *testing.T, v int) {
		env := newEnv(t, v, ResponderConfig{}, Config{})
		ctx := ctxMinute(t)
		before := env.tr.Stats()
		var e xdr.Encoder
		xid := env.clnt.StartCall(&e, procBigRepl, oncrpc.AuthNone)
		e.Uint32(100)
		rep, err := env.clnt.Do(ctx, &oncrpc.Call{XID: xid, Head: e.Bytes(), MaxReplySize: 50000})
		if err != nil {
			t.Fatal(err)
		}
		got := xdr.NewDecoder(rep.Results).Opaque(1 << 20)
		rep.Release()
		if !bytes.Equal(got, bytes.Repeat([]byte{0x5a}, 100)) {
			t.Fatalf("100-byte reply came back as %d bytes", len(got))
		}
		st := env.tr.Stats()
		if st.ReplyChunks != before.ReplyChunks+1 {
			t.Fatalf("no Reply chunk was offered for a 50000-byte maximum reply")
		}
		if n := env.tr.PD().LiveRemoteRegions(); n != 0 {
			t.Fatalf("%d regions left exposed", n)
		}

		lent, err := env.tr.Buffers().Get(100)
		if err != nil {
			t.Fatal(err)
		}
		defer lent.Release()
		dest := lent.Bytes()
		fill(dest, 0xff)
		if err := source(ctx, env.clnt, &e, oncrpc.Lent(lent)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(dest, make([]byte, 100)) {
			t.Fatal("READ data differs")
		}
		if st2 := env.tr.Stats(); st2.WriteChunks != st.WriteChunks || st2.InlineCalls != st.InlineCalls+1 {
			t.Fatalf("100-byte READ: %d Write chunks, %d inline calls", st2.WriteChunks-st.WriteChunks, st2.InlineCalls-st.InlineCalls)
		}
	})
}

// TestConformanceReceivesKeepUp: with a small grant, many more calls
// than credits, and replies held by the caller (their receive buffers
// lent), every reply finds a posted Receive of at least 1024 bytes: a Send
// that found none would break the connection (RFC 8166 s3.3, s3.3.1;
// bis-04 s7.2.2).
func TestConformanceReceivesKeepUp(t *testing.T) {
	forEachVersion(t, func(t *testing.T, v int) {
		const credits, workers, calls, held = 4, 32, 8, 12
		env := newEnv(t, v, ResponderConfig{Credits: credits}, Config{Credits: credits})
		ctx := ctxMinute(t)
		if err := env.echo(ctx, []byte("first"), nil); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var keep []*oncrpc.Reply
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range calls {
					var e xdr.Encoder
					xid := env.clnt.StartCall(&e, procEcho, oncrpc.AuthNone)
					e.Opaque(pattern(1000 + 97*w + i))
					rep, err := env.clnt.Do(ctx, &oncrpc.Call{XID: xid, Head: e.Bytes(), MaxReplySize: 3000})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					if len(keep) < held {
						keep = append(keep, rep)
						rep = nil
					}
					mu.Unlock()
					rep.Release()
				}
			}()
		}
		wg.Wait()
		for _, rep := range keep {
			rep.Release()
		}
		st := env.tr.Stats()
		if st.Connects != 1 || st.Dropped != 0 {
			t.Fatalf("%d connections, %d messages dropped", st.Connects, st.Dropped)
		}
		if got, want := env.resp.Calls(), uint64(1+workers*calls); got != want {
			t.Fatalf("responder served %d calls, want %d (no retransmission)", got, want)
		}
		if st.InlineRecv < DefaultInline || st.Credits != credits {
			t.Fatalf("receive buffers of %d bytes, grant %d", st.InlineRecv, st.Credits)
		}
		// With every reply given back, a Receive is posted for each
		// credit and each backward-direction slot (bis-04 s7.2.2.1).
		c := env.tr.conn
		c.mu.Lock()
		posted := 0
		for _, s := range c.recvState {
			if s == recvPosted {
				posted++
			}
		}
		c.mu.Unlock()
		if want := credits + env.tr.cfg.BackchannelSlots; posted != want {
			t.Fatalf("%d Receives posted, want %d (credits and backward slots)", posted, want)
		}
	})
}

// TestConformanceErrChunkNotRetried: an RDMA_ERROR ends its RPC for good:
// the call is not transmitted again (RFC 8166 s4.5).
func TestConformanceErrChunkNotRetried(t *testing.T) {
	forEachVersion(t, func(t *testing.T, v int) {
		_, seen := errChunkCall(t, v, "rejected", func(uint32) fault { return overflowReply })
		if n := seen.Load(); n != 1 {
			t.Fatalf("the rejected call reached the responder %d times", n)
		}
	})
}

// errChunkCall makes a call on a fresh environment whose responder
// handler meets its n-th arrival with the fault act(n) and serves every
// other call, and requires it to end in ERR_CHUNK. It returns the
// environment and how often the call reached the handler.
func errChunkCall(t *testing.T, v int, payload string, act func(n uint32) fault) (*testEnv, *atomic.Uint32) {
	t.Helper()
	var bad, seen atomic.Uint32
	env := newFaultEnv(t, v, ResponderConfig{}, func(xid uint32) fault {
		if xid != bad.Load() {
			return serveCall
		}
		return act(seen.Add(1))
	}, Config{})
	ctx := ctxMinute(t)
	if err := env.echo(ctx, []byte("first"), nil); err != nil {
		t.Fatal(err)
	}
	var e xdr.Encoder
	xid := env.clnt.StartCall(&e, procEcho, oncrpc.AuthNone)
	bad.Store(xid)
	e.Opaque([]byte(payload))
	if _, err := env.clnt.Do(ctx, &oncrpc.Call{XID: xid, Head: e.Bytes(), MaxReplySize: 100}); !errors.Is(err, ErrChunkRejected) {
		t.Fatalf("err = %v, want ERR_CHUNK", err)
	}
	return env, &seen
}

// TestConformanceAbandonedCallsFenced: a call that returns without a
// reply, because its caller gave up or because a retransmission with the
// same XID superseded it, leaves none of its memory exposed (RFC 8166
// s4.4.1, s8.1.3), and abandoning calls again and again does not cost the
// connection (s8.1.4).
func TestConformanceAbandonedCallsFenced(t *testing.T) {
	forEachVersion(t, func(t *testing.T, v int) {
		var dropping atomic.Bool
		arrived := make(chan uint32, 16)
		env := newFaultEnv(t, v, ResponderConfig{}, func(xid uint32) fault {
			if dropping.Load() {
				arrived <- xid
				return dropCall
			}
			return serveCall
		}, Config{})
		if err := env.echo(ctxMinute(t), []byte("first"), nil); err != nil {
			t.Fatal(err)
		}
		data := pattern(64 << 10)
		dropping.Store(true)
		for i := range 10 {
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- env.echo(ctx, data, make([]byte, len(data))) }()
			<-arrived // the responder holds the call: its chunks are exposed
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Fatalf("abandoned call %d: %v", i, err)
			}
			if n := env.tr.PD().LiveRemoteRegions(); n != 0 {
				t.Fatalf("abandoned call %d left %d regions exposed", i, n)
			}
		}
		// The same XID sent again supersedes the waiting call.
		var e xdr.Encoder
		xid := env.clnt.StartCall(&e, procEcho, oncrpc.AuthNone)
		e.Uint32(uint32(len(data)))
		call := &oncrpc.Call{XID: xid, Head: e.Bytes(), Bulk: oncrpc.Plain(data), ReplyBulk: oncrpc.Plain(make([]byte, len(data))), MaxReplySize: 128}
		errc := make(chan error, 1)
		go func() {
			_, err := env.tr.RoundTrip(ctxMinute(t), call)
			errc <- err
		}()
		<-arrived
		dropping.Store(false)
		rep, err := env.tr.RoundTrip(ctxMinute(t), call)
		if err != nil {
			t.Fatalf("retransmission: %v", err)
		}
		rep.Release()
		if err := <-errc; !errors.Is(err, oncrpc.ErrConnection) {
			t.Fatalf("superseded call: %v", err)
		}
		if n := env.tr.PD().LiveRemoteRegions(); n != 0 {
			t.Fatalf("%d regions exposed after the superseded call", n)
		}
		if err := env.echo(ctxMinute(t), data, make([]byte, len(data))); err != nil {
			t.Fatal(err)
		}
		if st := env.tr.Stats(); st.Connects != 1 {
			t.Fatalf("abandoned calls cost %d reconnects", st.Connects-1)
		}
	})
}

// TestConformanceErrChunkAfterReconnect: the responder loses the
// connection while it holds a call, then answers the retransmission with
// ERR_CHUNK (no reply is possible any more): the RPC fails and is not
// sent a third time (RFC 8166 s4.5.3).
func TestConformanceErrChunkAfterReconnect(t *testing.T) {
	forEachVersion(t, func(t *testing.T, v int) {
		env, seen := errChunkCall(t, v, "lost, then refused", func(n uint32) fault {
			if n == 1 {
				return hangUp
			}
			return overflowReply
		})
		if err := env.echo(ctxMinute(t), []byte("after"), nil); err != nil {
			t.Fatal(err)
		}
		if n, c := seen.Load(), env.tr.Stats().Connects; n != 2 || c != 2 {
			t.Fatalf("the call reached the responder %d times over %d connections, want 2 and 2", n, c)
		}
	})
}
