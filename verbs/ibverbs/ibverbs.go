// Package ibverbs is the rdma-core provider of the verbs API: queue pairs,
// completion queues and memory regions of a real RDMA device (an
// InfiniBand or RoCE NIC, rxe, an iWARP NIC or siw) through libibverbs,
// connected with librdmacm (RDMA-CM, carrying the upper layer's RFC 8797
// private data).
//
// The provider needs cgo and the rdma-core libraries (Debian:
// libibverbs-dev, librdmacm-dev, ibverbs-providers). Built without cgo (or
// with the noibverbs tag) the package still compiles, and Open reports
// ErrUnsupported: the pure-Go iWARP provider (verbs/iwarp) is then the
// only one.
//
//	p, err := ibverbs.Open("")          // the first device with an active port
//	if err != nil { ... }
//	defer p.Close()
//	pd := p.NewProtectionDomain()      // registrations go to the device
//	qp, err := p.Dial(ctx, "server:20049", &verbs.ConnParams{PD: pd, PrivateData: pdata})
//
// Memory: only memory the caller owns outside the Go heap may be
// registered (package mrcache's mmap slab). ibv_reg_mr pins the pages
// behind an address; a Go heap slice could be freed and its pages returned
// to the OS while the region still names them. RegisterMemory therefore
// accepts only page-aligned memory of whole pages (the slab's chunks).
//
// Exposure of a call's bytes: userspace verbs have no fast-registration
// work request (IB_WR_REG_MR is kernel-only; ibv_alloc_mr does not exist
// in libibverbs). Where the device has type-2 memory windows (rxe, mlx5)
// a fast-registration region (verbs.ProtectionDomain.AllocFastReg) is a
// window: FastRegister prepares its bind to exactly the call's bytes under
// a new key, the bind work request is posted before the Send that offers
// it (the consumer's verbs.OpFastRegister or OpBindWindow work request,
// regwr.go; verbs.SendWR.Bind chains it with the Send in the old model)
// and a local invalidation work request ends it
// (window.go). Elsewhere (siw has no memory windows) the region is bound
// by an ibv_reg_mr of exactly the call's bytes inside the already
// registered slab, under a new key, and invalidated by ibv_dereg_mr
// (per-call registration, the default: windows only with RDMAFS_IBVERBS_WINDOWS set, since rxe does not bound accesses by the window). Either
// way the peer can never reach bytes outside the call, nor after its
// Invalidate. Remote invalidation (Send With Invalidate) of a per-call
// registration works on iWARP devices (siw invalidates any STag of the
// protection domain, though its userspace library, rdma-core 44, does not
// report the invalidation in the receive completion, so the transport
// invalidates locally as well); InfiniBand and RoCE devices refuse it for
// ibv_reg_mr regions, so RemoteInvalidate reports false there and the
// transport must not offer it.
//
// siw carries out a Send With Invalidate before software sees it, on any
// STag of the protection domain whose index matches, offered or not: a
// hostile peer can kill a slab chunk's key, which no offer can prevent.
// The provider detects it (the reported invalidated STag is not an
// exposure of ours, or, where rdma-core does not report it, a work request
// fails with a local protection error), breaks that connection and
// registers the slab chunks again under new keys, so the memory works for
// the connections that follow.
package ibverbs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/rdmafs/rdmafs/verbs"
)

// Errors of device selection and connection setup; test with errors.Is.
var (
	// ErrUnsupported: the binary was built without cgo or rdma-core.
	ErrUnsupported = errors.New("ibverbs: built without the rdma-core provider (cgo)")
	// ErrNoDevice: no RDMA device, or not the one asked for.
	ErrNoDevice = errors.New("ibverbs: no RDMA device")
	// ErrNoActivePort: the device has no port in the ACTIVE state.
	ErrNoActivePort = errors.New("ibverbs: no active port")
	// ErrUnreachable: the address could not be resolved to a route
	// through the device, or the peer did not answer.
	ErrUnreachable = errors.New("ibverbs: peer unreachable")
	// ErrWrongDevice: the route to the peer leaves through another
	// RDMA device than the provider's.
	ErrWrongDevice = errors.New("ibverbs: route uses another RDMA device")
	// ErrNotSlab: memory that is not whole pages (not the transport's
	// slab) was to be registered.
	ErrNotSlab = errors.New("ibverbs: only page-aligned slab memory may be registered")
)

