// Package fuse serves an NFSv4.1 export as a FUSE file system: it turns
// the kernel's FUSE requests (through go-fuse v2's fs package) into
// calls on a Client (client.go; nfsclient's through NFSClient), keeps
// the attribute and entry caches with nfs(5)'s ac* timeouts, maps FUSE
// opens to NFSv4.1 OPEN state, buffers writes into UNSTABLE WRITEs
// committed on flush and fsync, and answers READDIRPLUS from the
// attributes READDIR returned.
//
// Over RPC-over-RDMA (Options.Buffers) file data lives in the transport's
// registered memory: a READ's data is placed there by the server (when
// too large to come inline; inline data is copied there once) and
// handed to the kernel from there (a go-fuse ReadResult released in
// Done), and a WRITE's data is copied there once from go-fuse's request
// buffer, coalesced, and read from there by the server (a WRITE small
// enough to go inline is copied into the send buffer instead).
//
//	c, _ := nfsclient.Dial(ctx, nfsclient.Config{Transport: tr, Export: "/export"})
//	m, err := fuse.Serve(ctx, fuse.NFSClient(c), "/mnt", fuse.Options{FSName: "server:/export"})
//	...
//	m.Wait()              // until umount
//	m.Shutdown(ctx)       // flush, CLOSE open state, DESTROY_SESSION
package fuse

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fuse/uring"
	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// Session is the client's session: its parameters and its end.
type Session interface {
	// Cred returns the AUTH_SYS credential of a caller (cred.go).
	Cred(uid, gid uint32, groups []uint32) oncrpc.Credential
	// RootFH is the export root's file handle.
	RootFH() []byte
	// RSize and WSize are the largest READ and WRITE, MaxFileSize the
	// server's FATTR4_MAXFILESIZE (zero: unknown).
	RSize() int
	WSize() int
	MaxFileSize() uint64
	// Abandon gives up on the server: calls waiting for it fail.
	Abandon()
	// Close ends the session and the client ID.
	Close(ctx context.Context) error
}

// Options tune a mount. Zero values take nfs(5)'s defaults.
type Options struct {
	// FSName is shown as the source in /proc/mounts ("server:/export").
	FSName string
	// AcRegMin .. AcDirMax are the attribute cache timeouts of nfs(5):
	// an attribute stays cached for at least the min and, while the file
	// does not change, up to the max. NoAC turns caching off (actimeo=0).
	AcRegMin, AcRegMax time.Duration
	AcDirMin, AcDirMax time.Duration
	NoAC               bool
	// ReadOnly mounts read-only (ro).
	ReadOnly bool
	// MountFlags are mount(2)'s MS_* flags of the kernel mount: nosuid,
	// nodev, noexec, noatime, sync, ... (ReadOnly adds MS_RDONLY). Zero
	// is mount(8)'s default for root: suid, dev, exec, relatime. A mount
	// by an ordinary user goes through fusermount3, which adds MS_NOSUID
	// and MS_NODEV and can set only some flags (userMountOptions).
	MountFlags uintptr
	// AllowOther lets users other than the mounting one use the mount.
	AllowOther bool
	// MaxIO is the largest FUSE READ and WRITE (MaxWrite, max_read); zero
	// means 1 MiB.
	MaxIO int
	// CommitEvery is how many bytes one open file writes unstable
	// before a COMMIT goes out in the background (nfsclient
	// UnstableWriter.CommitEvery); zero means 32 MiB, negative only at
	// close and fsync.
	CommitEvery int
	// Buffers, if set, is the transport's registered memory: READ
	// destinations and write-back buffers are drawn from it so that the
	// transport moves the data by RDMA from and to where it is, without
	// a copy of its own (file.go Read and Write say which copies remain).
	Buffers BufferPool
	// Tracer receives FUSE trace events; nil traces nothing.
	Tracer *trace.Tracer
	// Debug logs every FUSE request (go-fuse's own debug output).
	Debug bool
	// HandleCache, if set, is a file in which the mount keeps the NFS
	// file handles it saw, loaded at mount and saved at Shutdown, so
	// that handles from name_to_handle_at still open after a remount
	// (export.go). One mount at a time uses it.
	HandleCache string
	// URing serves the mount over FUSE-over-io_uring (uringmount.go)
	// instead of read(2) and writev(2) on /dev/fuse; URingDepth is the
	// entries per CPU queue (zero: 16).
	URing      URingMode
	URingDepth int
}

