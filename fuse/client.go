package fuse

import (
	"context"

	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// Client is what a mount needs of an NFSv4.1 client: the operations the
// FUSE requests turn into, by concern, each declared by the part of this
// package that calls it, so that the caches, the write-back and the
// folds of this package can run over another implementation too (an
// in-memory one in tests). NFSClient makes one of an *nfsclient.Client,
// whose methods of the same names document what each does. A Client
// that has them also serves Delegations (deleg.go) and the NFSv4.2
// operations (v42Ops, v42.go); without, the mount holds no delegation
// and does as on NFSv4.1.
type Client interface {
	Session    // fs.go
	Attributes // attr.go
	Namespace  // node.go
	DirReader  // dir.go
	FileData   // below
	Locks      // lock.go
}

// FileData is the open state and the file data of regular files
// (file.go).
type FileData interface {
	Open(ctx context.Context, cred oncrpc.Credential, dir []byte, name string, args nfsclient.OpenArgs) (*nfsclient.OpenFile, error)
	OpenFH(ctx context.Context, cred oncrpc.Credential, fh []byte, access, deny uint32) (*nfsclient.OpenFile, error)
	CloseFile(ctx context.Context, cred oncrpc.Credential, of *nfsclient.OpenFile) error
	Read(ctx context.Context, cred oncrpc.Credential, fh []byte, sid nfsclient.StateID, off uint64, dest oncrpc.View) (n int, eof bool, err error)
	ReadInPlace(ctx context.Context, cred oncrpc.Credential, fh []byte, sid nfsclient.StateID, off uint64, dest []byte) (data []byte, release func(), eof bool, err error)
	Write(ctx context.Context, cred oncrpc.Credential, fh []byte, sid nfsclient.StateID, off uint64, data oncrpc.View, stable nfsclient.Stable) (nfsclient.WriteResult, error)
	WriteGetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte, sid nfsclient.StateID, off uint64, data oncrpc.View, stable nfsclient.Stable) (nfsclient.WriteResult, error)
	WriteSetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte, sid nfsclient.StateID, off uint64, data oncrpc.View, stable nfsclient.Stable, setSID nfsclient.StateID, sa *nfsclient.SetAttr) (nfsclient.WriteResult, nfsclient.Attr, error)
	Commit(ctx context.Context, cred oncrpc.Credential, fh []byte, off uint64, count uint32) (nfsclient.Verifier, error)
	// NewUnstableWriter returns the write-back of the open file of,
	// keeping at most inFlight UNSTABLE WRITEs in flight.
	NewUnstableWriter(cred oncrpc.Credential, of *nfsclient.OpenFile, inFlight int) UnstableWriter
}

// UnstableWriter sends one open file's buffered data as UNSTABLE WRITEs
// and COMMITs it (nfsclient.UnstableWriter).
type UnstableWriter interface {
	// CommitEvery starts a COMMIT in the background after n unstable
	// bytes; n <= 0 leaves COMMIT to Commit.
	CommitEvery(n int)
	// WriteAt sends data at off without waiting for the reply; release
	// runs once the data is no longer needed. An error is an earlier
	// write's.
	WriteAt(ctx context.Context, data oncrpc.View, off uint64, release func()) error
	// Flush waits for the WRITEs in flight and returns the first error.
	Flush() error
	// Commit flushes, COMMITs, and sends again what a changed write
	// verifier lost (RFC 8881 s18.3.3).
	Commit(ctx context.Context) error
	// Discard drops the data kept for a resend.
	Discard()
	// Pending is how many bytes are written but not yet committed.
	Pending() int
}

// NFSClient returns c as the Client of a mount.
func NFSClient(c *nfsclient.Client) Client { return nfsClient{c} }

// nfsClient is an *nfsclient.Client as a Client: the methods are its
// own, but for the two that return handles, which return them as this
// package's interfaces.
type nfsClient struct{ *nfsclient.Client }

var (
	_ Client         = nfsClient{}
	_ Delegations    = nfsClient{}
	_ v42Ops         = nfsClient{}
	_ UnstableWriter = (*nfsclient.UnstableWriter)(nil)
	_ Locker         = nfsLocker{}
)

func (c nfsClient) NewUnstableWriter(cred oncrpc.Credential, of *nfsclient.OpenFile, inFlight int) UnstableWriter {
	return c.Client.NewUnstableWriter(cred, of, inFlight)
}

func (c nfsClient) NewLocker(of *nfsclient.OpenFile, id uint64) Locker {
	return nfsLocker{c.Client, c.Client.NewLocker(of, id)}
}

// nfsLocker is an nfsclient.Locker with the client that sends its
// LOCK, LOCKT and LOCKU.
type nfsLocker struct {
	c *nfsclient.Client
	l *nfsclient.Locker
}

func (l nfsLocker) Held() bool { return l.l.Held() }

func (l nfsLocker) Lock(ctx context.Context, cred oncrpc.Credential, typ nfsclient.LockType, off, length uint64) error {
	_, err := l.c.Lock(ctx, cred, l.l, typ, off, length)
	return err
}

func (l nfsLocker) LockWait(ctx, lockCtx context.Context, cred oncrpc.Credential, typ nfsclient.LockType, off, length uint64) error {
	return l.c.LockWait(ctx, lockCtx, cred, l.l, typ, off, length)
}

func (l nfsLocker) TestLock(ctx context.Context, cred oncrpc.Credential, typ nfsclient.LockType, off, length uint64) (*nfsclient.LockDenied, error) {
	return l.c.TestLock(ctx, cred, l.l, typ, off, length)
}

func (l nfsLocker) Unlock(ctx context.Context, cred oncrpc.Credential, off, length uint64) error {
	return l.c.Unlock(ctx, cred, l.l, off, length)
}
