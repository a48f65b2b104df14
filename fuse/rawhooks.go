package fuse

import (
	"sync"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"
)

// rawHooks wraps go-fuse's node file system to pass on what its fs API
// drops: FLUSH's lock owner (FlushIn.LockOwner, for releasing a
// process's locks at close) and WRITE's flags (WriteIn.WriteFlags, for
// FUSE_WRITE_KILL_SUIDGID), each in the request's requestInfo
// (request.go); and to order lock requests after RELEASEs (releaseWait).
type rawHooks struct {
	gofuse.RawFileSystem
	reqs     *inflight
	releases *releaseWait
}

// releaseWait holds lock requests back while a RELEASE that may drop
// locks is under way or on its way, so that a lock released by close(2)
// is gone for everyone once close returns, as on a kernel NFS mount
// (its LOCKU at close is synchronous).
//
// The kernel sends RELEASE after the last close of an open file without
// waiting for the answer (fs/fuse/file.c fuse_release), and RELEASE is
// where the locks of that open file description go: its OFD and flock
// locks, which no FLUSH names (FLUSH carries the closing process's POSIX
// lock owner only, and those locks go there: lock.go flushLocks). Every
// close(2) sends FLUSH first, synchronously; a RELEASE follows only if it
// was the last close, which FLUSH does not say. So a FLUSH after which
// the open file still holds locks marks it: lock requests on the node
// wait until its RELEASE has run, or, if none comes (a dup of the
// descriptor is still open), for releaseGrace.
type releaseWait struct {
	mu      sync.Mutex
	changed *sync.Cond
	running map[uint64]int        // node ID -> RELEASEs running
	flushed map[fileKey]time.Time // flushed holding locks, no RELEASE yet
}

type fileKey struct{ node, fh uint64 }

// releaseGrace bounds the wait for the RELEASE of a file flushed with
// locks held. The RELEASE of a last close is queued before close(2)
// returns, so it is read before any lock request that follows; only
// the reading goroutine may lag behind the lock request's. The grace is
// about the order of two requests, not about one's data, so requestInfo
// cannot replace it: go-fuse reads /dev/fuse from several goroutines and
// tells the file system neither the order it read requests in nor
// whether a FLUSH was the last close.
const releaseGrace = 250 * time.Millisecond

func newReleaseWait() *releaseWait {
	w := &releaseWait{running: make(map[uint64]int), flushed: make(map[fileKey]time.Time)}
	w.changed = sync.NewCond(&w.mu)
	return w
}

// flushedHolding marks a file flushed with locks still held.
func (w *releaseWait) flushedHolding(node, fh uint64) {
	w.mu.Lock()
	w.flushed[fileKey{node, fh}] = time.Now()
	w.mu.Unlock()
}

func (w *releaseWait) start(node, fh uint64) {
	w.mu.Lock()
	delete(w.flushed, fileKey{node, fh})
	w.running[node]++
	w.mu.Unlock()
}

func (w *releaseWait) done(node uint64) {
	w.mu.Lock()
	if w.running[node]--; w.running[node] <= 0 {
		delete(w.running, node)
	}
	w.changed.Broadcast()
	w.mu.Unlock()
}

// wait returns once no RELEASE of node is under way or expected.
func (w *releaseWait) wait(node uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		if w.running[node] > 0 {
			w.changed.Wait()
			continue
		}
		var until time.Time
		now := time.Now()
		for k, t := range w.flushed {
			if k.node != node {
				continue
			}
			if end := t.Add(releaseGrace); end.After(now) {
				if until.IsZero() || end.Before(until) {
					until = end
				}
			} else {
				delete(w.flushed, k) // still open: a dup's close
			}
		}
		if until.IsZero() {
			return
		}
		wake := time.AfterFunc(until.Sub(now), func() {
			w.mu.Lock()
			w.changed.Broadcast()
			w.mu.Unlock()
		})
		w.changed.Wait()
		wake.Stop()
	}
}

// Release counts the RELEASE while it runs.
func (r rawHooks) Release(cancel <-chan struct{}, in *gofuse.ReleaseIn) {
	r.releases.start(in.NodeId, in.Fh)
	defer r.releases.done(in.NodeId)
	r.RawFileSystem.Release(cancel, in)
}

