package rpcrdma

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// The echo program used against the in-process responder: procedure 1
// returns its opaque argument as an opaque result, which is DDP-eligible
// in both directions, like NFS WRITE data and READ data. Procedure 2
// returns a result of the size its argument asks for, not DDP-eligible,
// like a large READDIR.
const (
	echoProg    = 0x20000099
	procEcho    = 1
	procBigRepl = 2
	procSink    = 3 // consumes opaque data (like WRITE), returns its length
	procSource  = 4 // returns n bytes of DDP-eligible data (like READ)
)

type echoHandler struct {
	// wait, if set, runs first in every HandleCall: a test holds calls
	// in the handler until an event with it.
	wait func()
	// bufs, when set, recycles reply buffers (oncrpc.ReplyReleaser),
	// so that a benchmark measures the transport and not the
	// handler's garbage.
	bufs *replyBufs
}

// replyBufs recycles reply buffers: from the responder's registered
// memory when pool is set (the RDMA Write then goes out from it, as a
// server's does from its page cache), else from the heap.
type replyBufs struct {
	pool *mrcache.Pool
	heap sync.Pool
}

// get returns room for n bytes: in a buffer of the pool, which it sets
// *lent to, or of the heap.
func (r *replyBufs) get(n int, lent **mrcache.Buffer) []byte {
	if r.pool != nil {
		if b, err := r.pool.Get(n); err == nil {
			*lent = b
			return b.Bytes()[:0]
		}
	}
	if b, ok := r.heap.Get().(*[]byte); ok && cap(*b) >= n {
		return (*b)[:0]
	}
	return make([]byte, 0, n)
}

// ReleaseReply gives a sent reply of the heap back to its buffers.
func (h echoHandler) ReleaseReply(reply []byte) {
	if h.bufs != nil {
		h.bufs.heap.Put(&reply)
	}
}

// ReleaseView gives a sent reply back to its buffers (oncrpc.ViewHandler).
func (h echoHandler) ReleaseView(reply oncrpc.View) {
	if owner, _ := reply.Owner(); owner != nil {
		if lent, ok := owner.(*mrcache.Buffer); ok {
			h.bufs.pool.Recycle(lent) // the handle was the handler's alone
			return
		}
	}
	h.ReleaseReply(reply.Bytes())
}

func (h echoHandler) HandleCall(msg []byte) []byte { return h.HandleCallView(msg).Bytes() }

// HandleCallView answers in the responder's registered memory when bufs
// has a pool (oncrpc.ViewHandler), so the reply's bulk data goes out by
// RDMA Write from where it is.
func (h echoHandler) HandleCallView(msg []byte) oncrpc.View {
	var lent *mrcache.Buffer
	out := h.reply(msg, &lent)
	if lent != nil {
		if mem := lent.Bytes(); len(out) > 0 && len(out) <= len(mem) && &out[0] == &mem[0] {
			return oncrpc.Lent(lent).Slice(0, len(out))
		}
		h.bufs.pool.Recycle(lent) // the reply outgrew it
	}
	if out == nil {
		return oncrpc.View{}
	}
	return oncrpc.Plain(out)
}

func (h echoHandler) reply(msg []byte, lent **mrcache.Buffer) []byte {
	ch, args, err := oncrpc.ParseCall(msg)
	if err != nil {
		return nil
	}
	if h.wait != nil {
		h.wait()
	}
	d := xdr.NewDecoder(args)
	var e xdr.Encoder
	if ch.Proc == procSource || ch.Proc == procEcho {
		n := len(args) + 128 + int(xdr.NewDecoder(args).Uint32())%(65<<20)
		if h.bufs != nil {
			e.Reset(h.bufs.get(n, lent))
		} else {
			e.Reset(make([]byte, 0, n))
		}
	}
	switch ch.Proc {
	case procEcho:
		data := d.Opaque(64 << 20)
		if d.Err() != nil {
			oncrpc.AppendAcceptedReply(&e, ch.XID, oncrpc.GarbageArgs, 0, 0)
			return e.Bytes()
		}
		oncrpc.AppendAcceptedReply(&e, ch.XID, oncrpc.Success, 0, 0)
		e.Opaque(data)
	case procBigRepl:
		n := d.Uint32()
		oncrpc.AppendAcceptedReply(&e, ch.XID, oncrpc.Success, 0, 0)
		e.Opaque(bytes.Repeat([]byte{0x5a}, int(n)))
	case procSink:
		data := d.Opaque(64 << 20)
		oncrpc.AppendAcceptedReply(&e, ch.XID, oncrpc.Success, 0, 0)
		e.Uint32(uint32(len(data)))
	case procSource:
		n := min(d.Uint32(), 64<<20)
		oncrpc.AppendAcceptedReply(&e, ch.XID, oncrpc.Success, 0, 0)
		e.Uint32(n)
		e.Reserve(xdr.RoundUp(int(n)))
	default:
		oncrpc.AppendAcceptedReply(&e, ch.XID, oncrpc.ProcUnavail, 0, 0)
	}
	return e.Bytes()
}

