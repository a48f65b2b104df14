//go:build cgo && linux && !noibverbs

package ibverbs

/*
#include "helpers.h"

static int bind_addr(struct rdma_cm_id *id, const uint8_t *ip, int iplen, int port) {
	struct sockaddr_storage ss;
	if (make_sockaddr(&ss, ip, iplen, port)) return -EINVAL;
	return rdma_bind_addr(id, (struct sockaddr *)&ss) ? -errno : 0;
}

static int do_accept(struct rdma_cm_id *id, const void *pd, int pdlen, int rr, int id_) {
	struct rdma_conn_param p;
	conn_param(&p, pd, pdlen, rr, id_);
	return rdma_accept(id, &p) ? -errno : 0;
}
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

	"github.com/rdmafs/rdmafs/verbs"
)

// listener accepts RDMA-CM connection requests.
type listener struct {
	p        *Provider
	params   verbs.ConnParams
	ch       *C.struct_rdma_event_channel
	id       *C.struct_rdma_cm_id
	addr     net.Addr
	mu       sync.Mutex // one Accept at a time; guards closed
	closed   bool
	stop     chan struct{} // closed by Close: a waiting Accept returns
	stopOnce sync.Once
}

// Listen listens on addr ("host:port"; host may be empty for any address
// whose route uses this provider's device).
func (p *Provider) Listen(addr string, params *verbs.ConnParams) (verbs.Listener, error) {
	if params == nil {
		params = &verbs.ConnParams{}
	}
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

// Close stops listening. It first ends an Accept in progress (which holds
// the lock while it waits for a request).
func (l *listener) Close() error {
	l.stopOnce.Do(func() { close(l.stop) })
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
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
	q.established()
	return q, nil
}

func depthOr(v int) int {
	if v <= 0 {
		return defaultRead
	}
	return v
}