func (o *Options) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if o.NoAC {
		o.AcRegMin, o.AcRegMax, o.AcDirMin, o.AcDirMax = 0, 0, 0, 0
	} else {
		// nfs(5): acregmin=3 acregmax=60 acdirmin=30 acdirmax=60.
		def(&o.AcRegMin, 3*time.Second)
		def(&o.AcRegMax, 60*time.Second)
		def(&o.AcDirMin, 30*time.Second)
		def(&o.AcDirMax, 60*time.Second)
		o.AcRegMax = max(o.AcRegMax, o.AcRegMin)
		o.AcDirMax = max(o.AcDirMax, o.AcDirMin)
	}
	if o.MaxIO <= 0 {
		o.MaxIO = 1 << 20
	}
	if o.CommitEvery == 0 {
		o.CommitEvery = defaultCommitEvery
	}
}

// defaultCommitEvery bounds the unstable data of one open file: a
// sequential write of a large file has the server flush it to disk while
// the rest arrives, as the Linux client's writeback COMMITs do, instead
// of all of it in the COMMIT at close; and the data kept for a resend
// (RFC 8881 s18.3.3) stays at most about twice this much.
const defaultCommitEvery = 32 << 20

// Counters are the FUSE layer's own statistics.
type Counters struct {
	Reads, ReadBytes   atomic.Uint64
	Writes, WriteBytes atomic.Uint64
	Opens, Creates     atomic.Uint64
	Lookups, Readdirs  atomic.Uint64
	// GetattrsAnswered counts directory GETATTRs answered from
	// attributes a change of the directory just returned (dircache.go).
	GetattrsAnswered atomic.Uint64
	Flushes, Fsyncs  atomic.Uint64
	WriteErrors      atomic.Uint64
	// BytesCopied counts data bytes this layer copied: WRITE data into
	// write-back buffers (the one copy a WRITE makes), and buffered data
	// moved to a larger buffer.
	BytesCopied atomic.Uint64
	// EIOs counts requests answered EIO: errors without a better
	// errno (an NFS status with no local meaning, a reply the client
	// could not decode). LastEIO says what the last one was.
	EIOs    atomic.Uint64
	LastEIO atomic.Pointer[EIORecord]
	// InterruptsWaited counts the FUSE_INTERRUPTs whose caller was not
	// dying, which the request waited through, InterruptsHonoured those
	// that ended their request because the caller was dying; one first
	// waited through and then honoured counts in both (interrupt.go).
	InterruptsWaited, InterruptsHonoured atomic.Uint64
}

// EIORecord is one request answered EIO and the error behind it.
type EIORecord struct {
	Time time.Time
	Op   string
	Err  string
}

// noteErrno counts errno EIO with the error behind it, for "rdmafs
// stats": the application sees only EIO.
func (c *Counters) noteErrno(op string, err error, errno syscall.Errno) {
	if errno != syscall.EIO {
		return
	}
	c.EIOs.Add(1)
	c.LastEIO.Store(&EIORecord{Time: time.Now(), Op: op, Err: err.Error()})
}

// FS is the state shared by all nodes of one mount.
type FS struct {
	c Client
	// deleg is c's delegations; nil when c has none (deleg.go).
	deleg Delegations
	opts  Options
	tr    *trace.Tracer

	// bg outlives single requests: UNSTABLE WRITEs run on it after the
	// FUSE WRITE that buffered them has returned.
	bg       context.Context
	bgCancel context.CancelFunc

	creds *credCache

	mu    sync.Mutex
	files map[*file]struct{} // open regular files
	// writers are the open files with buffered writes, by fileid: a
	// file's handle may belong to another node object than the one the
	// kernel uses for the same fileid (go-fuse merges racing lookups).
	writers map[uint64]map[*file]struct{}
	closing int        // releases in progress
	closed  *sync.Cond // signalled when closing drops

	// reqs are the requests under way that the raw hooks pass data
	// of to the node methods (request.go).
	reqs    inflight
	locks   lockTable
	nameMax int // longest name the server takes (names.go)
	// directIOMmap: the kernel maps files opened with FOPEN_DIRECT_IO
	// (FUSE_DIRECT_IO_ALLOW_MMAP); set once at INIT.
	directIOMmap bool
	// ring serves the mount's requests over io_uring; nil when
	// /dev/fuse does (uringmount.go).
	ring *uring.Server
	// rootIno is the export root's fileid; handles the file handles
	// of the fileids seen, for open_by_handle_at (export.go).
	rootIno     uint64
	handles     fileHandles
	handleCache *os.File // Options.HandleCache, locked
	// openDirs counts open directory handles by inode number; silly
	// has the names open objects were renamed to, removed at their
	// last close (silly.go). Guarded by mu.
	openDirs map[uint64]int
	silly    map[uint64][]sillyEntry
	// opening counts the OPENs under way by inode number, removing the
	// REMOVEs of a name of a file not open (silly.go). Guarded by mu;
	// removeDone is signalled when a REMOVE ends.
	opening, removing map[uint64]int
	removeDone        *sync.Cond
	sillyCount        atomic.Uint32
	sillyNames        atomic.Int64 // entries in silly, for a lock-free check
	// delegNodes are the nodes of files under a delegation, by file
	// handle, for recalls (deleg.go). Guarded by mu.
	delegNodes map[string]*node

	heap heapBuffers // recycled write-back buffers (buffers.go)

	v42 v42State // NFSv4.2 operations, when the session has them (v42.go)

	// Stats are the FUSE layer's counters.
	Stats Counters
}