// echoReplyBulk is the upper-layer binding of the echo program: the
// result data of procedures 1 and 4 is DDP-eligible.
func echoReplyBulk(call, reply []byte) (int, int, bool) {
	ch, _, err := oncrpc.ParseCall(call)
	if err != nil || (ch.Proc != procEcho && ch.Proc != procSource) {
		return 0, 0, false
	}
	_, res, err := oncrpc.ParseReply(reply)
	if err != nil || len(res) < 4 {
		return 0, 0, false
	}
	n := xdr.NewDecoder(res).Uint32()
	if int(n) > len(res)-4 {
		return 0, 0, false
	}
	return len(reply) - len(res) + 4, int(n), true
}

type testEnv struct {
	resp *Responder
	tr   *Transport
	clnt *oncrpc.Client
}

// newEnv starts a responder and a requester that negotiates version v
// with it: against a version-1 responder the requester's version-2 probe
// falls back to version 1 (v2 draft s5.2), so every test also covers that.
func newEnv(t *testing.T, v int, rcfg ResponderConfig, ccfg Config) *testEnv {
	t.Helper()
	rcfg.MaxVersion = v
	if v == Version2 {
		rcfg.XChars, ccfg.XChars = true, true
	}
	if rcfg.Handler == nil {
		rcfg.Handler = echoHandler{}
	}
	rcfg.Provider = &iwarp.Provider{}
	if rcfg.ReplyBulk == nil {
		rcfg.ReplyBulk = echoReplyBulk
	}
	// Both ends' traces go to stderr with RDMAFS_TEST_TRACE set, and are
	// logged when the test fails otherwise.
	var traceBuf syncBuffer
	if os.Getenv("RDMAFS_TEST_TRACE") != "" {
		ccfg.Tracer = trace.New(os.Stderr, trace.RDMA)
	} else {
		ccfg.Tracer = trace.New(&traceBuf, trace.RDMA)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("trace:\n%s", traceBuf.String())
			}
		})
	}
	rcfg.Tracer = ccfg.Tracer
	resp, err := Listen("127.0.0.1:0", rcfg)
	if err != nil {
		t.Fatal(err)
	}
	ccfg.Provider = &iwarp.Provider{}
	tr := NewTransport(resp.Addr(), ccfg)
	t.Cleanup(func() {
		tr.Close()
		resp.Close()
	})
	env := &testEnv{resp: resp, tr: tr, clnt: oncrpc.NewClient(tr, echoProg, 1, oncrpc.ClientOptions{Timeout: 30 * time.Second, Retrans: 5})}
	t.Cleanup(func() {
		if st := tr.Stats(); st.Replies > 0 && st.Version != v && !t.Failed() {
			t.Errorf("connection speaks version %d, want %d", st.Version, v)
		}
	})
	return env
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// forEachVersion runs f over a version-1 and a version-2 connection.
func forEachVersion(t *testing.T, f func(t *testing.T, v int)) {
	for _, v := range []int{Version1, Version2} {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) { f(t, v) })
	}
}

