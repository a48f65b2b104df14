//go:build cgo && linux && !noibverbs

package ibverbs

/*
#cgo LDFLAGS: -libverbs -lrdmacm
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

static int set_nonblock(int fd) {
	int f = fcntl(fd, F_GETFL);
	if (f < 0) return -errno;
	return fcntl(fd, F_SETFL, f | O_NONBLOCK) < 0 ? -errno : 0;
}

static int query_port_state(struct ibv_context *ctx, int port) {
	struct ibv_port_attr a;
	if (ibv_query_port(ctx, port, &a)) return -errno;
	return a.state;
}

static struct ibv_mr *reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int access) {
	return ibv_reg_mr(pd, (void *)addr, len, access);
}

// A flattened work completion: no unions for Go to pick apart.
struct flat_wc {
	uint64_t wr_id;
	int status;
	int opcode;
	uint32_t byte_len;
	uint32_t inv_rkey;
	int with_inv;
};

static int poll_flat(struct ibv_cq *cq, int n, struct flat_wc *out) {
	struct ibv_wc wc[32];
	if (n > 32) n = 32;
	int k = ibv_poll_cq(cq, n, wc);
	for (int i = 0; i < k; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].opcode = wc[i].opcode;
		out[i].byte_len = wc[i].byte_len;
		out[i].with_inv = (wc[i].wc_flags & IBV_WC_WITH_INV) != 0;
		out[i].inv_rkey = out[i].with_inv ? wc[i].invalidated_rkey : 0;
	}
	return k;
}

static int arm_cq(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }

// take_cq_event consumes one completion event (the channel is
// non-blocking) and acknowledges it: 1 if one was there, 0 if none.
static int take_cq_event(struct ibv_comp_channel *cc) {
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(cc, &cq, &ctx)) return errno == EAGAIN ? 0 : -errno;
	ibv_ack_cq_events(cq, 1);
	return 1;
}

static int post_send(struct ibv_qp *qp, uint64_t wrid, int opcode, int flags, struct ibv_sge *sge, int nsge,
		uint32_t inv_rkey, uint64_t raddr, uint32_t rkey) {
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = wrid;
	wr.opcode = opcode;
	wr.send_flags = flags;
	wr.sg_list = nsge ? sge : NULL;
	wr.num_sge = nsge;
	if (opcode == IBV_WR_SEND_WITH_INV) wr.invalidate_rkey = inv_rkey;
	if (opcode == IBV_WR_RDMA_WRITE || opcode == IBV_WR_RDMA_READ) {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	return ibv_post_send(qp, &wr, &bad);
}

static int post_recv(struct ibv_qp *qp, uint64_t wrid, struct ibv_sge *sge, int nsge) {
	struct ibv_recv_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = wrid;
	wr.sg_list = nsge ? sge : NULL;
	wr.num_sge = nsge;
	return ibv_post_recv(qp, &wr, &bad);
}

static int qp_to_error(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_ERR;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

// A flattened RDMA-CM event, acknowledged before it is returned.
struct flat_ev {
	int event;
	int status;
	struct rdma_cm_id *id;
	uint8_t pdata[256];
	int pdata_len;
	int responder_resources;
	int initiator_depth;
};

static int get_event(struct rdma_event_channel *ch, struct flat_ev *out) {
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev)) return -errno;
	memset(out, 0, sizeof *out);
	out->event = ev->event;
	out->status = ev->status;
	out->id = ev->id;
	switch (ev->event) {
	case RDMA_CM_EVENT_CONNECT_REQUEST:
	case RDMA_CM_EVENT_CONNECT_RESPONSE:
	case RDMA_CM_EVENT_ESTABLISHED:
	case RDMA_CM_EVENT_REJECTED:
		if (ev->param.conn.private_data && ev->param.conn.private_data_len) {
			int n = ev->param.conn.private_data_len;
			if (n > (int)sizeof out->pdata) n = sizeof out->pdata;
			memcpy(out->pdata, ev->param.conn.private_data, n);
			out->pdata_len = n;
		}
		out->responder_resources = ev->param.conn.responder_resources;
		out->initiator_depth = ev->param.conn.initiator_depth;
		break;
	default:
		break;
	}
	rdma_ack_cm_event(ev);
	return 0;
}

static int make_sockaddr(struct sockaddr_storage *ss, const uint8_t *ip, int iplen, int port) {
	memset(ss, 0, sizeof *ss);
	if (iplen == 4) {
		struct sockaddr_in *s = (struct sockaddr_in *)ss;
		s->sin_family = AF_INET;
		s->sin_port = htons(port);
		memcpy(&s->sin_addr, ip, 4);
		return 0;
	}
	if (iplen == 16) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)ss;
		s->sin6_family = AF_INET6;
		s->sin6_port = htons(port);
		memcpy(&s->sin6_addr, ip, 16);
		return 0;
	}
	return -EINVAL;
}

static int resolve_addr(struct rdma_cm_id *id, const uint8_t *ip, int iplen, int port, int ms) {
	struct sockaddr_storage ss;
	if (make_sockaddr(&ss, ip, iplen, port)) return -EINVAL;
	return rdma_resolve_addr(id, NULL, (struct sockaddr *)&ss, ms) ? -errno : 0;
}

static int bind_addr(struct rdma_cm_id *id, const uint8_t *ip, int iplen, int port) {
	struct sockaddr_storage ss;
	if (make_sockaddr(&ss, ip, iplen, port)) return -EINVAL;
	return rdma_bind_addr(id, (struct sockaddr *)&ss) ? -errno : 0;
}

// sockaddr_ip copies the address of sa to ip (16 bytes) and returns its
// length (4 or 16), the port in *port; 0 if unknown.
static int sockaddr_ip(struct sockaddr *sa, uint8_t *ip, int *port) {
	if (!sa) return 0;
	if (sa->sa_family == AF_INET) {
		struct sockaddr_in *s = (struct sockaddr_in *)sa;
		memcpy(ip, &s->sin_addr, 4);
		*port = ntohs(s->sin_port);
		return 4;
	}
	if (sa->sa_family == AF_INET6) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)sa;
		memcpy(ip, &s->sin6_addr, 16);
		*port = ntohs(s->sin6_port);
		return 16;
	}
	return 0;
}

static int id_addr(struct rdma_cm_id *id, int peer, uint8_t *ip, int *port) {
	return sockaddr_ip(peer ? rdma_get_peer_addr(id) : rdma_get_local_addr(id), ip, port);
}

static struct ibv_context *id_verbs(struct rdma_cm_id *id) { return id->verbs; }
static struct ibv_qp *id_qp(struct rdma_cm_id *id) { return id->qp; }

static int create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_cq *cq, int swr, int rwr, int sge) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = swr;
	a.cap.max_recv_wr = rwr;
	a.cap.max_send_sge = sge;
	a.cap.max_recv_sge = sge;
	return rdma_create_qp(id, pd, &a) ? -errno : 0;
}

static int do_connect(struct rdma_cm_id *id, const void *pd, int pdlen, int rr, int id_) {
	struct rdma_conn_param p;
	memset(&p, 0, sizeof p);
	p.private_data = pd;
	p.private_data_len = pdlen;
	p.responder_resources = rr;
	p.initiator_depth = id_;
	p.retry_count = 7;
	p.rnr_retry_count = 7;
	return rdma_connect(id, &p) ? -errno : 0;
}

static int do_accept(struct rdma_cm_id *id, const void *pd, int pdlen, int rr, int id_) {
	struct rdma_conn_param p;
	memset(&p, 0, sizeof p);
	p.private_data = pd;
	p.private_data_len = pdlen;
	p.responder_resources = rr;
	p.initiator_depth = id_;
	p.retry_count = 7;
	p.rnr_retry_count = 7;
	return rdma_accept(id, &p) ? -errno : 0;
}

static const char *dev_name(struct ibv_context *c) { return ibv_get_device_name(c->device); }
static int errno_of(void) { return errno; }
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
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
	maxWR  int
	maxCQE int
	maxRD  int // max_qp_rd_atom (IRD)
	maxIRD int // max_qp_init_rd_atom (ORD)
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
	p.maxWR = min(queueDepth, int(attr.max_qp_wr))
	p.maxCQE = int(attr.max_cqe)
	p.maxRD = int(attr.max_qp_rd_atom)
	p.maxIRD = int(attr.max_qp_init_rd_atom)
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

// Device returns the device in use.
func (p *Provider) Device() DeviceInfo { return p.info }

// Port returns the active port in use.
func (p *Provider) Port() int { return p.port }

// RemoteInvalidate reports whether the peer may invalidate our exposed
// regions with Send With Invalidate (iWARP devices only; see the package
// documentation).
func (p *Provider) RemoteInvalidate() bool { return p.info.IWARP() }

// String describes the provider for traces and statistics.
func (p *Provider) String() string {
	return fmt.Sprintf("ibverbs %s port %d (%s)", p.info.Name, p.port, p.info.Kind())
}

// NewProtectionDomain returns a protection domain whose registrations are
// made on the device.
func (p *Provider) NewProtectionDomain() *verbs.ProtectionDomain {
	return verbs.NewProtectionDomainWithHook(&hook{p: p, regs: make(map[*verbs.MemoryRegion]*hwMR)})
}

// hwMR is a device registration backing a verbs.MemoryRegion.
type hwMR struct {
	mr         *C.struct_ibv_mr
	addr       uintptr
	size       uint64
	lkey, rkey uint32
}

// hook mirrors a ProtectionDomain's registrations on the device. Its
// methods run with the domain's lock held; mu guards regs for PostSend.
type hook struct {
	p    *Provider
	mu   sync.Mutex
	regs map[*verbs.MemoryRegion]*hwMR
}

var (
	_ verbs.RegistrationHook = (*hook)(nil)
	_ verbs.RemoteAddresser  = (*hook)(nil)
)

func ibvAccess(a verbs.Access) C.int {
	var f C.int
	if a&verbs.AccessLocalWrite != 0 {
		f |= C.IBV_ACCESS_LOCAL_WRITE
	}
	if a&verbs.AccessRemoteRead != 0 {
		f |= C.IBV_ACCESS_REMOTE_READ
	}
	if a&verbs.AccessRemoteWrite != 0 {
		// Remote write requires local write (IB spec).
		f |= C.IBV_ACCESS_REMOTE_WRITE | C.IBV_ACCESS_LOCAL_WRITE
	}
	return f
}

// reg registers mr's current memory and returns its STag (rkey if the
// region grants remote access, else lkey).
func (h *hook) reg(mr *verbs.MemoryRegion) (uint32, error) {
	buf, access := mr.HookBytes(), mr.HookAccess()
	if len(buf) == 0 {
		return 0, fmt.Errorf("%w: empty region", verbs.ErrInvalidWR)
	}
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	if !mr.IsFast() {
		if err := checkSlab(addr, len(buf)); err != nil {
			return 0, err
		}
	}
	// A fast region is bound inside a registered slab chunk (checked by
	// verbs.FastRegister), so it too names only slab memory.
	m := C.reg_mr(h.p.pd, C.uintptr_t(addr), C.size_t(len(buf)), ibvAccess(access))
	if m == nil {
		errno := syscall.Errno(C.errno_of())
		if errno == syscall.ENOMEM {
			return 0, fmt.Errorf("ibverbs: ibv_reg_mr %d bytes: %w (locked-memory limit: raise ulimit -l or lower rdmamem)", len(buf), errno)
		}
		return 0, fmt.Errorf("ibverbs: ibv_reg_mr %d bytes: %w", len(buf), errno)
	}
	r := &hwMR{mr: m, addr: addr, size: uint64(len(buf)), lkey: uint32(m.lkey), rkey: uint32(m.rkey)}
	h.mu.Lock()
	h.regs[mr] = r
	h.mu.Unlock()
	if access.Remote() {
		return r.rkey, nil
	}
	return r.lkey, nil
}

// dereg drops mr's device registration, if any.
func (h *hook) dereg(mr *verbs.MemoryRegion) error {
	h.mu.Lock()
	r := h.regs[mr]
	delete(h.regs, mr)
	h.mu.Unlock()
	if r == nil {
		return nil
	}
	if rc := C.ibv_dereg_mr(r.mr); rc != 0 {
		return fmt.Errorf("ibverbs: ibv_dereg_mr: %w", syscall.Errno(rc))
	}
	return nil
}

// Register registers a region of memory; a fast-registration region gets
// its key when it is bound (Reregister).
func (h *hook) Register(mr *verbs.MemoryRegion) (uint32, error) {
	if mr.IsFast() {
		return 0, nil
	}
	return h.reg(mr)
}

// Reregister binds the region (again) under a new key.
func (h *hook) Reregister(mr *verbs.MemoryRegion) (uint32, error) {
	if err := h.dereg(mr); err != nil {
		return 0, err
	}
	return h.reg(mr)
}

// Invalidate ends the region's key: deregistering is the invalidation.
func (h *hook) Invalidate(mr *verbs.MemoryRegion) error { return h.dereg(mr) }

// Deregister releases the region.
func (h *hook) Deregister(mr *verbs.MemoryRegion) error { return h.dereg(mr) }

// RemoteAddr is the virtual address the device names the region's first
// byte by.
func (h *hook) RemoteAddr(mr *verbs.MemoryRegion) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r := h.regs[mr]; r != nil {
		return uint64(r.addr)
	}
	return 0
}

// sges converts a scatter/gather list to device SGEs.
func (h *hook) sges(sgl []verbs.SGE, out []C.struct_ibv_sge) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, s := range sgl {
		r := h.regs[s.MR]
		if r == nil || s.MR.IsFast() {
			return fmt.Errorf("SGE %d: not registered memory of this domain: %w", i, verbs.ErrInvalidSTag)
		}
		if err := sgeRange(s.Offset, s.Length, r.size); err != nil {
			return fmt.Errorf("SGE %d: %w", i, err)
		}
		out[i] = C.struct_ibv_sge{addr: C.uint64_t(uint64(r.addr) + s.Offset), length: C.uint32_t(s.Length), lkey: C.uint32_t(r.lkey)}
	}
	return nil
}

// wrInfo is what a device work request ID stands for.
type wrInfo struct {
	wrid uint64
	op   verbs.Opcode
	recv bool
	n    uint32
}

// queuePair is an RC queue pair connected with RDMA-CM.
type queuePair struct {
	p      *Provider
	pd     *verbs.ProtectionDomain
	h      *hook
	ch     *C.struct_rdma_event_channel
	id     *C.struct_rdma_cm_id
	qp     *C.struct_ibv_qp
	cc     *C.struct_ibv_comp_channel
	cq     *C.struct_ibv_cq
	sendCQ *verbs.SoftCQ
	recvCQ *verbs.SoftCQ
	maxSGE int

	peerPD   []byte
	ird, ord int
	local    net.Addr
	remote   net.Addr

	mu      sync.Mutex
	wrs     map[uint64]wrInfo
	nextID  uint64
	err     error
	closing bool
	done    chan struct{}

	stop      chan struct{} // closed by Close: the event loops end
	wg        sync.WaitGroup
	closeOnce sync.Once
}

var _ verbs.QueuePair = (*queuePair)(nil)

// newQP makes the completion channel, completion queue and queue pair of
// id, which must be bound to the provider's device.
func (p *Provider) newQP(ch *C.struct_rdma_event_channel, id *C.struct_rdma_cm_id, params *verbs.ConnParams) (*queuePair, error) {
	if v := C.id_verbs(id); v != p.ctx {
		name := "none"
		if v != nil {
			name = C.GoString(C.dev_name(v))
		}
		return nil, fmt.Errorf("%w: %s, not %s", ErrWrongDevice, name, p.info.Name)
	}
	pd := params.PD
	if pd == nil {
		pd = p.NewProtectionDomain()
	}
	h, ok := verbs.HookOf(pd).(*hook)
	if !ok || h.p != p {
		return nil, fmt.Errorf("%w: protection domain not made by this provider's NewProtectionDomain", verbs.ErrInvalidWR)
	}
	q := &queuePair{p: p, pd: pd, h: h, ch: ch, id: id, maxSGE: p.maxSGE,
		wrs: make(map[uint64]wrInfo), done: make(chan struct{}), stop: make(chan struct{})}
	var err error
	if q.sendCQ, err = softCQ(params.SendCQ); err != nil {
		return nil, err
	}
	if q.recvCQ, err = softCQ(params.RecvCQ); err != nil {
		return nil, err
	}
	q.cc = C.ibv_create_comp_channel(p.ctx)
	if q.cc == nil {
		return nil, fmt.Errorf("ibverbs: ibv_create_comp_channel: %w", syscall.Errno(C.errno_of()))
	}
	if rc := C.set_nonblock(q.cc.fd); rc != 0 {
		q.destroy()
		return nil, fmt.Errorf("ibverbs: completion channel: %w", syscall.Errno(-rc))
	}
	cqe := 2 * p.maxWR
	if p.maxCQE > 0 {
		cqe = min(cqe, p.maxCQE)
	}
	q.cq = C.ibv_create_cq(p.ctx, C.int(cqe), nil, q.cc, 0)
	if q.cq == nil {
		err := syscall.Errno(C.errno_of())
		q.destroy()
		return nil, fmt.Errorf("ibverbs: ibv_create_cq(%d): %w", cqe, err)
	}
	if rc := C.create_qp(id, p.pd, q.cq, C.int(p.maxWR), C.int(p.maxWR), C.int(p.maxSGE)); rc != 0 {
		q.destroy()
		return nil, fmt.Errorf("ibverbs: rdma_create_qp: %w", syscall.Errno(-rc))
	}
	q.qp = C.id_qp(id)
	q.wg.Add(1)
	go q.pollLoop()
	return q, nil
}

func softCQ(cq verbs.CompletionQueue) (*verbs.SoftCQ, error) {
	if cq == nil {
		return verbs.NewSoftCQ(), nil
	}
	s, ok := cq.(*verbs.SoftCQ)
	if !ok {
		return nil, fmt.Errorf("%w: completion queue %T is not a *verbs.SoftCQ", verbs.ErrInvalidWR, cq)
	}
	return s, nil
}

// PostSend queues a send work request.
func (q *queuePair) PostSend(wr verbs.SendWR) error {
	if err := checkSend(&wr, q.maxSGE); err != nil {
		return err
	}
	var sge [verbs.MaxSGE]C.struct_ibv_sge
	if err := q.h.sges(wr.SGL, sge[:]); err != nil {
		return fmt.Errorf("ibverbs: post send: %w", err)
	}
	var op C.int
	switch wr.Opcode {
	case verbs.OpSend:
		op = C.IBV_WR_SEND
	case verbs.OpSendWithInvalidate:
		op = C.IBV_WR_SEND_WITH_INV
	case verbs.OpRDMAWrite:
		op = C.IBV_WR_RDMA_WRITE
	case verbs.OpRDMARead:
		op = C.IBV_WR_RDMA_READ
	}
	flags := C.int(C.IBV_SEND_SIGNALED)
	if wr.Solicited && (wr.Opcode == verbs.OpSend || wr.Opcode == verbs.OpSendWithInvalidate) {
		flags |= C.IBV_SEND_SOLICITED
	}
	n := uint32(verbs.SGLLen(wr.SGL))
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil {
		q.sendCQ.Push(verbs.Completion{WRID: wr.WRID, Status: verbs.StatusFlushed, Opcode: wr.Opcode})
		return nil
	}
	q.nextID++
	id := q.nextID
	rc := C.post_send(q.qp, C.uint64_t(id), op, flags, &sge[0], C.int(len(wr.SGL)),
		C.uint32_t(wr.InvalidateSTag), C.uint64_t(wr.RemoteOffset), C.uint32_t(wr.RemoteSTag))
	if rc != 0 {
		return fmt.Errorf("%w: ibv_post_send: %w", verbs.ErrInvalidWR, syscall.Errno(rc))
	}
	q.wrs[id] = wrInfo{wrid: wr.WRID, op: wr.Opcode, n: n}
	return nil
}

// PostRecv posts a receive buffer.
func (q *queuePair) PostRecv(wr verbs.RecvWR) error {
	if err := checkRecv(&wr, q.maxSGE); err != nil {
		return err
	}
	var sge [verbs.MaxSGE]C.struct_ibv_sge
	if err := q.h.sges(wr.SGL, sge[:]); err != nil {
		return fmt.Errorf("ibverbs: post receive: %w", err)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil {
		q.recvCQ.Push(verbs.Completion{WRID: wr.WRID, Status: verbs.StatusFlushed, Opcode: verbs.OpRecv})
		return nil
	}
	q.nextID++
	id := q.nextID
	if rc := C.post_recv(q.qp, C.uint64_t(id), &sge[0], C.int(len(wr.SGL))); rc != 0 {
		return fmt.Errorf("%w: ibv_post_recv: %w", verbs.ErrInvalidWR, syscall.Errno(rc))
	}
	q.wrs[id] = wrInfo{wrid: wr.WRID, op: verbs.OpRecv, recv: true}
	return nil
}

// pollLoop moves device completions to the soft queues; it arms the
// completion queue and sleeps on the completion channel when idle, and
// ends once the queue pair is closing and every work request completed.
func (q *queuePair) pollLoop() {
	defer q.wg.Done()
	var wcs [32]C.struct_flat_wc
	fd := int32(q.cc.fd)
	var closingSince time.Time
	armed := false
	for {
		k := int(C.poll_flat(q.cq, 32, &wcs[0]))
		if k < 0 {
			q.fail(fmt.Errorf("%w: ibv_poll_cq failed", verbs.ErrConnectionLost))
			k = 0
		}
		for i := range k {
			q.deliver(&wcs[i])
		}
		if k > 0 {
			armed = false
			continue
		}
		q.mu.Lock()
		closing, left := q.closing, len(q.wrs)
		q.mu.Unlock()
		if closing {
			if left == 0 {
				return
			}
			if closingSince.IsZero() {
				closingSince = time.Now()
			} else if time.Since(closingSince) > drainWait {
				q.flushAll()
				return
			}
		}
		if !armed {
			C.arm_cq(q.cq)
			armed = true
			continue // poll once more: a completion may have come before arming
		}
		pfd := []unix.PollFd{{Fd: fd, Events: unix.POLLIN}}
		if n, _ := unix.Poll(pfd, int(pollEvery/time.Millisecond)); n > 0 {
			if C.take_cq_event(q.cc) > 0 {
				armed = false
			}
		}
	}
}

// deliver turns one device completion into an API completion.
func (q *queuePair) deliver(w *C.struct_flat_wc) {
	q.mu.Lock()
	info, ok := q.wrs[uint64(w.wr_id)]
	delete(q.wrs, uint64(w.wr_id))
	q.mu.Unlock()
	if !ok {
		return
	}
	st := int(w.status)
	c := verbs.Completion{WRID: info.wrid, Status: mapStatus(st), Opcode: info.op}
	if info.recv {
		c.ByteLen = uint32(w.byte_len)
		if w.with_inv != 0 && c.Status == verbs.StatusSuccess {
			c.Opcode = verbs.OpRecvWithInvalidate
			c.InvalidatedSTag = uint32(w.inv_rkey)
			// The device invalidated the key; the domain must agree
			// that it was a remotely accessible region of ours.
			if err := q.pd.InvalidateRemote(c.InvalidatedSTag); err != nil {
				q.fail(fmt.Errorf("%w: peer invalidated an STag we did not expose: %w", verbs.ErrTerminated, err))
			}
		}
	} else if c.Status == verbs.StatusSuccess {
		c.ByteLen = info.n
	}
	if err := statusError(st, info.op); err != nil {
		q.fail(err)
	}
	if info.recv {
		q.recvCQ.Push(c)
	} else {
		q.sendCQ.Push(c)
	}
}

// flushAll completes every outstanding work request as flushed (the
// device did not within drainWait).
func (q *queuePair) flushAll() {
	q.mu.Lock()
	wrs := q.wrs
	q.wrs = make(map[uint64]wrInfo)
	q.mu.Unlock()
	for _, info := range wrs {
		c := verbs.Completion{WRID: info.wrid, Status: verbs.StatusFlushed, Opcode: info.op}
		if info.recv {
			q.recvCQ.Push(c)
		} else {
			q.sendCQ.Push(c)
		}
	}
}

// fail breaks the queue pair with err (the first reason wins): the queue
// pair moves to the error state, so the device flushes what is posted.
func (q *queuePair) fail(err error) {
	q.mu.Lock()
	if q.err != nil {
		q.mu.Unlock()
		return
	}
	q.err = err
	close(q.done)
	q.mu.Unlock()
	if q.qp != nil {
		C.qp_to_error(q.qp)
	}
}

// cmLoop watches the connection's RDMA-CM events after it is up.
func (q *queuePair) cmLoop() {
	defer q.wg.Done()
	for {
		ev, err := waitEvent(q.stop, q.ch)
		if err != nil {
			return // stopped
		}
		switch int(ev.event) {
		case cmDisconnected, cmDeviceRemoval:
			q.fail(cmError(int(ev.event), int(ev.status), -1))
		}
	}
}

// errStopped: an event wait ended because the queue pair was closed.
var errStopped = errors.New("ibverbs: stopped")

// waitEvent waits for the next RDMA-CM event on ch until stop is closed.
func waitEvent(stop <-chan struct{}, ch *C.struct_rdma_event_channel) (C.struct_flat_ev, error) {
	return waitEventCtx(context.Background(), stop, ch)
}

func waitEventCtx(ctx context.Context, stop <-chan struct{}, ch *C.struct_rdma_event_channel) (C.struct_flat_ev, error) {
	var ev C.struct_flat_ev
	for {
		rc := C.get_event(ch, &ev)
		if rc == 0 {
			return ev, nil
		}
		if syscall.Errno(-rc) != syscall.EAGAIN {
			return ev, fmt.Errorf("ibverbs: rdma_get_cm_event: %w", syscall.Errno(-rc))
		}
		select {
		case <-stop:
			return ev, errStopped
		default:
		}
		if err := ctx.Err(); err != nil {
			return ev, err
		}
		pfd := []unix.PollFd{{Fd: int32(ch.fd), Events: unix.POLLIN}}
		_, _ = unix.Poll(pfd, int(pollEvery/time.Millisecond))
	}
}

func newEventChannel() (*C.struct_rdma_event_channel, error) {
	ch := C.rdma_create_event_channel()
	if ch == nil {
		return nil, fmt.Errorf("ibverbs: rdma_create_event_channel: %w (is rdma_ucm loaded?)", syscall.Errno(C.errno_of()))
	}
	if rc := C.set_nonblock(ch.fd); rc != 0 {
		C.rdma_destroy_event_channel(ch)
		return nil, fmt.Errorf("ibverbs: event channel: %w", syscall.Errno(-rc))
	}
	return ch, nil
}

// destroy releases the device objects (after the loops ended).
func (q *queuePair) destroy() {
	if q.qp != nil {
		C.rdma_destroy_qp(q.id)
		q.qp = nil
	}
	if q.cq != nil {
		C.ibv_destroy_cq(q.cq)
		q.cq = nil
	}
	if q.cc != nil {
		C.ibv_destroy_comp_channel(q.cc)
		q.cc = nil
	}
	if q.id != nil {
		C.rdma_destroy_id(q.id)
		q.id = nil
	}
	if q.ch != nil {
		C.rdma_destroy_event_channel(q.ch)
		q.ch = nil
	}
}

// Close disconnects, waits until every outstanding work request has
// completed (flushed) and releases the device objects.
func (q *queuePair) Close() error {
	q.closeOnce.Do(func() {
		q.fail(fmt.Errorf("ibverbs: %w", verbs.ErrClosed))
		if q.id != nil {
			C.rdma_disconnect(q.id)
		}
		q.mu.Lock()
		q.closing = true
		q.mu.Unlock()
		close(q.stop)
		q.wg.Wait()
		q.destroy()
	})
	return nil
}

func (q *queuePair) SendCQ() verbs.CompletionQueue { return q.sendCQ }
func (q *queuePair) RecvCQ() verbs.CompletionQueue { return q.recvCQ }
func (q *queuePair) PD() *verbs.ProtectionDomain   { return q.pd }
func (q *queuePair) PeerPrivateData() []byte       { return q.peerPD }
func (q *queuePair) IRD() int                      { return q.ird }
func (q *queuePair) ORD() int                      { return q.ord }
func (q *queuePair) CRC() bool                     { return q.p.info.IWARP() } // siw/RNICs use MPA CRC by default; IB/RoCE have ICRC
func (q *queuePair) LocalAddr() net.Addr           { return q.local }
func (q *queuePair) RemoteAddr() net.Addr          { return q.remote }
func (q *queuePair) Done() <-chan struct{}         { return q.done }

// Err is nil while the queue pair works, then why it broke.
func (q *queuePair) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// addrs records the connection's endpoints.
func (q *queuePair) addrs() {
	q.local, q.remote = idAddr(q.id, false), idAddr(q.id, true)
}

func idAddr(id *C.struct_rdma_cm_id, peer bool) net.Addr {
	var ip [16]C.uint8_t
	var port C.int
	pi := C.int(0)
	if peer {
		pi = 1
	}
	n := int(C.id_addr(id, pi, &ip[0], &port))
	if n == 0 {
		return nil
	}
	b := make(net.IP, n)
	for i := range n {
		b[i] = byte(ip[i])
	}
	return &net.TCPAddr{IP: b, Port: int(port)}
}

func ipBytes(ip net.IP) []byte {
	if v4 := ip.To4(); v4 != nil {
		return v4
	}
	return ip.To16()
}

func depth(v, limit int) int {
	if v <= 0 {
		v = defaultRead
	}
	if limit > 0 {
		v = min(v, limit)
	}
	return min(v, 255)
}

// Dial connects to addr ("host:port") with RDMA-CM.
func (p *Provider) Dial(ctx context.Context, addr string, params *verbs.ConnParams) (verbs.QueuePair, error) {
	ta, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	if ta.IP == nil {
		ta.IP = net.IPv4(127, 0, 0, 1)
	}
	ch, err := newEventChannel()
	if err != nil {
		return nil, err
	}
	var id *C.struct_rdma_cm_id
	if rc := C.rdma_create_id(ch, &id, nil, C.RDMA_PS_TCP); rc != 0 {
		err := syscall.Errno(C.errno_of())
		C.rdma_destroy_event_channel(ch)
		return nil, fmt.Errorf("ibverbs: rdma_create_id: %w", err)
	}
	cleanup := func() {
		C.rdma_destroy_id(id)
		C.rdma_destroy_event_channel(ch)
	}
	ip := ipBytes(ta.IP)
	cip := C.CBytes(ip)
	rc := C.resolve_addr(id, (*C.uint8_t)(cip), C.int(len(ip)), C.int(ta.Port), resolveMS)
	C.free(cip)
	if rc != 0 {
		cleanup()
		return nil, fmt.Errorf("%w: rdma_resolve_addr %s: %w", ErrUnreachable, addr, syscall.Errno(-rc))
	}
	if err := expect(ctx, ch, cmAddrResolved); err != nil {
		cleanup()
		return nil, fmt.Errorf("ibverbs: resolve %s: %w", addr, err)
	}
	if rc := C.rdma_resolve_route(id, resolveMS); rc != 0 {
		err := syscall.Errno(C.errno_of())
		cleanup()
		return nil, fmt.Errorf("%w: rdma_resolve_route %s: %w", ErrUnreachable, addr, err)
	}
	if err := expect(ctx, ch, cmRouteResolved); err != nil {
		cleanup()
		return nil, fmt.Errorf("ibverbs: route to %s: %w", addr, err)
	}
	q, err := p.newQP(ch, id, params)
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("ibverbs: dial %s: %w", addr, err)
	}
	if params.Setup != nil {
		if err := params.Setup(q); err != nil {
			q.Close()
			return nil, fmt.Errorf("ibverbs: dial %s: setup: %w", addr, err)
		}
	}
	q.ird, q.ord = depth(params.IRD, p.maxRD), depth(params.ORD, p.maxIRD)
	var cpd unsafe.Pointer
	if len(params.PrivateData) > 0 {
		cpd = C.CBytes(params.PrivateData)
	}
	rc = C.do_connect(id, cpd, C.int(len(params.PrivateData)), C.int(q.ird), C.int(q.ord))
	if cpd != nil {
		C.free(cpd)
	}
	if rc != 0 {
		q.Close()
		return nil, fmt.Errorf("%w: rdma_connect %s: %w", ErrUnreachable, addr, syscall.Errno(-rc))
	}
	ev, err := waitEventCtx(ctx, nil, ch)
	if err == nil {
		err = cmError(int(ev.event), int(ev.status), cmEstablished)
	}
	if err != nil {
		q.Close()
		return nil, fmt.Errorf("ibverbs: connect %s: %w", addr, err)
	}
	q.peerPD = C.GoBytes(unsafe.Pointer(&ev.pdata[0]), ev.pdata_len)
	q.addrs()
	q.wg.Add(1)
	go q.cmLoop()
	return q, nil
}

// expect waits for event want on ch.
func expect(ctx context.Context, ch *C.struct_rdma_event_channel, want int) error {
	ev, err := waitEventCtx(ctx, nil, ch)
	if err != nil {
		return err
	}
	return cmError(int(ev.event), int(ev.status), want)
}

// listener accepts RDMA-CM connection requests.
type listener struct {
	p      *Provider
	params verbs.ConnParams
	ch     *C.struct_rdma_event_channel
	id     *C.struct_rdma_cm_id
	addr   net.Addr
	mu     sync.Mutex // one Accept at a time; guards closed
	closed bool
	stop   chan struct{}
}

// Listen listens on addr ("host:port"; host may be empty for any address
// whose route uses this provider's device).
func (p *Provider) Listen(addr string, params *verbs.ConnParams) (verbs.Listener, error) {
	ta, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ibverbs: listen %s: %w", addr, err)
	}
	if ta.IP == nil {
		ta.IP = net.IPv4zero
	}
	ch, err := newEventChannel()
	if err != nil {
		return nil, err
	}
	var id *C.struct_rdma_cm_id
	if rc := C.rdma_create_id(ch, &id, nil, C.RDMA_PS_TCP); rc != 0 {
		err := syscall.Errno(C.errno_of())
		C.rdma_destroy_event_channel(ch)
		return nil, fmt.Errorf("ibverbs: rdma_create_id: %w", err)
	}
	ip := ipBytes(ta.IP)
	cip := C.CBytes(ip)
	rc := C.bind_addr(id, (*C.uint8_t)(cip), C.int(len(ip)), C.int(ta.Port))
	C.free(cip)
	if rc == 0 {
		if C.rdma_listen(id, 64) != 0 {
			rc = -C.int(C.errno_of())
		}
	}
	if rc != 0 {
		C.rdma_destroy_id(id)
		C.rdma_destroy_event_channel(ch)
		return nil, fmt.Errorf("ibverbs: listen %s: %w", addr, syscall.Errno(-rc))
	}
	l := &listener{p: p, params: *params, ch: ch, id: id, stop: make(chan struct{})}
	l.addr = idAddr(id, false)
	return l, nil
}

func (l *listener) Addr() net.Addr { return l.addr }

// Close stops listening.
func (l *listener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	close(l.stop)
	C.rdma_destroy_id(l.id)
	C.rdma_destroy_event_channel(l.ch)
	return nil
}

// Accept returns the next established queue pair.
func (l *listener) Accept(ctx context.Context) (verbs.QueuePair, error) {
	for {
		q, err := l.acceptOne(ctx)
		if q != nil || err != nil {
			return q, err
		}
	}
}

// acceptOne handles one connection request; nil, nil means it was
// rejected or failed and the caller should wait for the next.
func (l *listener) acceptOne(ctx context.Context) (verbs.QueuePair, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, fmt.Errorf("ibverbs: accept: %w", verbs.ErrClosed)
	}
	ev, err := waitEventCtx(ctx, l.stop, l.ch)
	if errors.Is(err, errStopped) {
		return nil, fmt.Errorf("ibverbs: accept: %w", verbs.ErrClosed)
	}
	if err != nil {
		return nil, fmt.Errorf("ibverbs: accept: %w", err)
	}
	if int(ev.event) != cmConnectRequest {
		return nil, nil // e.g. events of ids not yet migrated
	}
	child := ev.id
	reqPD := C.GoBytes(unsafe.Pointer(&ev.pdata[0]), ev.pdata_len)
	req := &verbs.ConnRequest{RemoteAddr: idAddr(child, true), PrivateData: reqPD,
		IRD: int(ev.initiator_depth), ORD: int(ev.responder_resources), CRC: l.p.info.IWARP()}
	reply := l.params.PrivateData
	if l.params.OnConnect != nil {
		r, err := l.params.OnConnect(req)
		if err != nil {
			C.rdma_reject(child, nil, 0)
			C.rdma_destroy_id(child)
			return nil, nil
		}
		if r != nil {
			reply = r
		}
	}
	ch, err := newEventChannel()
	if err != nil {
		C.rdma_reject(child, nil, 0)
		C.rdma_destroy_id(child)
		return nil, err
	}
	if C.rdma_migrate_id(child, ch) != 0 {
		err := syscall.Errno(C.errno_of())
		C.rdma_reject(child, nil, 0)
		C.rdma_destroy_id(child)
		C.rdma_destroy_event_channel(ch)
		return nil, fmt.Errorf("ibverbs: rdma_migrate_id: %w", err)
	}
	q, err := l.p.newQP(ch, child, &l.params)
	if err != nil {
		C.rdma_reject(child, nil, 0)
		C.rdma_destroy_id(child)
		C.rdma_destroy_event_channel(ch)
		return nil, nil
	}
	if l.params.Setup != nil {
		if err := l.params.Setup(q); err != nil {
			C.rdma_reject(child, nil, 0)
			q.Close()
			return nil, nil
		}
	}
	q.peerPD = reqPD
	q.ird = depth(min(depthOr(l.params.IRD), req.ORD), l.p.maxRD)
	q.ord = depth(min(depthOr(l.params.ORD), req.IRD), l.p.maxIRD)
	var cpd unsafe.Pointer
	if len(reply) > 0 {
		cpd = C.CBytes(reply)
	}
	rc := C.do_accept(child, cpd, C.int(len(reply)), C.int(q.ird), C.int(q.ord))
	if cpd != nil {
		C.free(cpd)
	}
	if rc != 0 {
		q.Close()
		return nil, nil
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ev, err = waitEventCtx(actx, nil, ch)
	if err == nil {
		err = cmError(int(ev.event), int(ev.status), cmEstablished)
	}
	if err != nil {
		q.Close()
		return nil, nil
	}
	q.addrs()
	q.wg.Add(1)
	go q.cmLoop()
	return q, nil
}

func depthOr(v int) int {
	if v <= 0 {
		return defaultRead
	}
	return v
}