// SysfsRoot is where the kernel lists RDMA devices.
const SysfsRoot = "/sys/class/infiniband"

// DeviceInfo describes an RDMA device as sysfs shows it.
type DeviceInfo struct {
	Name     string
	NodeType string // "CA" (InfiniBand/RoCE), "RNIC" (iWARP), ...
	Ports    []PortInfo
}

// PortInfo is one port of a device.
type PortInfo struct {
	Num       int
	State     string // "ACTIVE", "DOWN", ...
	LinkLayer string // "InfiniBand", "Ethernet"
}

// ActivePort returns the first port in the ACTIVE state, or 0.
func (d DeviceInfo) ActivePort() int {
	for _, p := range d.Ports {
		if p.State == "ACTIVE" {
			return p.Num
		}
	}
	return 0
}

// IWARP reports whether the device is an iWARP RNIC (siw, cxgb4, irdma in
// iWARP mode).
func (d DeviceInfo) IWARP() bool { return d.NodeType == "RNIC" }

// Kind names the device's transport: "iWARP", "RoCE" or "InfiniBand".
func (d DeviceInfo) Kind() string {
	if d.IWARP() {
		return "iWARP"
	}
	for _, p := range d.Ports {
		if p.LinkLayer == "Ethernet" {
			return "RoCE"
		}
	}
	return "InfiniBand"
}

// Devices lists the RDMA devices under root (SysfsRoot), sorted by name.
// A missing root means no devices.
func Devices(root string) ([]DeviceInfo, error) {
	ents, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ibverbs: list devices: %w", err)
	}
	var out []DeviceInfo
	for _, e := range ents {
		d := DeviceInfo{Name: e.Name(), NodeType: sysfsValue(filepath.Join(root, e.Name(), "node_type"))}
		ports, _ := os.ReadDir(filepath.Join(root, e.Name(), "ports"))
		for _, p := range ports {
			n, err := strconv.Atoi(p.Name())
			if err != nil {
				continue
			}
			dir := filepath.Join(root, e.Name(), "ports", p.Name())
			d.Ports = append(d.Ports, PortInfo{Num: n, State: sysfsValue(filepath.Join(dir, "state")),
				LinkLayer: sysfsValue(filepath.Join(dir, "link_layer"))})
		}
		sort.Slice(d.Ports, func(i, j int) bool { return d.Ports[i].Num < d.Ports[j].Num })
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// sysfsValue reads a sysfs attribute like "4: ACTIVE" or "1: CA" and
// returns the part after the colon ("ACTIVE"), or the whole trimmed value.
func sysfsValue(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	s := strings.TrimSpace(string(b))
	if i := strings.IndexByte(s, ':'); i >= 0 {
		s = strings.TrimSpace(s[i+1:])
	}
	return s
}

// Available reports whether root lists at least one RDMA device: the
// rule by which a proto=rdma mount picks this provider.
func Available(root string) bool {
	ents, err := os.ReadDir(root)
	return err == nil && len(ents) > 0
}

// ChooseDevice picks the device named name (any device with an active
// port if name is empty) among devs and returns it with its active port.
func ChooseDevice(devs []DeviceInfo, name string) (DeviceInfo, int, error) {
	if len(devs) == 0 {
		return DeviceInfo{}, 0, fmt.Errorf("%w (%s is empty)", ErrNoDevice, SysfsRoot)
	}
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
	}
	if name != "" {
		for _, d := range devs {
			if d.Name == name {
				if p := d.ActivePort(); p > 0 {
					return d, p, nil
				}
				return d, 0, fmt.Errorf("%w on %s (ports: %s)", ErrNoActivePort, d.Name, portStates(d))
			}
		}
		return DeviceInfo{}, 0, fmt.Errorf("%w named %q (have %s)", ErrNoDevice, name, strings.Join(names, ", "))
	}
	for _, d := range devs {
		if p := d.ActivePort(); p > 0 {
			return d, p, nil
		}
	}
	return DeviceInfo{}, 0, fmt.Errorf("%w on any RDMA device (%s)", ErrNoActivePort, strings.Join(names, ", "))
}

