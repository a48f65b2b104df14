package nfs

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"sync"
	"syscall"

	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// commitAfter is how many bytes a File writes unstable before it commits
// them: the data stays in memory until committed, to be sent again if
// the server restarts and loses it (RFC 8881 s18.32.3).
const commitAfter = 64 << 20

// readsInFlight bounds the READs one ReadAt keeps in flight.
const readsInFlight = 8

// File is an open file or directory on the export. Regular files hold
// NFSv4 open state (OPEN, RFC 8881 s18.16) until Close. Writes are sent
// UNSTABLE and made stable by Sync and Close (COMMIT, s18.3), which
// send them again if the server lost them in a restart.
//
// The methods of the io interfaces take no context: the Client's
// Options.CallTimeout bounds them. The Context variants take one. A
// File is safe for concurrent use: reads run in parallel, writes to one
// File one at a time (each in WRITEs in flight at once); Read, Write and
// Seek share its offset.
type File struct {
	c    *Client
	name string
	flag int
	fh   []byte
	dir  bool
	of   *nfsclient.OpenFile       // nil for a directory
	w    *nfsclient.UnstableWriter // nil unless opened for writing

	// wmu serialises the calls on w, which is not safe for a Flush
	// while another goroutine's WriteAt starts writes.
	wmu sync.Mutex

	mu      sync.Mutex
	closed  bool
	offset  int64
	dirEnts []fs.DirEntry // what ReadDir has not returned yet
	dirRead bool          // dirEnts was read
	locker  *nfsclient.Locker
}

// Open opens the file name for reading.
func (c *Client) Open(ctx context.Context, name string) (*File, error) {
	return c.OpenFile(ctx, name, os.O_RDONLY, 0)
}

