package fuse

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"
)

// probeRoot is a root node that records what the requestInfo of each
// FLUSH and WRITE says, as its node methods see it. Its methods wait at
// a barrier until all concurrent requests are in, so that every
// request's info is recorded while the others' are.
type probeRoot struct {
	fs.Inode
	fsys    *FS
	barrier *sync.WaitGroup
	mu      sync.Mutex
	// By the caller's pid, which the test sets per request.
	owners map[uint32]uint64
	kills  map[uint32]bool
	late   []uint32 // pids whose barrier wait ran out
}

type probeFile struct{}

func (p *probeRoot) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return probeFile{}, 0, 0
}

// waitAll waits for the other requests, for at most a minute.
func (p *probeRoot) waitAll(pid uint32) {
	p.barrier.Done()
	all := make(chan struct{})
	go func() { p.barrier.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(time.Minute):
		p.mu.Lock()
		p.late = append(p.late, pid)
		p.mu.Unlock()
	}
}

func (p *probeRoot) Flush(ctx context.Context, f fs.FileHandle) syscall.Errno {
	pid := ctx.(*gofuse.Context).Pid
	p.waitAll(pid)
	owner, ok := p.fsys.flushOwner(ctx)
	p.mu.Lock()
	if ok {
		p.owners[pid] = owner
	}
	p.mu.Unlock()
	if pid%2 == 1 {
		p.fsys.setFlushHolding(ctx)
	}
	return 0
}

func (p *probeRoot) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	pid := ctx.(*gofuse.Context).Pid
	p.waitAll(pid)
	p.mu.Lock()
	p.kills[pid] = p.fsys.writeKillsPriv(ctx)
	p.mu.Unlock()
	return uint32(len(data)), 0
}

// probeMount returns the raw file system of a mount of a probeRoot as
// mount builds it (killable around rawHooks around go-fuse's bridge),
// not served: the test calls it as go-fuse's server would.
func probeMount(t *testing.T, n int) (gofuse.RawFileSystem, *probeRoot, *releaseWait) {
	f := &FS{}
	root := &probeRoot{fsys: f, barrier: new(sync.WaitGroup), owners: make(map[uint32]uint64), kills: make(map[uint32]bool)}
	root.barrier.Add(n)
	releases := newReleaseWait()
	hooks := rawHooks{RawFileSystem: fs.NewNodeFS(root, &fs.Options{}), reqs: &f.reqs, releases: releases}
	w := &interruptWatch{dying: func(uint32) bool { return false }, note: func(uint32, bool) {}}
	return killable{RawFileSystem: hooks, w: w}, root, releases
}

// openProbe opens the root n times and returns the file handles.
func openProbe(t *testing.T, raw gofuse.RawFileSystem, n int) []uint64 {
	fhs := make([]uint64, n)
	for i := range fhs {
		var out gofuse.OpenOut
		in := &gofuse.OpenIn{InHeader: gofuse.InHeader{NodeId: gofuse.FUSE_ROOT_ID}}
		if st := raw.Open(make(chan struct{}), in, &out); !st.Ok() {
			t.Fatalf("open: %v", st)
		}
		fhs[i] = out.Fh
	}
	return fhs
}

// TestRequestInfoFlush checks that concurrent FLUSHes each reach the node
// method with their own lock owner, and that the FLUSHes that leave locks
// held, and only they, mark their file for releaseWait. All share one
// kernel cancel channel: the per-request channel killable makes keys
// the info.
func TestRequestInfoFlush(t *testing.T) {
	const n = 8
	raw, root, releases := probeMount(t, n)
	fhs := openProbe(t, raw, n)
	kernelCancel := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := &gofuse.FlushIn{InHeader: gofuse.InHeader{NodeId: gofuse.FUSE_ROOT_ID, Caller: gofuse.Caller{Pid: uint32(i)}},
				Fh: fhs[i], LockOwner: 1000 + uint64(i)}
			raw.Flush(kernelCancel, in)
		}()
	}
	wg.Wait()
	if len(root.late) > 0 {
		t.Fatalf("FLUSHes of pids %v waited a minute for the others", root.late)
	}
	for i := range uint32(n) {
		if got, want := root.owners[i], 1000+uint64(i); got != want {
			t.Errorf("FLUSH of pid %d: node saw lock owner %d, want %d", i, got, want)
		}
		_, marked := releases.flushed[fileKey{gofuse.FUSE_ROOT_ID, fhs[i]}]
		if want := i%2 == 1; marked != want {
			t.Errorf("FLUSH of pid %d: marked flushed holding locks %v, want %v", i, marked, want)
		}
	}
}

// TestRequestInfoWrite checks that concurrent WRITEs, on both of go-fuse's
// paths, each reach the node method with their own FUSE_WRITE_KILL_SUIDGID.
func TestRequestInfoWrite(t *testing.T) {
	const n = 8
	raw, root, _ := probeMount(t, n)
	fhs := openProbe(t, raw, 1)
	kernelCancel := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := &gofuse.WriteIn{InHeader: gofuse.InHeader{NodeId: gofuse.FUSE_ROOT_ID, Caller: gofuse.Caller{Pid: uint32(i)}},
				Fh: fhs[0], Size: 1}
			if i%2 == 1 {
				in.WriteFlags = gofuse.WRITE_KILL_SUIDGID
			}
			if i%4 < 2 {
				raw.Write(kernelCancel, in, []byte{'x'})
			} else {
				raw.Writev(kernelCancel, in, [][]byte{{'x'}})
			}
		}()
	}
	wg.Wait()
	if len(root.late) > 0 {
		t.Fatalf("WRITEs of pids %v waited a minute for the others", root.late)
	}
	for i := range uint32(n) {
		kill, ok := root.kills[i]
		if !ok {
			t.Errorf("WRITE of pid %d did not reach the node", i)
		} else if want := i%2 == 1; kill != want {
			t.Errorf("WRITE of pid %d: node saw kill-suidgid %v, want %v", i, kill, want)
		}
	}
}
