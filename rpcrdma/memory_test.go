package rpcrdma

import (
	"bytes"
	"context"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// These tests count the user-space copies of bulk data and check what the
// transport's registered memory looks like around calls (the data-path
// memory model: mrcache's package doc).

// TestCopiesPerByte: 1 MiB READs into registered memory come by Write
// chunk with no user-space copy once the stream is steady (the provider
// reads large tagged payloads straight into place), and 1 MiB WRITEs from
// registered memory go by Read chunk with no copy in the transport (the
// one copy a WRITE makes is the FUSE layer's, into that memory). The same
// calls with ordinary memory copy each byte once, through a transport
// buffer.
func TestCopiesPerByte(t *testing.T) {
	forEachVersion(t, func(t *testing.T, v int) {
		env := newEnv(t, v, ResponderConfig{}, Config{})
		ctx := context.Background()
		pool := env.tr.Buffers()
		const size = 1 << 20
		want := make([]byte, size) // the source procedure returns zeros
		var e xdr.Encoder

		lent, err := pool.Get(size)
		if err != nil {
			t.Fatal(err)
		}
		defer lent.Release()
		slab := lent.Bytes()
		// Warm up: the first large payload after small messages may
		// find part of itself already in the provider's read buffer.
		if err := source(ctx, env.clnt, &e, oncrpc.Lent(lent)); err != nil {
			t.Fatal(err)
		}
		before := env.tr.Stats()
		const reads = 8
		for range reads {
			fill(slab, 0xff)
			if err := source(ctx, env.clnt, &e, oncrpc.Lent(lent)); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(slab, want) {
				t.Fatal("READ data differs")
			}
		}
		st := env.tr.Stats()
		if got := st.BytesCopied - before.BytesCopied; got != 0 {
			t.Errorf("%d 1-MiB READs into registered memory: %d bytes copied, want 0", reads, got)
		}
		if got := st.WriteChunks - before.WriteChunks; got != reads {
			t.Errorf("%d READs used %d Write chunks", reads, got)
		}

		before = st
		copy(slab, want)
		if err := sink(ctx, env.clnt, &e, oncrpc.Lent(lent)); err != nil {
			t.Fatal(err)
		}
		st = env.tr.Stats()
		if got := st.BytesCopied - before.BytesCopied; got != 0 {
			t.Errorf("1-MiB WRITE from registered memory: %d bytes copied, want 0", got)
		}
		if st.ReadChunks != before.ReadChunks+1 {
			t.Errorf("WRITE used %d Read chunks", st.ReadChunks-before.ReadChunks)
		}

		// Ordinary memory: one copy per byte each way.
		heap := make([]byte, size)
		fill(heap, 0xff)
		before = env.tr.Stats()
		if err := source(ctx, env.clnt, &e, oncrpc.Plain(heap)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(heap, want) {
			t.Fatal("READ into ordinary memory: data differs")
		}
		if err := sink(ctx, env.clnt, &e, oncrpc.Plain(heap)); err != nil {
			t.Fatal(err)
		}
		st = env.tr.Stats()
		if got := st.BytesCopied - before.BytesCopied; got != 2*size {
			t.Errorf("READ and WRITE of ordinary memory: %d bytes copied, want %d (one copy each)", got, 2*size)
		}
	})
}

// TestOnlyLentMemoryIsExposed: the transport offers its peer only memory
// it lent as a Buffer and the call's views name (Call.Bulk, ReplyBulk),
// never memory it recognises by address. Slab memory a plain view holds,
// and a Buffer of another transport's pool, go through the transport's
// own buffers (counted copies); a view of a Buffer released since fails
// the call before anything is exposed.
func TestOnlyLentMemoryIsExposed(t *testing.T) {
	env := newEnv(t, Version1, ResponderConfig{}, Config{})
	ctx := context.Background()
	const size = 256 << 10
	want := make([]byte, size) // the source procedure returns zeros
	var e xdr.Encoder
	// read reads into buf and returns the bytes copied on the way: the
	// transport's copies out of its own buffers, and the provider's when
	// part of a payload was already in its read buffer.
	read := func(t *testing.T, what string, buf dataBuf) uint64 {
		t.Helper()
		fill(buf.Bytes(), 0xff)
		before := env.tr.Stats()
		if err := source(ctx, env.clnt, &e, buf); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !bytes.Equal(buf.Bytes(), want) {
			t.Fatalf("%s: READ data differs", what)
		}
		return env.tr.Stats().BytesCopied - before.BytesCopied
	}

	lent, err := env.tr.Buffers().Get(size)
	if err != nil {
		t.Fatal(err)
	}
	defer lent.Release()
	read(t, "warm-up", oncrpc.Lent(lent)) // as in TestCopiesPerByte
	if got := read(t, "a lent buffer", oncrpc.Lent(lent)); got != 0 {
		t.Fatalf("READ into a lent buffer: %d bytes copied, want 0", got)
	}

	unnamed, err := env.tr.Buffers().Get(size)
	if err != nil {
		t.Fatal(err)
	}
	defer env.tr.Buffers().Put(unnamed)
	if got := read(t, "unnamed", oncrpc.Plain(unnamed.Bytes())); got < size {
		t.Fatalf("READ into slab memory the call does not name: %d bytes copied, want at least %d (through a transport buffer)", got, size)
	}

	other := NewTransport(env.resp.Addr(), Config{Provider: env.tr.cfg.Provider})
	defer other.Close()
	foreign, err := other.Buffers().Get(size)
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Release()
	if got := read(t, "foreign", oncrpc.Lent(foreign)); got < size {
		t.Fatalf("READ into another transport's buffer: %d bytes copied, want at least %d", got, size)
	}

	gone, err := env.tr.Buffers().Get(size)
	if err != nil {
		t.Fatal(err)
	}
	stale := oncrpc.Lent(gone)
	if err := gone.Release(); err != nil {
		t.Fatal(err)
	}
	exposures := env.tr.Stats().Memory.Exposures
	err = source(ctx, env.clnt, &e, stale)
	if err == nil {
		t.Fatal("a call naming a released buffer succeeded")
	}
	t.Logf("a call naming a released buffer: %v", err)
	if m := env.tr.Stats().Memory; m.Exposures != exposures || m.LiveExposures != 0 {
		t.Fatalf("the failed call exposed memory: %d exposures (was %d), %d live", m.Exposures, exposures, m.LiveExposures)
	}
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// TestRegistrationReuse replays what the FUSE read path does: a 1 MiB
// buffer split into rsize slices read concurrently, again and again. Every
// exposure after the first round reuses a fast-registration region (the
// registration "hit rate" is 100% by construction), nothing stays exposed
// between calls, and the registered memory stays within the budget.
func TestRegistrationReuse(t *testing.T) {
	const budget = 16 << 20
	env := newEnv(t, Version1, ResponderConfig{Credits: 16}, Config{MemoryBytes: budget, Credits: 16})
	lent, err := env.tr.Buffers().Get(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer lent.Release()
	buf := lent.Bytes()
	const rsize = 124 << 10
	round := func() {
		done := make(chan error)
		n := 0
		for off := 0; off < len(buf); off += rsize {
			n++
			go func(dst oncrpc.View) {
				var e xdr.Encoder
				done <- source(context.Background(), env.clnt, &e, dst)
			}(oncrpc.Lent(lent).Slice(off, min(len(buf), off+rsize)))
		}
		for range n {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 3 {
		round()
	}
	first := env.tr.Stats().Memory
	const rounds = 50
	for range rounds {
		round()
	}
	m := env.tr.Stats().Memory
	calls := m.Exposures - first.Exposures
	// The transport reserves a region per credit: every exposure binds
	// one that exists.
	if reused := m.ExposureReuses - first.ExposureReuses; reused != calls || calls < rounds*8 {
		t.Fatalf("%d exposures after warm-up, %d reused a region; stats %+v", calls, reused, m)
	}
	if m.FastRegions != first.FastRegions || first.FastRegions != env.tr.cfg.Credits {
		t.Fatalf("fast-registration regions: %d reserved (credits %d), %d now", first.FastRegions, env.tr.cfg.Credits, m.FastRegions)
	}
	if m.LiveExposures != 0 || env.tr.PD().LiveRemoteRegions() != 0 {
		t.Fatalf("after the calls: %d exposures live, %d regions with remote access", m.LiveExposures, env.tr.PD().LiveRemoteRegions())
	}
	if m.BytesRegistered > budget || m.BytesRegistered == 0 {
		t.Fatalf("registered %d bytes, budget %d", m.BytesRegistered, budget)
	}
}

// TestCloseDeregistersEverything: after Close (unmount), and once the
// upper layer has returned its buffers, no memory is registered any more.
func TestCloseDeregistersEverything(t *testing.T) {
	env := newEnv(t, Version1, ResponderConfig{}, Config{})
	tr := NewTransport(env.resp.Addr(), Config{Provider: env.tr.cfg.Provider})
	clnt := oncrpc.NewClient(tr, echoProg, 1, oncrpc.ClientOptions{})
	pool := tr.Buffers()
	lent, err := pool.Get(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	var e xdr.Encoder
	if err := source(context.Background(), clnt, &e, oncrpc.Lent(lent)); err != nil {
		t.Fatal(err)
	}
	tr.Close()
	if m := pool.Stats(); m.Chunks == 0 {
		t.Fatal("slab unmapped while the upper layer still holds a buffer")
	}
	if err := lent.Release(); err != nil {
		t.Fatal(err)
	}
	if m := pool.Stats(); m.Chunks != 0 || m.BytesRegistered != 0 || m.FastRegions != 0 || m.BytesInUse != 0 {
		t.Fatalf("after Close and the last Put: %+v", m)
	}
}

// TestInlineReplyLent: an inline reply is handed up in its receive buffer
// (no copy) and the buffer comes back at Release; a reply held by the
// caller does not starve the connection of receive buffers.
func TestInlineReplyLent(t *testing.T) {
	env := newEnv(t, Version1, ResponderConfig{}, Config{Credits: 4})
	ctx := context.Background()
	var held []*oncrpc.Reply
	for range 12 { // more replies held than credits: spares run out, then copies
		var e xdr.Encoder
		xid := env.clnt.StartCall(&e, procEcho, oncrpc.AuthNone)
		e.Opaque([]byte("hello"))
		rep, err := env.clnt.Do(ctx, &oncrpc.Call{XID: xid, Head: e.Bytes(), MaxReplySize: 128})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, rep)
	}
	for _, rep := range held {
		d := xdr.NewDecoder(rep.Results)
		if got := d.Opaque(64); string(got) != "hello" {
			t.Fatalf("held reply reads %q", got)
		}
		rep.Release()
	}
	// The connection still works after the buffers came back.
	var e xdr.Encoder
	if err := source(ctx, env.clnt, &e, oncrpc.Plain(make([]byte, 100))); err != nil {
		t.Fatal(err)
	}
}
