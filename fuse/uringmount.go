package fuse

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/rdmafs/rdmafs/fuse/uring"
)

// URingMode says whether a mount is served over FUSE-over-io_uring.
type URingMode int

const (
	// URingOff serves the mount with read(2) and writev(2) on
	// /dev/fuse, go-fuse's own loop.
	URingOff URingMode = iota
	// URingAuto uses io_uring where the kernel offers it and /dev/fuse
	// where it does not.
	URingAuto
	// URingOn requires io_uring: the mount fails without it.
	URingOn
)

func (m URingMode) String() string {
	switch m {
	case URingOff:
		return "off"
	case URingAuto:
		return "auto"
	case URingOn:
		return "on"
	}
	return "URingMode(" + strconv.Itoa(int(m)) + ")"
}

// errNoURing explains a kernel that does not offer FUSE over io_uring.
var errNoURing = errors.New("the kernel does not offer FUSE over io_uring (Linux 6.14 and later; as root: echo Y > /sys/module/fuse/parameters/enable_uring)")

// FUSETransport says how the kernel's requests reach the mount:
// "io_uring" or "/dev/fuse".
func (f *FS) FUSETransport() string {
	if f.ring != nil {
		return "io_uring"
	}
	return "/dev/fuse"
}

// RingRequests returns how many requests came over io_uring.
func (f *FS) RingRequests() uint64 {
	if f.ring == nil {
		return 0
	}
	return f.ring.Requests()
}

// mountURing mounts dir and serves it over io_uring where the kernel
// offers it.
//
// go-fuse has no io_uring loop, but it has ProtocolServer, its request
// decoder and dispatcher without a device: the rings hand it each
// request as /dev/fuse would have (package uring). go-fuse's Server
// still mounts and answers INIT, which offers FUSE_OVER_IO_URING (fs.go),
// and sends the mount's notifications. The /dev/fuse descriptor stays
// open with a reader of our own: requests come there until every CPU's
// queue has an entry, and FORGET and INTERRUPT always do. That reader
// answers with the same ProtocolServer, so an INTERRUPT finds the
// request it is for, whichever way that came.
func (f *FS) mountURing(dir string, raw gofuse.RawFileSystem, mo *gofuse.MountOptions) (*gofuse.Server, error) {
	srv, dev, err := newServerWithFD(raw, dir, mo)
	if err != nil {
		return nil, err
	}
	ks := srv.KernelSettings()
	f.directIOMmap = ks.Flags64()&gofuse.CAP_DIRECT_IO_ALLOW_MMAP != 0

	ps := gofuse.NewProtocolServer(raw, mo)
	var ring *uring.Server
	if ks.Flags64()&gofuse.CAP_OVER_IO_URING == 0 {
		err = errNoURing
	} else if err = initProtocolServer(ps, ks); err == nil {
		ring, err = uring.Start(dev, ps, uring.Config{Depth: f.opts.URingDepth, MaxPayload: mo.MaxWrite})
	}
	if err != nil {
		if f.opts.URing == URingOn {
			// Serve /dev/fuse so the unmount completes.
			go srv.Serve()
			srv.Unmount()
			return nil, fmt.Errorf("FUSE over io_uring: %w", err)
		}
		if f.opts.Debug {
			log.Printf("rdmafs: FUSE over io_uring: %v; serving /dev/fuse", err)
		}
		go srv.Serve()
	} else {
		f.ring = ring
		go serveDevFuse(dev, ps, srv, ring, mo.MaxWrite)
	}
	if err := waitMount(srv, dir); err != nil {
		return nil, err
	}
	return srv, nil
}