// Create creates or truncates the file name, opened for reading and
// writing, with permissions 0666 (before the server's umask, if any).
func (c *Client) Create(ctx context.Context, name string) (*File, error) {
	return c.OpenFile(ctx, name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
}

// OpenFile opens the file name with the flags of package os (O_RDONLY,
// O_WRONLY or O_RDWR, and O_CREATE, O_EXCL, O_TRUNC, O_APPEND), creating
// it with perm. A directory opens read-only, for ReadDir. O_APPEND
// writes at the size the server reports before each write, which
// another client's writes may race.
func (c *Client) OpenFile(ctx context.Context, name string, flag int, perm fs.FileMode) (*File, error) {
	f, err := c.openFile(ctx, name, flag, perm)
	if err != nil {
		return nil, pathErr("open", name, err)
	}
	return f, nil
}

func (c *Client) openFile(ctx context.Context, name string, flag int, perm fs.FileMode) (*File, error) {
	var access uint32
	switch flag & (os.O_RDONLY | os.O_WRONLY | os.O_RDWR) {
	case os.O_RDONLY:
		access = nfsclient.ShareAccessRead
	case os.O_WRONLY:
		access = nfsclient.ShareAccessWrite
	case os.O_RDWR:
		access = nfsclient.ShareAccessBoth
	default:
		return nil, syscall.EINVAL
	}
	writable := access&nfsclient.ShareAccessWrite != 0
	f := &File{c: c, name: name, flag: flag}
	n, err := c.resolve(ctx, name, true)
	switch {
	case err == nil:
		if flag&(os.O_CREATE|os.O_EXCL) == os.O_CREATE|os.O_EXCL {
			return nil, syscall.EEXIST
		}
		if n.attr.Type == nfsclient.TypeDir {
			if writable || flag&os.O_TRUNC != 0 {
				return nil, syscall.EISDIR
			}
			f.fh, f.dir = n.fh, true
			return f, nil
		}
		// CLAIM_FH (RFC 8881 s18.16.3): the handle resolve found.
		f.of, err = c.nfs.OpenFH(ctx, c.cred, n.fh, access, nfsclient.ShareDenyNone)
	case errors.Is(err, nfsclient.ErrNoEnt) && flag&os.O_CREATE != 0:
		dir, base, perr := c.resolveParent(ctx, name, syscall.EISDIR)
		if perr != nil {
			return nil, perr
		}
		mode := modeBits(perm)
		how := nfsclient.Unchecked
		if flag&os.O_EXCL != 0 {
			how = nfsclient.Guarded // RFC 8881 s18.16.3: EXIST if it does
		}
		f.of, err = c.nfs.Open(ctx, c.cred, dir.fh, base, nfsclient.OpenArgs{
			Access: access, Deny: nfsclient.ShareDenyNone, Create: how,
			Attr: &nfsclient.SetAttr{Mode: &mode},
		})
	}
	if err != nil {
		return nil, err
	}
	f.fh = f.of.FH
	if flag&os.O_TRUNC != 0 && writable && !(f.of.Created && f.of.Attr.Size == 0) {
		zero := uint64(0)
		if _, err := c.nfs.SetAttr(ctx, c.cred, f.fh, f.of.StateID, &nfsclient.SetAttr{Size: &zero}); err != nil {
			c.nfs.CloseFile(ctx, c.cred, f.of)
			return nil, err
		}
	}
	if writable {
		f.w = c.nfs.NewUnstableWriter(c.cred, f.of, 0)
	}
	return f, nil
}

// Name returns the name the file was opened with.
func (f *File) Name() string { return f.name }

// check reports why the file cannot be used for op: closed, or a
// directory.
func (f *File) check(op string, write bool) error {
	f.mu.Lock()
	closed := f.closed
	f.mu.Unlock()
	switch {
	case closed:
		return &fs.PathError{Op: op, Path: f.name, Err: fs.ErrClosed}
	case f.dir:
		return pathErr(op, f.name, syscall.EISDIR)
	case write && f.w == nil:
		return pathErr(op, f.name, syscall.EBADF)
	case !write && op == "read" && f.flag&(os.O_WRONLY|os.O_RDWR) == os.O_WRONLY:
		// As a local file: the server may allow READ with a write-only
		// open (RFC 8881 s18.22.4), POSIX does not.
		return pathErr(op, f.name, syscall.EBADF)
	}
	return nil
}

// Read reads from the file's offset.
func (f *File) Read(p []byte) (int, error) {
	if err := f.check("read", false); err != nil {
		return 0, err
	}
	ctx, cancel := f.c.defaultCtx()
	defer cancel()
	f.mu.Lock()
	defer f.mu.Unlock()
	n, err := f.readAt(ctx, p, f.offset)
	f.offset += int64(n)
	if n > 0 && err == io.EOF {
		err = nil // the next Read reports it
	}
	return n, err
}

// ReadAt reads len(p) bytes at off; fewer only at the end of the file
// (io.EOF) or on an error.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	ctx, cancel := f.c.defaultCtx()
	defer cancel()
	return f.ReadAtContext(ctx, p, off)
}

// ReadAtContext is ReadAt with a context: READs of at most the
// session's rsize (RFC 8881 s18.22), up to readsInFlight at once.
func (f *File) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if err := f.check("read", false); err != nil {
		return 0, err
	}
	return f.readAt(ctx, p, off)
}

func (f *File) readAt(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, pathErr("read", f.name, syscall.EINVAL)
	}
	read := func(ctx context.Context, off uint64, dest oncrpc.View) (int, bool, error) {
		return f.c.nfs.Read(ctx, f.c.cred, f.fh, f.of.StateID, off, dest)
	}
	n, err := nfsclient.ReadRange(ctx, read, oncrpc.Plain(p), uint64(off), f.c.nfs.RSize(), readsInFlight)
	if err != nil {
		return n, pathErr("read", f.name, err)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// readAll reads the whole file from its start.
func (f *File) readAll(ctx context.Context) ([]byte, error) {
	var buf bytes.Buffer
	chunk := make([]byte, f.c.nfs.RSize())
	var off int64
	for {
		n, err := f.ReadAtContext(ctx, chunk, off)
		buf.Write(chunk[:n])
		off += int64(n)
		if err == io.EOF {
			return buf.Bytes(), nil
		}
		if err != nil {
			return buf.Bytes(), err
		}
	}
}

// Write writes at the file's offset, or at its end with O_APPEND.
func (f *File) Write(p []byte) (int, error) {
	ctx, cancel := f.c.defaultCtx()
	defer cancel()
	if err := f.check("write", true); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.flag&os.O_APPEND != 0 {
		attr, err := f.c.nfs.GetAttr(ctx, f.c.cred, f.fh)
		if err != nil {
			return 0, pathErr("write", f.name, err)
		}
		f.offset = int64(attr.Size)
	}
	n, err := f.writeAt(ctx, p, f.offset)
	f.offset += int64(n)
	return n, err
}

// WriteAt writes p at off. A file opened with O_APPEND refuses it, as
// an os.File does.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	ctx, cancel := f.c.defaultCtx()
	defer cancel()
	return f.WriteAtContext(ctx, p, off)
}