// Mount is a live FUSE mount of an NFS export.
type Mount struct {
	Server *gofuse.Server
	FS     *FS
	Dir    string
}

// Serve mounts c's export on dir and starts serving it. It returns once
// the kernel has the mount (a stat of dir already goes to the NFS server).
// c is usually NFSClient of an *nfsclient.Client.
func Serve(ctx context.Context, c Client, dir string, opts Options) (*Mount, error) {
	opts.setDefaults()
	mo, err := mountOptions(&opts)
	if err != nil {
		return nil, err
	}
	f := newFS(c, opts)
	cred := c.Cred(0, 0, nil)
	a, err := c.GetAttr(ctx, cred, c.RootFH())
	if err != nil {
		f.bgCancel()
		return nil, fmt.Errorf("getattr of export root: %w", err)
	}
	f.rootIno = a.FileID
	if opts.HandleCache != "" {
		f.openHandleCache(opts.HandleCache)
	}
	root := f.newNode(c.RootFH(), &a)
	f.loadNameMax(ctx, cred)

	zero := time.Duration(0)
	fo := &fs.Options{
		MountOptions:    mo,
		EntryTimeout:    &zero, // set per entry from the ac* options
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		NullPermissions: true,
		RootStableAttr:  &fs.StableAttr{Ino: a.FileID},
		// The node ID is the inode number, the NFS fileid, so that a
		// file handle names the object after the kernel forgot it
		// (export.go).
		ExternalNodeID: true,
	}
	srv, err := f.mount(dir, root, fo)
	if err != nil {
		if f.handleCache != nil {
			f.handleCache.Close()
		}
		f.bgCancel()
		return nil, fmt.Errorf("fuse mount on %s: %w", dir, err)
	}
	setReadAhead(dir, readAheadKB)
	return &Mount{Server: srv, FS: f, Dir: dir}, nil
}

// newFS returns the state of a mount of c, not yet mounted, with the
// recall handler and the NFSv4.2 operations set up.
func newFS(c Client, opts Options) *FS {
	f := &FS{
		c:        c,
		opts:     opts,
		tr:       opts.Tracer,
		files:    make(map[*file]struct{}),
		writers:  make(map[uint64]map[*file]struct{}),
		openDirs: make(map[uint64]int),
		silly:    make(map[uint64][]sillyEntry),
		opening:  make(map[uint64]int),
		removing: make(map[uint64]int),
		creds:    newCredCache(),
	}
	f.closed = sync.NewCond(&f.mu)
	f.removeDone = sync.NewCond(&f.mu)
	f.heap.size = c.WSize()
	if d, ok := c.(Delegations); ok {
		f.deleg = d
		d.SetRecallHandler(f.recall)
	}
	if v, ok := c.(v42Ops); ok {
		f.v42.init(v)
	}
	f.bg, f.bgCancel = context.WithCancel(context.Background())
	return f
}

