//go:build cgo && linux && !noibverbs

package ibverbs

/*
#cgo LDFLAGS: -libverbs -lrdmacm
#include "helpers.h"

static int query_port_state(struct ibv_context *ctx, int port) {
	struct ibv_port_attr a;
	if (ibv_query_port(ctx, port, &a)) return -errno;
	return a.state;
}
*/
import "C"

import (
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/verbs"
)

// Compile-time checks that the Go copies of the enums match the headers:
// an array length must be non-negative both ways round.
var (
	_ [C.IBV_WC_WR_FLUSH_ERR - wcWRFlushErr]struct{}
	_ [wcWRFlushErr - C.IBV_WC_WR_FLUSH_ERR]struct{}
	_ [C.IBV_WC_REM_ACCESS_ERR - wcRemAccessErr]struct{}
	_ [wcRemAccessErr - C.IBV_WC_REM_ACCESS_ERR]struct{}
	_ [C.IBV_WC_GENERAL_ERR - wcGeneralErr]struct{}
	_ [wcGeneralErr - C.IBV_WC_GENERAL_ERR]struct{}
	_ [C.RDMA_CM_EVENT_ESTABLISHED - cmEstablished]struct{}
	_ [cmEstablished - C.RDMA_CM_EVENT_ESTABLISHED]struct{}
	_ [C.RDMA_CM_EVENT_TIMEWAIT_EXIT - cmTimewaitExit]struct{}
	_ [cmTimewaitExit - C.RDMA_CM_EVENT_TIMEWAIT_EXIT]struct{}
)

// Queue sizes (capped by the device's limits).
const (
	queueDepth  = 1024
	pollEvery   = 100 * time.Millisecond // idle wake-up of the event loops
	drainWait   = 5 * time.Second        // Close waits this long for flushes
	resolveMS   = 5000
	defaultRead = 16
)

// Provider is an open RDMA device: its verbs context and protection
// domain, shared by every queue pair it makes. It implements
// verbs.Provider and verbs.DomainProvider.
type Provider struct {
	info   DeviceInfo
	port   int
	ctx    *C.struct_ibv_context
	pd     *C.struct_ibv_pd
	maxSGE int
	// maxRead is the most SGEs of an RDMA Read's sink: 1 on iWARP (RFC
	// 5040 s4.4: a Read Request names one sink STag; siw places the
	// whole response into the first SGE of a longer list).
	maxRead int
	maxWR   int
	maxCQE  int
	maxRD   int // max_qp_rd_atom (IRD)
	maxIRD  int // max_qp_init_rd_atom (ORD)
	// windows: the device has type-2 memory windows and the domains
	// made from now on expose calls' bytes with them (window.go).
	windows   bool
	windowCap bool
}

var (
	_ verbs.Provider       = (*Provider)(nil)
	_ verbs.DomainProvider = (*Provider)(nil)
)