// WriteAtContext is WriteAt with a context: UNSTABLE WRITEs of at most
// the session's wsize, several in flight (RFC 8881 s18.32).
func (f *File) WriteAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if err := f.check("write", true); err != nil {
		return 0, err
	}
	if f.flag&os.O_APPEND != 0 {
		return 0, pathErr("write", f.name, errors.New("WriteAt on a file opened with O_APPEND"))
	}
	return f.writeAt(ctx, p, off)
}

func (f *File) writeAt(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, pathErr("write", f.name, syscall.EINVAL)
	}
	if len(p) == 0 {
		return 0, nil
	}
	f.wmu.Lock()
	defer f.wmu.Unlock()
	// The writer keeps the data until a COMMIT says it is stable.
	if err := f.w.WriteAt(ctx, oncrpc.Plain(bytes.Clone(p)), uint64(off), nil); err != nil {
		return 0, pathErr("write", f.name, err)
	}
	if err := f.w.Flush(); err != nil {
		return 0, pathErr("write", f.name, err)
	}
	if f.w.Pending() >= commitAfter {
		if err := f.w.Commit(ctx); err != nil {
			return len(p), pathErr("write", f.name, err)
		}
	}
	return len(p), nil
}

// Seek sets the offset of the next Read or Write. For a directory only
// Seek(0, io.SeekStart) is allowed: ReadDir starts again.
func (f *File) Seek(offset int64, whence int) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return 0, &fs.PathError{Op: "seek", Path: f.name, Err: fs.ErrClosed}
	}
	if f.dir {
		if offset != 0 || whence != io.SeekStart {
			return 0, pathErr("seek", f.name, syscall.EINVAL)
		}
		f.dirEnts, f.dirRead = nil, false
		return 0, nil
	}
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += f.offset
	case io.SeekEnd:
		ctx, cancel := f.c.defaultCtx()
		defer cancel()
		attr, err := f.c.nfs.GetAttr(ctx, f.c.cred, f.fh)
		if err != nil {
			return 0, pathErr("seek", f.name, err)
		}
		offset += int64(attr.Size)
	default:
		return 0, pathErr("seek", f.name, syscall.EINVAL)
	}
	if offset < 0 {
		return 0, pathErr("seek", f.name, syscall.EINVAL)
	}
	f.offset = offset
	return offset, nil
}

// Stat returns the file's attributes (GETATTR).
func (f *File) Stat() (fs.FileInfo, error) {
	ctx, cancel := f.c.defaultCtx()
	defer cancel()
	return f.StatContext(ctx)
}

// StatContext is Stat with a context.
func (f *File) StatContext(ctx context.Context) (fs.FileInfo, error) {
	f.mu.Lock()
	closed := f.closed
	f.mu.Unlock()
	if closed {
		return nil, &fs.PathError{Op: "stat", Path: f.name, Err: fs.ErrClosed}
	}
	attr, err := f.c.nfs.GetAttr(ctx, f.c.cred, f.fh)
	if err != nil {
		return nil, pathErr("stat", f.name, err)
	}
	return newFileInfo(f.name, attr), nil
}

// Sync makes what was written stable on the server (COMMIT).
func (f *File) Sync() error {
	ctx, cancel := f.c.defaultCtx()
	defer cancel()
	return f.SyncContext(ctx)
}