// echo sends data as an echo call with the data as Bulk and a ReplyBulk
// destination, and checks the result.
func (env *testEnv) echo(ctx context.Context, data []byte, dest []byte) error {
	var e xdr.Encoder
	xid := env.clnt.StartCall(&e, procEcho, oncrpc.AuthNone)
	e.Uint32(uint32(len(data)))
	maxReply := 128
	if dest == nil {
		maxReply += len(data) // the result comes back in the reply itself
	}
	call := &oncrpc.Call{XID: xid, Head: e.Bytes(), Bulk: oncrpc.Plain(data), ReplyBulk: oncrpc.Plain(dest), MaxReplySize: maxReply}
	rep, err := env.clnt.Do(ctx, call)
	if err != nil {
		return err
	}
	defer rep.Release()
	d := xdr.NewDecoder(rep.Results)
	var got []byte
	if rep.BulkPlaced {
		n := int(d.Uint32())
		if n > len(dest) {
			return fmt.Errorf("placed %d bytes in a %d-byte destination", n, len(dest))
		}
		got = dest[:n]
	} else {
		got = d.Opaque(len(data) + 1)
	}
	if err := d.Err(); err != nil {
		return err
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("echo of %d bytes returned %d different bytes", len(data), len(got))
	}
	return nil
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

func TestResponderChunkChoices(t *testing.T) {
	forEachVersion(t, func(t *testing.T, v int) {
		env := newEnv(t, v, ResponderConfig{RemoteInvalidate: true}, Config{AcceptInvalidate: true})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		tests := []struct {
			size                 int
			withDest             bool
			inline, read, write  uint64
			wantPlaced, wantRepl bool
		}{
			{0, false, 1, 0, 0, false, false},
			{1001, false, 1, 0, 0, false, false},
			{4100, false, 0, 1, 0, false, true}, // the echo reply needs a Reply chunk
			{6000, true, 0, 1, 1, true, false},
			{1 << 20, true, 0, 1, 1, true, false},
			{16 << 20, true, 0, 1, 1, true, false},
		}
		for _, tt := range tests {
			t.Run(fmt.Sprint(tt.size), func(t *testing.T) {
				before := env.tr.Stats()
				data := pattern(tt.size)
				var dest []byte
				if tt.withDest {
					dest = make([]byte, tt.size)
				}
				if err := env.echo(ctx, data, dest); err != nil {
					t.Fatal(err)
				}
				after := env.tr.Stats()
				if got := after.InlineCalls - before.InlineCalls; got != tt.inline {
					t.Errorf("inline calls %d, want %d", got, tt.inline)
				}
				if got := after.ReadChunks - before.ReadChunks; got != tt.read {
					t.Errorf("read chunks %d, want %d", got, tt.read)
				}
				if got := after.WriteChunks - before.WriteChunks; got != tt.write {
					t.Errorf("write chunks %d, want %d", got, tt.write)
				}
				if placed := after.BytesPlaced - before.BytesPlaced; tt.size > 0 && tt.wantPlaced != (placed == uint64(tt.size)) {
					t.Errorf("placed %d bytes", placed)
				}
				if got := after.ReplyChunks - before.ReplyChunks; (got == 1) != tt.wantRepl {
					t.Errorf("reply chunks %d, want %v", got, tt.wantRepl)
				}
				// RFC 8166 s8.1: nothing stays exposed after the call.
				if n := env.tr.PD().LiveRemoteRegions(); n != 0 {
					t.Fatalf("%d regions with remote access left after the call", n)
				}
			})
		}
	})
}

func TestResponderPositionZeroReadChunk(t *testing.T) {
	forEachVersion(t, func(t *testing.T, v int) {
		env := newEnv(t, v, ResponderConfig{}, Config{})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// A call larger than the inline threshold with no DDP-eligible part:
		// all of it in the Head.
		data := pattern(10000)
		var e xdr.Encoder
		xid := env.clnt.StartCall(&e, procEcho, oncrpc.AuthNone)
		e.Opaque(data)
		rep, err := env.clnt.Do(ctx, &oncrpc.Call{XID: xid, Head: e.Bytes(), MaxReplySize: 10200})
		if err != nil {
			t.Fatal(err)
		}
		defer rep.Release()
		d := xdr.NewDecoder(rep.Results)
		if got := d.Opaque(1 << 20); !bytes.Equal(got, data) {
			t.Fatalf("reply mismatch (%d bytes)", len(got))
		}
		st := env.tr.Stats()
		if st.PosZeroChunks != 1 || st.ReplyChunks != 1 {
			t.Fatalf("stats %+v: want one Position-Zero Read chunk and one Reply chunk", st)
		}
		if n := env.tr.PD().LiveRemoteRegions(); n != 0 {
			t.Fatalf("%d live regions", n)
		}
	})
}

func TestResponderBigReplyChunk(t *testing.T) {
	forEachVersion(t, func(t *testing.T, v int) {
		env := newEnv(t, v, ResponderConfig{}, Config{})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, n := range []int{100, 50000} {
			var e xdr.Encoder
			xid := env.clnt.StartCall(&e, procBigRepl, oncrpc.AuthNone)
			e.Uint32(uint32(n))
			rep, err := env.clnt.Do(ctx, &oncrpc.Call{XID: xid, Head: e.Bytes(), MaxReplySize: n + 200})
			if err != nil {
				t.Fatalf("%d: %v", n, err)
			}
			d := xdr.NewDecoder(rep.Results)
			if got := d.Opaque(1 << 20); len(got) != n {
				t.Fatalf("%d-byte reply came back with %d bytes", n, len(got))
			}
			rep.Release()
		}
		if st := env.tr.Stats(); st.ReplyChunks != 1 {
			t.Fatalf("reply chunks %d, want 1 (for the large reply only)", st.ReplyChunks)
		}
	})
}

func TestResponderCreditLimit(t *testing.T) {
	forEachVersion(t, func(t *testing.T, v int) {
		// The first call goes alone (a requester starts with one
		// credit: RFC 8166 s3.3.1); its reply grants 4. The next three
		// are held in the handler until all three have arrived, so the
		// responder sees at least three at once: the grant, less the
		// one a version-2 requester may spend on its ROPT_INITXCH (a
		// message that gets no reply), and never more than the grant.
		var arrived atomic.Int32
		full := make(chan struct{})
		hold := func() {
			switch n := arrived.Add(1); {
			case n >= 2 && n < 4:
				<-full
			case n == 4:
				close(full)
			}
		}
		env := newEnv(t, v, ResponderConfig{Credits: 4, Handler: echoHandler{wait: hold}}, Config{Credits: 128})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		var failed atomic.Int32
		for i := range 128 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := env.echo(ctx, pattern(100+i), nil); err != nil {
					t.Error(err)
					failed.Add(1)
				}
			}()
		}
		wg.Wait()
		if m := env.resp.MaxInFlight(); m > 4 || m < 3 {
			t.Fatalf("responder saw up to %d calls at once with a grant of 4", m)
		}
		if st := env.tr.Stats(); st.Credits != 4 {
			t.Fatalf("requester holds %d credits, want the grant of 4", st.Credits)
		}
	})
}

