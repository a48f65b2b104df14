package fuse

import (
	"context"

	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// Client is what a mount needs of an NFSv4.1 client: the operations the
// FUSE requests turn into, declared here by their one user so that the
// caches, the write-back and the folds of this package can run over
// another implementation too (an in-memory one in tests). NFSClient
// makes one of an *nfsclient.Client, whose methods of the same names
// document what each does; the NFSv4.2 operations are v42Ops, taken when
// a Client has them.
type Client interface {
	// Session parameters.
	Cred(uid, gid uint32, groups []uint32) oncrpc.Credential
	RootFH() []byte
	RSize() int
	WSize() int
	MaxFileSize() uint64

	// Delegations (deleg.go) and the end of the session.
	SetRecallHandler(h nfsclient.RecallHandler)
	Delegated(fh []byte) bool
	ReturnDelegation(fh []byte)
	Abandon()
	Close(ctx context.Context) error

	// Attributes and the namespace.
	GetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte) (nfsclient.Attr, error)
	SetAttr(ctx context.Context, cred oncrpc.Credential, fh []byte, sid nfsclient.StateID, sa *nfsclient.SetAttr) (nfsclient.Attr, error)
	Access(ctx context.Context, cred oncrpc.Credential, fh []byte, mask uint32) (granted uint32, err error)
	StatFS(ctx context.Context, cred oncrpc.Credential, fh []byte) (nfsclient.Attr, error)
	Lookup(ctx context.Context, cred oncrpc.Credential, dir []byte, name string) ([]byte, nfsclient.Attr, error)
	LookupParent(ctx context.Context, cred oncrpc.Credential, dir []byte) ([]byte, nfsclient.Attr, error)
	Readlink(ctx context.Context, cred oncrpc.Credential, fh []byte) (string, error)
	Mkdir(ctx context.Context, cred oncrpc.Credential, dir []byte, name string, sa *nfsclient.SetAttr) (nfsclient.Made, error)
	Mknod(ctx context.Context, cred oncrpc.Credential, dir []byte, name string, typ nfsclient.FileType, major, minor uint32, sa *nfsclient.SetAttr) (nfsclient.Made, error)
	Symlink(ctx context.Context, cred oncrpc.Credential, dir []byte, name, target string, sa *nfsclient.SetAttr) (nfsclient.Made, error)
	Link(ctx context.Context, cred oncrpc.Credential, fh, dir []byte, name string) (nfsclient.Attr, nfsclient.DirChange, error)
	Remove(ctx context.Context, cred oncrpc.Credential, dir []byte, name string) (nfsclient.DirChange, error)
	Rename(ctx context.Context, cred oncrpc.Credential, srcDir []byte, srcName string, dstDir []byte, dstName string) (src, dst nfsclient.DirChange, err error)
	ReadDir(ctx context.Context, cred oncrpc.Credential, dir []byte, cookie uint64, verf [8]byte, maxBytes int) (nfsclient.ReadDirPage, error)
	ReadDirAll(ctx context.Context, cred oncrpc.Credential, dir []byte) ([]nfsclient.DirEntry, error)
	ReadDirPlusAll(ctx context.Context, cred oncrpc.Credential, dir []byte) ([]nfsclient.DirEntry, error)

	// Open state and file data.
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
	// NewLocker returns the byte-range lock state of lock-owner id on
	// the open file of.
	NewLocker(of *nfsclient.OpenFile, id uint64) Locker
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

// Locker is one lock-owner's byte-range locks on one open file
// (nfsclient.Locker and the Client's LOCK, LOCKT and LOCKU).
type Locker interface {
	// Held reports whether the owner holds any lock.
	Held() bool
	// Lock takes a lock without waiting (LOCK): nfsclient.ErrDenied
	// when another owner holds a conflicting one.
	Lock(ctx context.Context, cred oncrpc.Credential, typ nfsclient.LockType, off, length uint64) error
	// LockWait takes a lock, waiting for a conflicting one to go until
	// lockCtx ends; ctx bounds each LOCK.
	LockWait(ctx, lockCtx context.Context, cred oncrpc.Credential, typ nfsclient.LockType, off, length uint64) error
	// TestLock returns the lock that conflicts with the one described
	// (LOCKT), or nil.
	TestLock(ctx context.Context, cred oncrpc.Credential, typ nfsclient.LockType, off, length uint64) (*nfsclient.LockDenied, error)
	// Unlock releases a range (LOCKU).
	Unlock(ctx context.Context, cred oncrpc.Credential, off, length uint64) error
}

// NFSClient returns c as the Client of a mount.
func NFSClient(c *nfsclient.Client) Client { return nfsClient{c} }

// nfsClient is an *nfsclient.Client as a Client: the methods are its
// own, but for the two that return handles, which return them as this
// package's interfaces.
type nfsClient struct{ *nfsclient.Client }

var (
	_ Client         = nfsClient{}
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