// GetLk waits for the node's RELEASEs first (releaseWait).
func (r rawHooks) GetLk(cancel <-chan struct{}, in *gofuse.LkIn, out *gofuse.LkOut) gofuse.Status {
	r.releases.wait(in.NodeId)
	return r.RawFileSystem.GetLk(cancel, in, out)
}

// SetLk waits for the node's RELEASEs first (releaseWait).
func (r rawHooks) SetLk(cancel <-chan struct{}, in *gofuse.LkIn) gofuse.Status {
	r.releases.wait(in.NodeId)
	return r.RawFileSystem.SetLk(cancel, in)
}

// SetLkw waits for the node's RELEASEs first (releaseWait).
func (r rawHooks) SetLkw(cancel <-chan struct{}, in *gofuse.LkIn) gofuse.Status {
	r.releases.wait(in.NodeId)
	return r.RawFileSystem.SetLkw(cancel, in)
}

// Flush passes the lock owner to the node method, and marks a file that
// still holds locks afterwards (releaseWait).
func (r rawHooks) Flush(cancel <-chan struct{}, in *gofuse.FlushIn) gofuse.Status {
	info := &requestInfo{lockOwner: in.LockOwner, hasLockOwner: true}
	end := r.reqs.begin(cancel, info)
	st := r.RawFileSystem.Flush(cancel, in)
	end()
	if info.leftLocks.Load() {
		r.releases.flushedHolding(in.NodeId, in.Fh)
	}
	return st
}

// Write passes the write flags to the node method.
func (r rawHooks) Write(cancel <-chan struct{}, in *gofuse.WriteIn, data []byte) (uint32, gofuse.Status) {
	if in.WriteFlags&gofuse.WRITE_KILL_SUIDGID == 0 {
		return r.RawFileSystem.Write(cancel, in, data)
	}
	defer r.reqs.begin(cancel, &requestInfo{writeFlags: in.WriteFlags})()
	return r.RawFileSystem.Write(cancel, in, data)
}

// Writev is Write for go-fuse's vectored path (tried first; the node
// file system answers ENOSYS for a handle without FileWritever, and the
// server then calls Write).
func (r rawHooks) Writev(cancel <-chan struct{}, in *gofuse.WriteIn, data [][]byte) (uint32, gofuse.Status) {
	if in.WriteFlags&gofuse.WRITE_KILL_SUIDGID == 0 {
		return r.RawFileSystem.Writev(cancel, in, data)
	}
	defer r.reqs.begin(cancel, &requestInfo{writeFlags: in.WriteFlags})()
	return r.RawFileSystem.Writev(cancel, in, data)
}

// mount is fs.Mount with rawHooks around the node file system and
// killable around that (interrupt.go), served over /dev/fuse or, with
// Options.URing, over io_uring (uringmount.go): both transports hand
// their requests, INTERRUPTs included, to the same raw file system.
func (f *FS) mount(dir string, root fs.InodeEmbedder, opts *fs.Options) (*gofuse.Server, error) {
	hooks := rawHooks{RawFileSystem: fs.NewNodeFS(root, opts), reqs: &f.reqs, releases: newReleaseWait()}
	watch := &interruptWatch{dying: threadDying, note: f.noteInterrupt}
	raw := killable{RawFileSystem: hooks, w: watch}
	if f.opts.URing != URingOff {
		// Set before the mount serves anything, even should it fall
		// back to /dev/fuse, where this only costs a look now and then.
		watch.unprompted = true
		return f.mountURing(dir, raw, &opts.MountOptions)
	}
	srv, err := gofuse.NewServer(raw, dir, &opts.MountOptions)
	if err != nil {
		return nil, err
	}
	// INIT is done; no request is served before srv.Serve.
	f.directIOMmap = srv.KernelSettings().Flags64()&gofuse.CAP_DIRECT_IO_ALLOW_MMAP != 0
	go srv.Serve()
	if err := waitMount(srv, dir); err != nil {
		return nil, err
	}
	return srv, nil
}
