package nfsclient

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// UnstableWriter writes one open file as UNSTABLE WRITEs, several in
// flight, and keeps each write's data until a COMMIT returns the same
// write verifier. A different verifier means the server may have lost
// the data (it rebooted), so the writes are sent again (RFC 8881
// s18.32.3, s18.3.3).
//
// Writes to overlapping ranges reach the server in the order WriteAt
// was called: a piece waits until no write in flight overlaps it, since
// two WRITEs in flight at once may be executed in either order (RFC 8881
// s2.10.6.1: slots impose no ordering between requests).
//
// With CommitEvery set, a COMMIT starts in the background whenever that
// many bytes are written unstable, as the Linux client commits during
// writeback (nfs_commit_inode from nfs_write_inode): the server flushes
// the data to disk while more is being written, so the COMMIT at close
// has little left to do, and the data kept for resending stays bounded.
type UnstableWriter struct {
	c    *Client
	cred oncrpc.Credential
	fh   []byte
	sid  StateID

	sem chan struct{} // bounds writes in flight
	wg  sync.WaitGroup

	mu      sync.Mutex
	pending []pendingWrite
	err     error // first write error, reported by Flush and Commit
	resent  int   // writes sent again after a verifier change
	seq     uint64
	flying  []span        // byte ranges of the writes in flight
	landed  chan struct{} // closed when a write in flight completes

	commitEvery  int           // start a background COMMIT at this many unstable bytes; 0: never
	pendingBytes int           // bytes in pending
	committing   chan struct{} // closed when the background COMMIT running ends; nil if none
	bgOff        bool          // a background COMMIT failed: leave it all to Commit
	inCommit     bool          // Commit is running: no background COMMIT
	bgCommits    int           // background COMMITs that committed data
}

// span is the byte range [off, end) of a write in flight.
type span struct{ off, end uint64 }

// Resent returns how many writes were sent again because a COMMIT
// returned a different write verifier.
func (w *UnstableWriter) Resent() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.resent
}

type pendingWrite struct {
	off  uint64
	data oncrpc.View
	verf Verifier
	buf  *bufRef
	seq  uint64 // order of the WriteAt piece it belongs to
}

// bufRef counts the pieces of one WriteAt still in use; the caller's
// release runs when the last one is done (written stably, or committed).
type bufRef struct {
	n       atomic.Int32
	release func()
}

func (b *bufRef) done() {
	if b != nil && b.n.Add(-1) == 0 && b.release != nil {
		b.release()
	}
}

// maxWriteResends bounds how often a COMMIT with a changed verifier makes
// the writer send its data again before it reports an error.
const maxWriteResends = 3

// NewUnstableWriter returns a writer for the open file of. inFlight
// bounds concurrent WRITEs; 0 means 4.
func (c *Client) NewUnstableWriter(cred oncrpc.Credential, of *OpenFile, inFlight int) *UnstableWriter {
	if inFlight <= 0 {
		inFlight = 4
	}
	return &UnstableWriter{c: c, cred: cred, fh: of.FH, sid: of.StateID, sem: make(chan struct{}, inFlight)}
}

// CommitEvery makes the writer start a COMMIT in the background each time
// n bytes have been written unstable since the last one, and hold off
// new writes while 2n bytes wait for a COMMIT that is running. Call it
// before the first WriteAt; n <= 0 turns background COMMITs off.
func (w *UnstableWriter) CommitEvery(n int) {
	w.mu.Lock()
	w.commitEvery = max(n, 0)
	w.mu.Unlock()
}

// BackgroundCommits returns how many background COMMITs committed data.
func (w *UnstableWriter) BackgroundCommits() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.bgCommits
}