// SyncContext is Sync with a context.
func (f *File) SyncContext(ctx context.Context) error {
	if err := f.check("sync", false); err != nil {
		return err
	}
	if f.w == nil {
		return nil
	}
	f.wmu.Lock()
	defer f.wmu.Unlock()
	return pathErr("sync", f.name, f.w.Commit(ctx))
}

// Truncate sets the file's size; the file must be open for writing.
func (f *File) Truncate(size int64) error {
	ctx, cancel := f.c.defaultCtx()
	defer cancel()
	return f.TruncateContext(ctx, size)
}

// TruncateContext is Truncate with a context.
func (f *File) TruncateContext(ctx context.Context, size int64) error {
	if err := f.check("truncate", true); err != nil {
		return err
	}
	if size < 0 {
		return pathErr("truncate", f.name, syscall.EINVAL)
	}
	f.wmu.Lock()
	defer f.wmu.Unlock()
	// Writes sent before must not land after the new size is set.
	if err := f.w.Flush(); err != nil {
		return pathErr("truncate", f.name, err)
	}
	s := uint64(size)
	_, err := f.c.nfs.SetAttr(ctx, f.c.cred, f.fh, f.of.StateID, &nfsclient.SetAttr{Size: &s})
	return pathErr("truncate", f.name, err)
}

// Close commits what was written, releases the file's locks and closes
// its open state (CLOSE, RFC 8881 s18.2).
func (f *File) Close() error {
	ctx, cancel := f.c.defaultCtx()
	defer cancel()
	return f.CloseContext(ctx)
}

// CloseContext is Close with a context.
func (f *File) CloseContext(ctx context.Context) error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return &fs.PathError{Op: "close", Path: f.name, Err: fs.ErrClosed}
	}
	f.closed = true
	locker := f.locker
	f.mu.Unlock()
	if f.dir {
		return nil
	}
	var errs []error
	if f.w != nil {
		f.wmu.Lock()
		if err := f.w.Commit(ctx); err != nil {
			f.w.Discard()
			errs = append(errs, err)
		}
		f.wmu.Unlock()
	}
	// RFC 8881 s18.2.3: CLOSE with locks held fails (LOCKS_HELD).
	if locker != nil && locker.Held() {
		if err := f.c.nfs.Unlock(ctx, f.c.cred, locker, 0, nfsclient.LengthToEOF); err != nil {
			errs = append(errs, err)
		}
	}
	if err := f.c.nfs.CloseFile(ctx, f.c.cred, f.of); err != nil {
		errs = append(errs, err)
	}
	return pathErr("close", f.name, errors.Join(errs...))
}

// ReadDir reads the directory's entries, in the server's order, as
// fs.ReadDirFile: n > 0 returns at most n, and io.EOF at the end; n <= 0
// returns all that are left.
func (f *File) ReadDir(n int) ([]fs.DirEntry, error) {
	ctx, cancel := f.c.defaultCtx()
	defer cancel()
	return f.ReadDirContext(ctx, n)
}

// ReadDirContext is ReadDir with a context.
func (f *File) ReadDirContext(ctx context.Context, n int) ([]fs.DirEntry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, &fs.PathError{Op: "readdir", Path: f.name, Err: fs.ErrClosed}
	}
	if !f.dir {
		return nil, pathErr("readdir", f.name, syscall.ENOTDIR)
	}
	if !f.dirRead {
		ents, err := f.c.readDir(ctx, node{fh: f.fh, attr: nfsclient.Attr{Type: nfsclient.TypeDir}})
		if err != nil {
			return nil, pathErr("readdir", f.name, err)
		}
		f.dirEnts, f.dirRead = ents, true
	}
	if n <= 0 {
		ents := f.dirEnts
		f.dirEnts = nil
		if ents == nil {
			ents = []fs.DirEntry{}
		}
		return ents, nil
	}
	if len(f.dirEnts) == 0 {
		return nil, io.EOF
	}
	n = min(n, len(f.dirEnts))
	ents := f.dirEnts[:n:n]
	f.dirEnts = f.dirEnts[n:]
	return ents, nil
}
