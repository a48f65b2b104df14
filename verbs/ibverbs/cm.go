//go:build cgo && linux && !noibverbs

package ibverbs

/*
#include "helpers.h"

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

static int resolve_addr(struct rdma_cm_id *id, const uint8_t *ip, int iplen, int port, int ms) {
	struct sockaddr_storage ss;
	if (make_sockaddr(&ss, ip, iplen, port)) return -EINVAL;
	return rdma_resolve_addr(id, NULL, (struct sockaddr *)&ss, ms) ? -errno : 0;
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

static int do_connect(struct rdma_cm_id *id, const void *pd, int pdlen, int rr, int id_) {
	struct rdma_conn_param p;
	conn_param(&p, pd, pdlen, rr, id_);
	return rdma_connect(id, &p) ? -errno : 0;
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/verbs"
)

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
	if params == nil {
		params = &verbs.ConnParams{}
	}
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
	q.established()
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