// WriteAt starts writing data at off, in WSize pieces; data is a view as
// for Client.Write. The writer owns data from now on: the caller must
// not change it. release, if not nil, runs once the writer no longer
// needs data: every piece was written stably or committed, or Discard
// dropped it.
func (w *UnstableWriter) WriteAt(ctx context.Context, data oncrpc.View, off uint64, release func()) error {
	ref := &bufRef{release: release}
	ref.n.Store(int32((data.Len()+w.c.wsize-1)/w.c.wsize) + 1)
	defer ref.done() // the reference WriteAt holds while it starts pieces
	for data.Len() > 0 {
		n := min(data.Len(), w.c.wsize)
		piece := data.Slice(0, n)
		err := w.waitCommitting(ctx)
		var seq uint64
		if err == nil {
			seq, err = w.reserve(ctx, off, off+uint64(n))
		}
		if err == nil {
			select {
			case w.sem <- struct{}{}:
			case <-ctx.Done():
				w.unreserve(off, off+uint64(n))
				err = ctx.Err()
			}
		}
		if err != nil {
			for range (data.Len() + w.c.wsize - 1) / w.c.wsize {
				ref.done()
			}
			return err
		}
		w.wg.Add(1)
		go func(off uint64) {
			defer w.wg.Done()
			defer func() { <-w.sem }()
			defer w.unreserve(off, off+uint64(piece.Len()))
			err := w.write(ctx, off, piece, Unstable, ref, seq)
			if err != nil {
				w.mu.Lock()
				if w.err == nil {
					w.err = err
				}
				w.mu.Unlock()
			}
		}(off)
		data = data.Slice(n, data.Len())
		off += uint64(n)
	}
	return w.firstErr()
}

// waitCommitting holds a new write back while a background COMMIT runs
// and twice CommitEvery bytes already wait for one: the data kept for a
// possible resend stays bounded when the server's disk is slower than the
// network.
func (w *UnstableWriter) waitCommitting(ctx context.Context) error {
	w.mu.Lock()
	for w.committing != nil && w.pendingBytes >= 2*w.commitEvery {
		ch := w.committing
		w.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		w.mu.Lock()
	}
	w.mu.Unlock()
	return nil
}

