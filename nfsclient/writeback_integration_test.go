package nfsclient

import (
	"bytes"
	"sync/atomic"
	"testing"

	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/test/testpeer"
)

// TestBackgroundCommit writes a file in 1 MiB pieces with CommitEvery
// set: COMMITs go out while the writing goes on, the unstable data the
// writer keeps stays bounded, each piece's buffer is given back once
// committed, and the data reads back whole.
func TestBackgroundCommit(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	c := dial(t, peer{name: "ganesha", addr: g.Addr, export: g.Export}, oncrpc.TCPOptions{})
	ctx := testCtx(t)
	dir := testDir(t, c)
	of := createFile(ctx, t, c, dir, "big")
	const piece, pieces, every, inFlight = 1 << 20, 12, 2 << 20, 4
	data := pattern(piece*pieces, 5)
	w := c.NewUnstableWriter(rootCred, of, inFlight)
	w.CommitEvery(every)
	var released atomic.Int32
	// Pieces in flight when a COMMIT starts may land on top of the 2x
	// every that WriteAt waits below.
	bound := 2*every + inFlight*c.WSize()
	for i := range pieces {
		off := i * piece
		if err := w.WriteAt(ctx, oncrpc.Plain(bytes.Clone(data[off:off+piece])), uint64(off), func() { released.Add(1) }); err != nil {
			t.Fatalf("write piece %d: %v", i, err)
		}
		if p := w.Pending(); p > bound {
			t.Fatalf("after piece %d: %d bytes wait for a COMMIT, want at most %d", i, p, bound)
		}
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if w.BackgroundCommits() == 0 {
		t.Errorf("no background COMMIT for %d bytes with CommitEvery(%d)", len(data), every)
	}
	if n := released.Load(); n != pieces || w.Pending() != 0 {
		t.Errorf("after Commit: %d of %d buffers given back, %d bytes pending", n, pieces, w.Pending())
	}
	if got := readAll(ctx, t, c, of, len(data)); !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes that differ from the %d written", len(got), len(data))
	}
	if err := c.CloseFile(ctx, rootCred, of); err != nil {
		t.Fatal(err)
	}
}

// TestBackgroundCommitVerifierChange has the first (background) COMMIT
// return another verifier: the writer must keep that data, stop
// committing in the background, and leave it to Commit, whose COMMIT
// then decides (RFC 8881 s18.3.3).
func TestBackgroundCommitVerifierChange(t *testing.T) {
	c, flip := flipCommitClient(t)
	ctx := testCtx(t)
	dir := testDir(t, c)
	of := createFile(ctx, t, c, dir, "f")
	data := pattern(4<<20, 12)
	w := c.NewUnstableWriter(rootCred, of, 4)
	w.CommitEvery(1) // the first WRITE that lands starts a COMMIT
	var released atomic.Int32
	flip.armed.Store(true)
	if err := w.WriteAt(ctx, oncrpc.Plain(bytes.Clone(data)), 0, func() { released.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if flip.armed.Load() {
		t.Fatal("no COMMIT went out")
	}
	if n := w.BackgroundCommits(); n != 0 {
		t.Errorf("%d background COMMITs counted after the first one's verifier changed, want 0", n)
	}
	if released.Load() != 1 || w.Pending() != 0 {
		t.Errorf("after Commit: buffer given back %d times, %d bytes pending", released.Load(), w.Pending())
	}
	if got := readAll(ctx, t, c, of, len(data)); !bytes.Equal(got, data) {
		t.Fatal("data differs")
	}
	c.CloseFile(ctx, rootCred, of)
}