// initProtocolServer replays the connection's INIT to ps, which learns
// the kernel's protocol version and the negotiated flags from it (the
// reply, the same go-fuse's Server sent, goes nowhere).
func initProtocolServer(ps *gofuse.ProtocolServer, ks *gofuse.InitIn) error {
	in := *ks // InitIn starts with the INIT request's InHeader
	in.Length = uint32(unsafe.Sizeof(in))
	req := unsafe.Slice((*byte)(unsafe.Pointer(&in)), unsafe.Sizeof(in))
	out := make([]byte, 4096)
	n, st := ps.HandleRequest([][]byte{req}, [][]byte{out})
	if !st.Ok() || n < 16 {
		return fmt.Errorf("replaying INIT: %v", st)
	}
	// fuse_out_header: len, error (a negative errno), unique.
	if errno := int32(binary.NativeEndian.Uint32(out[4:])); errno != 0 {
		return fmt.Errorf("replaying INIT: %w", syscall.Errno(-errno))
	}
	return nil
}

// serveDevFuse reads what still comes on /dev/fuse next to the rings
// and answers it with ps. At unmount (ENODEV) it stops the rings and
// lets srv.Serve see the end too, which completes srv.Unmount and runs
// the file system's OnUnmount.
func serveDevFuse(dev int, ps *gofuse.ProtocolServer, srv *gofuse.Server, ring *uring.Server, maxWrite int) {
	// The kernel refuses reads into less than max_write plus the
	// headers (and FUSE_MIN_READ_BUFFER).
	size := max(maxWrite+64<<10, 128<<10)
	bufs := sync.Pool{New: func() any { b := make([]byte, size); return &b }}
	for {
		bp := bufs.Get().(*[]byte)
		n, err := syscall.Read(dev, *bp)
		if err != nil {
			bufs.Put(bp)
			if err == syscall.EINTR || err == syscall.EAGAIN {
				continue
			}
			if err != syscall.ENODEV {
				log.Printf("rdmafs: reading /dev/fuse: %v", err)
			}
			break
		}
		go func() {
			defer bufs.Put(bp)
			out := bufs.Get().(*[]byte)
			defer bufs.Put(out)
			m, st := ps.HandleRequest([][]byte{(*bp)[:n]}, [][]byte{*out})
			if m == 0 {
				if !st.Ok() {
					log.Printf("rdmafs: /dev/fuse request of %d bytes: %v", n, st)
				}
				return
			}
			// ENOENT: the request was interrupted and is gone.
			if _, err := syscall.Write(dev, (*out)[:m]); err != nil && err != syscall.ENOENT && err != syscall.ENODEV {
				log.Printf("rdmafs: writing /dev/fuse: %v", err)
			}
		}()
	}
	ring.Close()
	srv.Serve()
}

// fdMu makes the descriptor diff of newServerWithFD see only its own
// mount's /dev/fuse.
var fdMu sync.Mutex

// newServerWithFD is gofuse.NewServer that also returns the /dev/fuse
// descriptor of the new mount, which go-fuse keeps to itself: the
// /dev/fuse descriptor that is open after NewServer and was not before.
func newServerWithFD(raw gofuse.RawFileSystem, dir string, mo *gofuse.MountOptions) (*gofuse.Server, int, error) {
	fdMu.Lock()
	defer fdMu.Unlock()
	before, err := devFuseFDs()
	if err != nil {
		return nil, -1, err
	}
	srv, err := gofuse.NewServer(raw, dir, mo)
	if err != nil {
		return nil, -1, err
	}
	after, err := devFuseFDs()
	var fresh []int
	for fd := range after {
		if !before[fd] {
			fresh = append(fresh, fd)
		}
	}
	if err == nil && len(fresh) != 1 {
		err = fmt.Errorf("%d new /dev/fuse descriptors", len(fresh))
	}
	if err != nil {
		go srv.Serve()
		srv.Unmount()
		return nil, -1, fmt.Errorf("finding the mount's /dev/fuse descriptor: %w", err)
	}
	return srv, fresh[0], nil
}

// devFuseFDs returns the process's descriptors open on /dev/fuse.
func devFuseFDs() (map[int]bool, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	fds := make(map[int]bool)
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && target == "/dev/fuse" {
			fds[fd] = true
		}
	}
	return fds, nil
}
