package fuse

import (
	"context"
	"sync"

	"github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"
)

// rawHooks wraps go-fuse's node file system to pass on what its fs API
// drops: FLUSH's lock owner (FlushIn.LockOwner, for releasing a
// process's locks at close) and WRITE's flags (WriteIn.WriteFlags, for
// FUSE_WRITE_KILL_SUIDGID). The request's cancel channel is the key:
// go-fuse hands the same channel to the fuse.Context of the call, and it
// is unique while the request runs.
type rawHooks struct {
	gofuse.RawFileSystem
	flushOwners *sync.Map // cancel channel -> lock owner
	writeFlags  *sync.Map // cancel channel -> WriteIn.WriteFlags
}

// Flush records the lock owner for the duration of the call.
func (r rawHooks) Flush(cancel <-chan struct{}, in *gofuse.FlushIn) gofuse.Status {
	r.flushOwners.Store(cancel, in.LockOwner)
	defer r.flushOwners.Delete(cancel)
	return r.RawFileSystem.Flush(cancel, in)
}

// Write records the write flags for the duration of the call.
func (r rawHooks) Write(cancel <-chan struct{}, in *gofuse.WriteIn, data []byte) (uint32, gofuse.Status) {
	if in.WriteFlags&gofuse.WRITE_KILL_SUIDGID == 0 {
		return r.RawFileSystem.Write(cancel, in, data)
	}
	r.writeFlags.Store(cancel, in.WriteFlags)
	defer r.writeFlags.Delete(cancel)
	return r.RawFileSystem.Write(cancel, in, data)
}

// Writev is Write for go-fuse's vectored path (tried first; the node
// file system answers ENOSYS for a handle without FileWritever, and the
// server then calls Write).
func (r rawHooks) Writev(cancel <-chan struct{}, in *gofuse.WriteIn, data [][]byte) (uint32, gofuse.Status) {
	if in.WriteFlags&gofuse.WRITE_KILL_SUIDGID == 0 {
		return r.RawFileSystem.Writev(cancel, in, data)
	}
	r.writeFlags.Store(cancel, in.WriteFlags)
	defer r.writeFlags.Delete(cancel)
	return r.RawFileSystem.Writev(cancel, in, data)
}

// requestValue looks up what a hook stored for the request of ctx.
func requestValue(m *sync.Map, ctx context.Context) (any, bool) {
	fc, ok := ctx.(*gofuse.Context)
	if !ok {
		return nil, false
	}
	return m.Load((<-chan struct{})(fc.Cancel))
}

// flushOwner returns the lock owner of the FLUSH whose context is ctx.
func (f *FS) flushOwner(ctx context.Context) (uint64, bool) {
	v, ok := requestValue(&f.flushOwners, ctx)
	if !ok {
		return 0, false
	}
	return v.(uint64), true
}

// writeKillsPriv reports whether the kernel asked the WRITE of ctx to
// clear the set-user-ID and set-group-ID bits (the writer lacks
// CAP_FSETID; FUSE_HANDLE_KILLPRIV_V2).
func (f *FS) writeKillsPriv(ctx context.Context) bool {
	_, ok := requestValue(&f.writeFlags, ctx)
	return ok
}

// mount is fs.Mount with rawHooks around the node file system.
func (f *FS) mount(dir string, root fs.InodeEmbedder, opts *fs.Options) (*gofuse.Server, error) {
	raw := rawHooks{RawFileSystem: fs.NewNodeFS(root, opts), flushOwners: &f.flushOwners, writeFlags: &f.writeFlags}
	srv, err := gofuse.NewServer(raw, dir, &opts.MountOptions)
	if err != nil {
		return nil, err
	}
	// INIT is done; no request is served before srv.Serve.
	f.directIOMmap = srv.KernelSettings().Flags64()&gofuse.CAP_DIRECT_IO_ALLOW_MMAP != 0
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		return nil, err
	}
	return srv, nil
}