// mountOptions returns go-fuse's options of a mount with opts: the
// capabilities the file system uses and the kernel mount's flags.
func mountOptions(opts *Options) (gofuse.MountOptions, error) {
	mo := gofuse.MountOptions{
		FsName:         opts.FSName,
		Name:           "rdmafs",
		MaxWrite:       opts.MaxIO,
		MaxReadAhead:   opts.MaxIO,
		AllowOther:     opts.AllowOther,
		DisableXAttrs:  false, // xattr.go answers, on NFSv4.1 too (EOPNOTSUPP, no names)
		Debug:          opts.Debug,
		DisableSplice:  true, // replies are in memory already; a pipe adds a copy
		MaxBackground:  64,
		EnableLocks:    true, // fcntl and flock locks go to the server (lock.go)
		RememberInodes: false,
		// The kernel leaves clearing set-user-ID bits on write to us
		// (killpriv.go) instead of a SETATTR the server refuses.
		ExtraCapabilities: gofuse.CAP_HANDLE_KILLPRIV_V2 |
			// A file opened with O_DIRECT may be mapped too (fsx,
			// databases mix both): FUSE_DIRECT_IO_ALLOW_MMAP (Linux
			// 6.6) lets the kernel map a FOPEN_DIRECT_IO file (see
			// openFlags).
			gofuse.CAP_DIRECT_IO_ALLOW_MMAP |
			// File handles for name_to_handle_at and
			// open_by_handle_at, as an NFS mount offers
			// (export.go).
			gofuse.CAP_EXPORT_SUPPORT |
			// Asynchronous O_DIRECT (libaio, io_uring) sends a
			// file's requests to us at once instead of one at a
			// time (FUSE_ASYNC_DIO, fs/fuse/file.c fuse_direct_IO).
			gofuse.CAP_ASYNC_DIO,
	}
	if opts.URing != URingOff {
		mo.ExtraCapabilities |= gofuse.CAP_OVER_IO_URING
	}
	// The server checks every request against the caller's AUTH_SYS
	// uid, gid and groups. The kernel checks too (default_permissions),
	// from the cached mode and owner: without it, FUSE does not check
	// search permission on directories whose entries it has cached, so a
	// path walk could pass a directory the caller may not enter, which
	// the kernel NFS client prevents with ACCESS on each walk.
	mo.Options = append(mo.Options, "default_permissions")
	if err := setMountFlags(&mo, opts); err != nil {
		return mo, err
	}
	if opts.Debug {
		mo.Logger = log.New(os.Stderr, "fuse: ", log.Lmicroseconds)
	}
	return mo, nil
}

// setMountFlags puts the kernel mount's flags into mo: mount(2)'s for
// root, fusermount3's options for an ordinary user.
func setMountFlags(mo *gofuse.MountOptions, opts *Options) error {
	flags := opts.MountFlags
	if opts.ReadOnly {
		flags |= unix.MS_RDONLY
	}
	if os.Geteuid() != 0 {
		names, err := userMountOptions(flags)
		if err != nil {
			return err
		}
		mo.Options = append(mo.Options, names...)
		return nil
	}
	// mount(2) itself, with the flags as given. No flags at all are
	// spelled MS_MGC_VAL, which the kernel drops, or go-fuse would mount
	// nosuid,nodev; with flags it must not be there (it takes the bits
	// of strictatime and lazytime).
	mo.DirectMountStrict = true
	mo.DirectMountFlags = flags
	if flags == 0 {
		mo.DirectMountFlags = unix.MS_MGC_VAL
	}
	return nil
}

// userMountOptions spells flags as fusermount3's options (fuse 3.14,
// its mount_flags table), for a mount by an ordinary user.
func userMountOptions(flags uintptr) ([]string, error) {
	names := []struct {
		flag uintptr
		name string
	}{
		{unix.MS_RDONLY, "ro"}, {unix.MS_NOSUID, "nosuid"}, {unix.MS_NODEV, "nodev"},
		{unix.MS_NOEXEC, "noexec"}, {unix.MS_SYNCHRONOUS, "sync"}, {unix.MS_NOATIME, "noatime"},
		{unix.MS_DIRSYNC, "dirsync"},
		{unix.MS_RELATIME, ""}, // the kernel's default
	}
	var out []string
	for _, n := range names {
		if flags&n.flag != 0 && n.name != "" {
			out = append(out, n.name)
		}
		flags &^= n.flag
	}
	if flags != 0 {
		return nil, fmt.Errorf("mount flags %#x: fusermount3 cannot set them for an ordinary user", flags)
	}
	return out, nil
}

// readAheadKB is the kernel's read-ahead for the mount: several READs in
// flight for sequential reads, as the Linux client's 15 x rsize.
const readAheadKB = 4096