func TestResponderErrChunkFailsOnlyItsCall(t *testing.T) {
	forEachVersion(t, func(t *testing.T, v int) {
		var bad atomic.Uint32
		env := newFaultEnv(t, v, ResponderConfig{}, func(xid uint32) fault {
			if xid == bad.Load() {
				return overflowReply
			}
			return serveCall
		}, Config{})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := env.echo(ctx, []byte("warm"), nil); err != nil {
			t.Fatal(err)
		}
		var e xdr.Encoder
		xid := env.clnt.StartCall(&e, procEcho, oncrpc.AuthNone)
		bad.Store(xid)
		e.Opaque([]byte("rejected"))
		_, err := env.clnt.Do(ctx, &oncrpc.Call{XID: xid, Head: e.Bytes(), MaxReplySize: 100})
		if !errors.Is(err, ErrChunkRejected) {
			t.Fatalf("err = %v, want ERR_CHUNK", err)
		}
		if err := env.echo(ctx, []byte("after"), nil); err != nil {
			t.Fatalf("call after ERR_CHUNK: %v", err)
		}
		if st := env.tr.Stats(); st.Connects != 1 {
			t.Fatalf("ERR_CHUNK cost a reconnect (%d connects)", st.Connects)
		}
	})
}

func TestResponderReconnectDuringReads(t *testing.T) {
	forEachVersion(t, func(t *testing.T, v int) {
		// Calls 2 to 19 are held in the handler (the first one's reply
		// grants 32 credits) until the 20th arrives and the handler
		// closes the connection: they are in flight when it breaks.
		var calls atomic.Int32
		cut := make(chan struct{})
		hold := func() {
			if calls.Load() > 1 {
				<-cut
			}
		}
		env := newFaultEnv(t, v, ResponderConfig{Handler: echoHandler{wait: hold}}, func(uint32) fault {
			if calls.Add(1) == 20 {
				close(cut)
				return hangUp
			}
			return serveCall
		}, Config{})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		for i := range 100 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				data := pattern(64<<10 + i)
				if err := env.echo(ctx, data, make([]byte, len(data))); err != nil {
					t.Errorf("call %d: %v", i, err)
				}
			}()
		}
		wg.Wait()
		if st := env.tr.Stats(); st.Connects < 2 {
			t.Fatalf("connects %d: the connection was not remade", st.Connects)
		}
		if n := env.tr.PD().LiveRemoteRegions(); n != 0 {
			t.Fatalf("%d live regions after reconnect", n)
		}
	})
}