// Open opens the RDMA device called name (an ibv device name such as
// mlx5_0, rxe0 or siw0), or, if name is empty, the first device with an
// active port. Errors wrap ErrNoDevice or ErrNoActivePort.
func Open(name string) (*Provider, error) {
	devs, err := Devices(SysfsRoot)
	if err != nil {
		return nil, err
	}
	info, port, err := ChooseDevice(devs, name)
	if err != nil {
		return nil, err
	}
	// librdmacm's contexts are the ones its cm_ids are bound to.
	var n C.int
	list := C.rdma_get_devices(&n)
	if list == nil {
		return nil, fmt.Errorf("%w: rdma_get_devices: %w", ErrNoDevice, syscall.Errno(C.errno_of()))
	}
	defer C.rdma_free_devices(list)
	ctxs := unsafe.Slice(list, int(n))
	p := &Provider{info: info, port: port}
	for _, c := range ctxs {
		if C.GoString(C.dev_name(c)) == info.Name {
			p.ctx = c
		}
	}
	if p.ctx == nil {
		return nil, fmt.Errorf("%w: %s is in sysfs but librdmacm cannot open it (is rdma_ucm/ib_uverbs loaded, is the provider library installed?)", ErrNoDevice, info.Name)
	}
	if st := C.query_port_state(p.ctx, C.int(port)); st != C.IBV_PORT_ACTIVE {
		return nil, fmt.Errorf("%w on %s port %d (state %d)", ErrNoActivePort, info.Name, port, int(st))
	}
	var attr C.struct_ibv_device_attr
	if rc := C.ibv_query_device(p.ctx, &attr); rc != 0 {
		return nil, fmt.Errorf("ibverbs: query %s: %w", info.Name, syscall.Errno(rc))
	}
	p.maxSGE = min(verbs.MaxSGE, int(attr.max_sge))
	p.maxRead = p.maxSGE
	if info.IWARP() {
		p.maxRead = 1
	}
	p.maxWR = min(queueDepth, int(attr.max_qp_wr))
	p.maxCQE = int(attr.max_cqe)
	p.maxRD = int(attr.max_qp_rd_atom)
	p.maxIRD = int(attr.max_qp_init_rd_atom)
	p.windowCap = attr.max_mw > 0 && attr.device_cap_flags&(C.IBV_DEVICE_MEM_WINDOW_TYPE_2A|C.IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0
	// Off unless asked for: rxe (Linux 6.1) checks an RDMA access
	// through a window against the bounds of the region it is bound in,
	// not the window's, so the peer could reach the whole slab chunk
	// (the conformance suite's WritePastWindow, WriteBeforeWindow and
	// ReadPastWindow pass through), and a Send With Invalidate of a
	// window brought the guest's kernel down.
	p.windows = p.windowCap && os.Getenv(EnvWindows) != ""
	raiseMemlock()
	p.pd = C.ibv_alloc_pd(p.ctx)
	if p.pd == nil {
		return nil, fmt.Errorf("ibverbs: ibv_alloc_pd on %s: %w", info.Name, syscall.Errno(C.errno_of()))
	}
	return p, nil
}

// raiseMemlock lifts the locked-memory limit as far as allowed: every
// registration pins pages, a per-call registration pins slab pages a
// second time, and some drivers (siw) count pins against RLIMIT_MEMLOCK
// even for root.
func raiseMemlock() {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim) != nil {
		return
	}
	inf := unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}
	if unix.Setrlimit(unix.RLIMIT_MEMLOCK, &inf) == nil {
		return
	}
	lim.Cur = lim.Max
	_ = unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lim)
}

// Close releases the protection domain. Queue pairs and regions must be
// gone.
func (p *Provider) Close() error {
	if p.pd != nil {
		if rc := C.ibv_dealloc_pd(p.pd); rc != 0 {
			return fmt.Errorf("ibverbs: ibv_dealloc_pd: %w", syscall.Errno(rc))
		}
		p.pd = nil
	}
	return nil
}

// EnvWindows, set to anything, makes Open choose memory windows where
// the device has them; by default it uses per-call registration.
const EnvWindows = "RDMAFS_IBVERBS_WINDOWS"

// MemoryWindows reports whether the protection domains made from now on
// expose memory with type-2 memory windows bound by posted work requests
// (true where the device has them, unless switched off), rather than by
// per-call registration.
func (p *Provider) MemoryWindows() bool { return p.windows }

// SetMemoryWindows switches memory windows on (where the device has them)
// or off for the protection domains made from now on.
func (p *Provider) SetMemoryWindows(on bool) { p.windows = on && p.windowCap }

// WindowBinds returns how many memory-window binds the queue pairs of pd
// posted (0 when pd does not use windows).
func WindowBinds(pd *verbs.ProtectionDomain) uint64 {
	if h, ok := link.HookOf(pd).(*hook); ok {
		return h.binds.Load()
	}
	return 0
}

// Device returns the device in use.
func (p *Provider) Device() DeviceInfo { return p.info }

// Port returns the active port in use.
func (p *Provider) Port() int { return p.port }

// MaxSGE returns the most scatter/gather elements a work request may
// have on this device (at most verbs.MaxSGE; siw takes 6).
func (p *Provider) MaxSGE() int { return p.maxSGE }

// MaxReadSGE returns the most scatter/gather elements of an RDMA Read's
// sink (1 on iWARP devices).
func (p *Provider) MaxReadSGE() int { return p.maxRead }

// RemoteInvalidate reports whether the peer may invalidate our exposed
// regions with Send With Invalidate (iWARP devices only; see the package
// documentation).
func (p *Provider) RemoteInvalidate() bool { return p.info.IWARP() }

// String describes the provider for traces and statistics.
func (p *Provider) String() string {
	return fmt.Sprintf("ibverbs %s port %d (%s)", p.info.Name, p.port, p.info.Kind())
}