// setReadAhead raises the read-ahead of the mount's backing device info
// (FUSE starts at 128 KiB). It needs root; without it the default stays.
func setReadAhead(dir string, kb int) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	os.WriteFile(p, []byte(strconv.Itoa(kb)), 0o644)
}

// Wait blocks until the file system is unmounted.
func (m *Mount) Wait() { m.Server.Wait() }

// Unmount asks the kernel to unmount the file system.
func (m *Mount) Unmount() error { return m.Server.Unmount() }

// Abandon gives up on the server (nfsclient.Client.Abandon) and on the
// write-back: FUSE requests waiting for the server fail at once, so that
// Wait can return. Data still buffered is lost; Shutdown reports it.
func (m *Mount) Abandon() {
	m.FS.bgCancel()
	m.FS.c.Abandon()
}

// Shutdown writes back what open files still buffer, CLOSEs their open
// state and ends the client's session and client ID (RFC 8881 s18.37,
// s18.50). Call it after Wait returned.
func (m *Mount) Shutdown(ctx context.Context) error {
	f := m.FS
	// Write-back runs under the background context: when ctx ends, end
	// it too, or a hard mount would retry for ever against a server
	// that is gone.
	stop := context.AfterFunc(ctx, f.bgCancel)
	defer stop()
	f.mu.Lock()
	var files []*file
	for h := range f.files {
		files = append(files, h)
	}
	f.mu.Unlock()
	var errs []error
	start := time.Now()
	for _, h := range files {
		if errno := h.release(ctx); errno != 0 {
			errs = append(errs, fmt.Errorf("close open file: %w", errno))
		}
	}
	f.trace("shutdown: %d open files closed in %v", len(files), time.Since(start).Round(time.Microsecond))
	// RELEASEs the kernel sent just before the unmount may still be
	// running: the client ID can only go once their CLOSEs are done
	// (RFC 8881 s18.50.3, NFS4ERR_CLIENTID_BUSY). They end with ctx too
	// (bgCancel above).
	start = time.Now()
	stopWait := context.AfterFunc(ctx, func() {
		f.mu.Lock()
		f.closed.Broadcast()
		f.mu.Unlock()
	})
	f.mu.Lock()
	waited := f.closing
	for f.closing > 0 && ctx.Err() == nil {
		f.closed.Wait()
	}
	left := f.closing
	f.mu.Unlock()
	stopWait()
	if left > 0 {
		errs = append(errs, fmt.Errorf("%d RELEASEs still closing files: %w", left, ctx.Err()))
	}
	f.trace("shutdown: waited %v for %d RELEASEs (%d left)", time.Since(start).Round(time.Microsecond), waited, left)
	f.bgCancel()
	if err := f.saveHandleCache(); err != nil {
		errs = append(errs, err)
	}
	start = time.Now()
	err := f.c.Close(ctx)
	f.trace("shutdown: NFS session and client ID ended in %v: %v", time.Since(start).Round(time.Microsecond), err)
	if err != nil {
		errs = append(errs, fmt.Errorf("destroy session: %w", err))
	}
	return errors.Join(errs...)
}

// Client returns the NFS client behind the mount, for its statistics;
// nil when the mount serves a Client that is not NFSClient's.
func (f *FS) Client() *nfsclient.Client {
	if c, ok := f.c.(nfsClient); ok {
		return c.Client
	}
	return nil
}

func (f *FS) trace(format string, args ...any) {
	if f.tr.On(trace.FUSE) {
		f.tr.Printf(trace.FUSE, format, args...)
	}
}

// noteInterrupt counts and traces a FUSE_INTERRUPT (interruptWatch).
func (f *FS) noteInterrupt(tid uint32, dying bool) {
	if !dying {
		f.Stats.InterruptsWaited.Add(1)
		f.trace("INTERRUPT tid=%d: not dying: the request goes on", tid)
		return
	}
	f.Stats.InterruptsHonoured.Add(1)
	f.trace("INTERRUPT tid=%d: dying: the request ends", tid)
}

func (f *FS) addFile(h *file) {
	f.mu.Lock()
	f.files[h] = struct{}{}
	f.mu.Unlock()
}

// startClose marks h as being closed; the file stays counted until
// doneClose, so Shutdown can wait for its CLOSE.
func (f *FS) startClose(h *file) {
	f.mu.Lock()
	delete(f.files, h)
	f.closing++
	f.mu.Unlock()
}

func (f *FS) doneClose() {
	f.mu.Lock()
	f.closing--
	f.closed.Broadcast()
	f.mu.Unlock()
}