func portStates(d DeviceInfo) string {
	var s []string
	for _, p := range d.Ports {
		s = append(s, fmt.Sprintf("%d %s", p.Num, p.State))
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// Work completion statuses of libibverbs (enum ibv_wc_status); the cgo
// file checks at compile time that they match the header.
const (
	wcSuccess        = 0
	wcLocLenErr      = 1
	wcLocQPOpErr     = 2
	wcLocProtErr     = 4
	wcWRFlushErr     = 5
	wcMWBindErr      = 6
	wcBadRespErr     = 7
	wcLocAccessErr   = 8
	wcRemInvReqErr   = 9
	wcRemAccessErr   = 10
	wcRemOpErr       = 11
	wcRetryExcErr    = 12
	wcRNRRetryExcErr = 13
	wcRemAbortErr    = 16
	wcFatalErr       = 19
	wcRespTimeoutErr = 20
	wcGeneralErr     = 21
)

// mapStatus turns an ibv_wc_status into the API's status.
func mapStatus(s int) verbs.Status {
	switch s {
	case wcSuccess:
		return verbs.StatusSuccess
	case wcWRFlushErr:
		return verbs.StatusFlushed
	case wcLocLenErr:
		return verbs.StatusLocalLengthErr
	case wcLocProtErr, wcLocAccessErr, wcMWBindErr:
		return verbs.StatusLocalProtectionErr
	case wcRemAccessErr:
		return verbs.StatusRemoteAccessErr
	case wcRemOpErr, wcRemInvReqErr, wcRemAbortErr, wcLocQPOpErr:
		return verbs.StatusRemoteOpErr
	default: // retry exceeded, bad response, fatal, timeouts
		return verbs.StatusFatalErr
	}
}

// statusError is the reason a queue pair broke on an error completion.
func statusError(s int, op verbs.Opcode) error {
	switch mapStatus(s) {
	case verbs.StatusSuccess, verbs.StatusFlushed:
		return nil
	case verbs.StatusFatalErr:
		return fmt.Errorf("%w: %v completed with ibv_wc_status %d (%s)", verbs.ErrConnectionLost, op, s, wcStatusName(s))
	default:
		return fmt.Errorf("%w: %v completed with ibv_wc_status %d (%s)", verbs.ErrTerminated, op, s, wcStatusName(s))
	}
}

func wcStatusName(s int) string {
	switch s {
	case wcLocLenErr:
		return "local length error"
	case wcLocQPOpErr:
		return "local QP operation error"
	case wcLocProtErr:
		return "local protection error"
	case wcWRFlushErr:
		return "flushed"
	case wcLocAccessErr:
		return "local access error"
	case wcRemInvReqErr:
		return "remote invalid request"
	case wcRemAccessErr:
		return "remote access error"
	case wcRemOpErr:
		return "remote operation error"
	case wcRetryExcErr:
		return "transport retry counter exceeded"
	case wcRNRRetryExcErr:
		return "RNR retry counter exceeded"
	case wcBadRespErr:
		return "bad response"
	case wcFatalErr:
		return "fatal error"
	case wcRespTimeoutErr:
		return "response timeout"
	case wcGeneralErr:
		return "general error"
	}
	return "status " + strconv.Itoa(s)
}

// RDMA-CM event types (enum rdma_cm_event_type), checked by the cgo file.
const (
	cmAddrResolved   = 0
	cmAddrError      = 1
	cmRouteResolved  = 2
	cmRouteError     = 3
	cmConnectRequest = 4
	cmConnectResp    = 5
	cmConnectError   = 6
	cmUnreachable    = 7
	cmRejected       = 8
	cmEstablished    = 9
	cmDisconnected   = 10
	cmDeviceRemoval  = 11
	cmAddrChange     = 14
	cmTimewaitExit   = 15
)

var cmNames = map[int]string{
	cmAddrResolved: "ADDR_RESOLVED", cmAddrError: "ADDR_ERROR", cmRouteResolved: "ROUTE_RESOLVED",
	cmRouteError: "ROUTE_ERROR", cmConnectRequest: "CONNECT_REQUEST", cmConnectResp: "CONNECT_RESPONSE",
	cmConnectError: "CONNECT_ERROR", cmUnreachable: "UNREACHABLE", cmRejected: "REJECTED",
	cmEstablished: "ESTABLISHED", cmDisconnected: "DISCONNECTED", cmDeviceRemoval: "DEVICE_REMOVAL",
	cmAddrChange: "ADDR_CHANGE", cmTimewaitExit: "TIMEWAIT_EXIT",
}

func cmName(ev int) string {
	if n, ok := cmNames[ev]; ok {
		return n
	}
	return "event " + strconv.Itoa(ev)
}

// cmError maps an RDMA-CM event that ended connection setup (while
// waiting for want) to the API's errors. status is the event's status
// (a negative errno, or a reject reason for REJECTED).
func cmError(ev, status, want int) error {
	switch ev {
	case want:
		return nil
	case cmRejected:
		// RoCE/IB with no listener: reject reason 8 (invalid service ID);
		// iWARP: ECONNREFUSED (111) or ECONNRESET.
		if status == 8 || status == -111 || status == 111 {
			return fmt.Errorf("%w: connection refused (no RPC-over-RDMA listener)", ErrUnreachable)
		}
		return fmt.Errorf("%w (status %d)", verbs.ErrRejected, status)
	case cmAddrError, cmRouteError, cmUnreachable:
		return fmt.Errorf("%w: %s (status %d)", ErrUnreachable, cmName(ev), status)
	case cmConnectError:
		return fmt.Errorf("%w: %s (status %d)", verbs.ErrConnectionLost, cmName(ev), status)
	case cmDisconnected, cmDeviceRemoval:
		return fmt.Errorf("%w: %s", verbs.ErrConnectionLost, cmName(ev))
	}
	return fmt.Errorf("%w: unexpected RDMA-CM event %s (status %d) while waiting for %s",
		verbs.ErrConnectionLost, cmName(ev), status, cmName(want))
}

// checkSend validates a send work request against the queue pair's
// scatter/gather limits (maxRead for an RDMA Read's sink); errors wrap
// verbs.ErrInvalidWR.
func checkSend(wr *verbs.SendWR, maxSGE, maxRead int) error {
	switch wr.Opcode {
	case verbs.OpSend, verbs.OpSendWithInvalidate, verbs.OpRDMAWrite:
	case verbs.OpRDMARead:
		if uint64(wr.Length) != verbs.SGLLen(wr.SGL) {
			return fmt.Errorf("%w: RDMA Read of %d bytes into %d-byte sink", verbs.ErrInvalidWR, wr.Length, verbs.SGLLen(wr.SGL))
		}
		if len(wr.SGL) == 0 {
			return fmt.Errorf("%w: RDMA Read without a sink", verbs.ErrInvalidWR)
		}
		if len(wr.SGL) > maxRead {
			return fmt.Errorf("%w: RDMA Read into %d SGEs, the device takes %d", verbs.ErrInvalidWR, len(wr.SGL), maxRead)
		}
	default:
		return fmt.Errorf("%w: opcode %v on the send queue", verbs.ErrInvalidWR, wr.Opcode)
	}
	if len(wr.SGL) > maxSGE {
		return fmt.Errorf("%w: %d SGEs, the device takes %d", verbs.ErrInvalidWR, len(wr.SGL), maxSGE)
	}
	for _, s := range wr.SGL {
		if s.MR == nil {
			return fmt.Errorf("%w: SGE without a memory region", verbs.ErrInvalidWR)
		}
	}
	return nil
}

// checkRecv validates a receive work request.
func checkRecv(wr *verbs.RecvWR, maxSGE int) error {
	if len(wr.SGL) > maxSGE {
		return fmt.Errorf("%w: %d SGEs, the device takes %d", verbs.ErrInvalidWR, len(wr.SGL), maxSGE)
	}
	for _, s := range wr.SGL {
		if s.MR == nil {
			return fmt.Errorf("%w: SGE without a memory region", verbs.ErrInvalidWR)
		}
	}
	return nil
}

// checkSlab accepts only whole pages at a page-aligned address: the
// transport's mmap slab, never a Go heap slice of arbitrary size.
func checkSlab(addr uintptr, n int) error {
	pg := uintptr(os.Getpagesize())
	if n <= 0 || addr%pg != 0 || uintptr(n)%pg != 0 {
		return fmt.Errorf("%w (%d bytes at %#x)", ErrNotSlab, n, addr)
	}
	return nil
}

// sgeRange checks that [off, off+n) lies in a region of size bytes.
func sgeRange(off uint64, n uint32, size uint64) error {
	if off > size || uint64(n) > size-off {
		return fmt.Errorf("[%d, +%d) outside %d bytes: %w", off, n, size, verbs.ErrBounds)
	}
	return nil
}