// reserve waits until no write in flight overlaps [off, end), then
// records the range as in flight and returns the piece's sequence number.
func (w *UnstableWriter) reserve(ctx context.Context, off, end uint64) (uint64, error) {
	w.mu.Lock()
	for w.overlapsLocked(off, end) {
		if w.landed == nil {
			w.landed = make(chan struct{})
		}
		landed := w.landed
		w.mu.Unlock()
		select {
		case <-landed:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		w.mu.Lock()
	}
	w.flying = append(w.flying, span{off, end})
	w.seq++
	seq := w.seq
	w.mu.Unlock()
	return seq, nil
}

func (w *UnstableWriter) overlapsLocked(off, end uint64) bool {
	for _, s := range w.flying {
		if off < s.end && s.off < end {
			return true
		}
	}
	return false
}

// unreserve ends the flight of [off, end) and wakes the writes waiting.
func (w *UnstableWriter) unreserve(off, end uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, s := range w.flying {
		if s == (span{off, end}) {
			w.flying = append(w.flying[:i], w.flying[i+1:]...)
			break
		}
	}
	if w.landed != nil {
		close(w.landed)
		w.landed = nil
	}
}

// write sends one WRITE, repeating it for a short count, and remembers
// unstable data for the next COMMIT. ref counts data as one piece: it is
// done when no part of data is pending any more.
func (w *UnstableWriter) write(ctx context.Context, off uint64, data oncrpc.View, stable Stable, ref *bufRef, seq uint64) error {
	kept := false
	for data.Len() > 0 {
		res, err := w.c.Write(ctx, w.cred, w.fh, w.sid, off, data, stable)
		if err != nil {
			if !kept {
				ref.done()
			}
			return fmt.Errorf("write at %d: %w", off, err)
		}
		if res.Count == 0 {
			if !kept {
				ref.done()
			}
			return fmt.Errorf("write at %d: %w: server wrote 0 bytes", off, ErrProtocol)
		}
		done := data.Slice(0, int(res.Count))
		if res.Committed == Unstable {
			if kept {
				ref.n.Add(1) // one more pending part of the same piece
			}
			kept = true
			w.mu.Lock()
			w.pending = append(w.pending, pendingWrite{off: off, data: done, verf: res.Verifier, buf: ref, seq: seq})
			w.pendingBytes += done.Len()
			w.maybeCommitLocked(ctx)
			w.mu.Unlock()
		}
		data = data.Slice(int(res.Count), data.Len())
		off += uint64(res.Count)
	}
	if !kept {
		ref.done()
	}
	return nil
}

// maybeCommitLocked starts a background COMMIT of the pending writes
// once there are CommitEvery bytes of them and no COMMIT is running.
func (w *UnstableWriter) maybeCommitLocked(ctx context.Context) {
	if w.commitEvery == 0 || w.pendingBytes < w.commitEvery || w.committing != nil || w.bgOff || w.inCommit {
		return
	}
	batch := w.pending
	w.pending, w.pendingBytes = nil, 0
	done := make(chan struct{})
	w.committing = done
	go w.commitBackground(ctx, batch, done)
}

// commitBackground COMMITs the writes of batch. If the COMMIT fails, or
// its verifier is not theirs (RFC 8881 s18.3.3: the server may have lost
// them), they go back to pending and background COMMITs stop: Commit
// sends them again and reports the error.
func (w *UnstableWriter) commitBackground(ctx context.Context, batch []pendingWrite, done chan struct{}) {
	verf, err := w.c.Commit(ctx, w.cred, w.fh, 0, 0)
	ok := err == nil
	for _, p := range batch {
		ok = ok && p.verf == verf
	}
	w.mu.Lock()
	if ok {
		w.bgCommits++
	} else {
		w.bgOff = true
		w.pending = append(batch, w.pending...)
		for _, p := range batch {
			w.pendingBytes += p.data.Len()
		}
		if err != nil {
			w.c.trace("background COMMIT: %v", err)
		} else {
			w.c.trace("background COMMIT: write verifier changed")
		}
	}
	w.committing = nil
	close(done)
	w.mu.Unlock()
	if ok {
		for _, p := range batch {
			p.buf.done() // committed: the data is no longer needed
		}
	}
}

// waitBackground waits for the background COMMIT running, if any.
func (w *UnstableWriter) waitBackground() {
	w.mu.Lock()
	ch := w.committing
	w.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

func (w *UnstableWriter) firstErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Flush waits for the writes in flight.
func (w *UnstableWriter) Flush() error {
	w.wg.Wait()
	return w.firstErr()
}

// Commit waits for the writes in flight, then COMMITs them. Writes whose
// verifier differs from the COMMIT's are sent again, FILE_SYNC.
func (w *UnstableWriter) Commit(ctx context.Context) error {
	if err := w.Flush(); err != nil {
		return err
	}
	// Writes in flight may have started a background COMMIT: it must end
	// before the pending list says what is left to commit.
	w.waitBackground()
	w.mu.Lock()
	w.inCommit = true
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.inCommit = false
		w.mu.Unlock()
	}()
	for range maxWriteResends {
		w.mu.Lock()
		pending := w.pending
		w.pending, w.pendingBytes = nil, 0
		w.mu.Unlock()
		if len(pending) == 0 {
			return nil
		}
		verf, err := w.c.Commit(ctx, w.cred, w.fh, 0, 0)
		if err != nil {
			w.mu.Lock()
			w.pending = append(pending, w.pending...)
			for _, p := range pending {
				w.pendingBytes += p.data.Len()
			}
			w.mu.Unlock()
			return fmt.Errorf("commit: %w", err)
		}
		changed := false
		for _, p := range pending {
			changed = changed || p.verf != verf
		}
		if !changed {
			for _, p := range pending {
				p.buf.done() // committed: the data is no longer needed
			}
			return nil
		}
		// Some data may be lost: send everything uncommitted again, in
		// the order it was first written, so that a write the server
		// kept is not overwritten by an older, overlapping one it lost.
		resend := pending
		sort.SliceStable(resend, func(i, j int) bool { return resend[i].seq < resend[j].seq })
		w.c.trace("COMMIT verifier changed: resending %d writes", len(resend))
		w.mu.Lock()
		w.resent += len(resend)
		w.mu.Unlock()
		for i, p := range resend {
			// The piece is resent FILE_SYNC; write counts it done.
			if err := w.write(ctx, p.off, p.data, FileSync, p.buf, p.seq); err != nil {
				for _, q := range resend[i+1:] {
					q.buf.done()
				}
				return err
			}
		}
	}
	return errors.New("commit: write verifier keeps changing")
}

// Discard drops the unstable data not yet committed (the file is being
// closed after an error) and releases its buffers.
func (w *UnstableWriter) Discard() {
	w.wg.Wait()
	w.waitBackground()
	w.mu.Lock()
	pending := w.pending
	w.pending, w.pendingBytes = nil, 0
	w.mu.Unlock()
	for _, p := range pending {
		p.buf.done()
	}
}

// Pending returns the number of bytes written unstable and not yet
// committed.
func (w *UnstableWriter) Pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, p := range w.pending {
		n += p.data.Len()
	}
	return n
}
