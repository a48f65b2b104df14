//go:build cgo && linux && !noibverbs

package ibverbs

/*
#include "helpers.h"

static int post_send(struct ibv_qp *qp, const struct bind_arg *b, int nb, uint64_t wrid, int opcode, int flags,
		struct ibv_sge *sge, int nsge, uint32_t inv_rkey, uint64_t raddr, uint32_t rkey) {
	struct ibv_send_wr wrs[MAX_BINDS + 1], *bad;
	if (nb < 0 || nb > MAX_BINDS) return EINVAL;
	fill_binds(wrs, b, nb);
	struct ibv_send_wr *w = &wrs[nb];
	memset(w, 0, sizeof *w);
	w->wr_id = wrid;
	w->opcode = opcode;
	w->send_flags = flags;
	w->sg_list = nsge ? sge : NULL;
	w->num_sge = nsge;
	if (opcode == IBV_WR_SEND_WITH_INV) {
		w->invalidate_rkey = inv_rkey;
		// libsiw (rdma-core 44) sends the STag in wr.rdma.rkey, not
		// invalidate_rkey; other providers ignore wr.rdma for a Send.
		w->wr.rdma.rkey = inv_rkey;
	}
	if (opcode == IBV_WR_RDMA_WRITE || opcode == IBV_WR_RDMA_READ) {
		w->wr.rdma.remote_addr = raddr;
		w->wr.rdma.rkey = rkey;
	}
	return ibv_post_send(qp, &wrs[0], &bad);
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
*/
import "C"

import (
	"fmt"
	"net"
	"sync"
	"syscall"

	"github.com/rdmafs/rdmafs/verbs"
)

// wrInfo is what a device work request ID stands for.
type wrInfo struct {
	wrid  uint64
	op    verbs.Opcode
	recv  bool
	n     uint32
	epoch uint64 // the hook's key epoch when posted (recoverKeys)
	// Work requests of the provider's own, not the caller's: a local
	// invalidation of a window, or binds posted alone (BindWindows,
	// told whether they succeeded).
	win   *window
	bound chan bool
}

// internal reports whether the work request is the provider's own.
func (i wrInfo) internal() bool { return i.win != nil || i.bound != nil }

// queuePair is an RC queue pair connected with RDMA-CM.
type queuePair struct {
	p       *Provider
	pd      *verbs.ProtectionDomain
	h       *hook
	ch      *C.struct_rdma_event_channel
	id      *C.struct_rdma_cm_id
	qp      *C.struct_ibv_qp
	cc      *C.struct_ibv_comp_channel
	cq      *C.struct_ibv_cq
	sendCQ  *verbs.SoftCQ
	recvCQ  *verbs.SoftCQ
	maxSGE  int
	maxRead int

	peerPD   []byte
	ird, ord int
	local    net.Addr
	remote   net.Addr

	mu        sync.Mutex
	wrs       map[uint64]wrInfo
	nextID    uint64
	err       error
	closing   bool
	connected bool // the RDMA-CM connection was established
	done      chan struct{}

	stop      chan struct{} // closed by Close: the event loops end
	wg        sync.WaitGroup
	closeOnce sync.Once
	discOnce  sync.Once
}

var (
	_ verbs.QueuePair    = (*queuePair)(nil)
	_ verbs.WindowBinder = (*queuePair)(nil)
)

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
	h, ok := link.HookOf(pd).(*hook)
	if !ok || h.p != p {
		return nil, fmt.Errorf("%w: protection domain not made by this provider's NewProtectionDomain", verbs.ErrInvalidWR)
	}
	q := &queuePair{p: p, pd: pd, h: h, ch: ch, id: id, maxSGE: p.maxSGE, maxRead: p.maxRead,
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
	if wr.Opcode.IsRegistration() {
		return q.postRegistration(wr)
	}
	if err := checkSend(&wr, q.maxSGE, q.maxRead); err != nil {
		return err
	}
	var need verbs.Access
	if wr.Opcode == verbs.OpRDMARead {
		need = verbs.AccessLocalWrite // the sink
	}
	epoch := q.h.epoch.Load() // before the keys are read
	var sge [verbs.MaxSGE]C.struct_ibv_sge
	if err := q.h.sges(wr.SGL, sge[:], need); err != nil {
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
	var binds [C.MAX_BINDS]C.struct_bind_arg
	ws, err := q.bindArgs(wr.Bind, binds[:])
	if err != nil {
		return fmt.Errorf("ibverbs: post send: %w", err)
	}
	defer unlockWindows(ws)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil {
		q.sendCQ.Push(verbs.Completion{WRID: wr.WRID, Status: verbs.StatusFlushed, Opcode: wr.Opcode})
		return nil
	}
	q.nextID++
	id := q.nextID
	rc := C.post_send(q.qp, &binds[0], C.int(len(ws)), C.uint64_t(id), op, flags, &sge[0], C.int(len(wr.SGL)),
		C.uint32_t(wr.InvalidateSTag), C.uint64_t(wr.RemoteOffset), C.uint32_t(wr.RemoteSTag))
	if rc != 0 {
		// Binds before the failing request may have been posted:
		// deallocating the windows ends them.
		for _, w := range ws {
			w.deallocLocked()
			w.state = winFree
		}
		return fmt.Errorf("%w: ibv_post_send: %w", verbs.ErrInvalidWR, syscall.Errno(rc))
	}
	if len(ws) > 0 {
		q.boundLocked(ws)
		q.h.binds.Add(uint64(len(ws)))
	}
	q.wrs[id] = wrInfo{wrid: wr.WRID, op: wr.Opcode, n: n, epoch: epoch}
	return nil
}

// PostRecv posts a receive buffer.
func (q *queuePair) PostRecv(wr verbs.RecvWR) error {
	if err := checkRecv(&wr, q.maxSGE); err != nil {
		return err
	}
	epoch := q.h.epoch.Load() // before the keys are read
	var sge [verbs.MaxSGE]C.struct_ibv_sge
	if err := q.h.sges(wr.SGL, sge[:], verbs.AccessLocalWrite); err != nil {
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
	q.wrs[id] = wrInfo{wrid: wr.WRID, op: verbs.OpRecv, recv: true, epoch: epoch}
	return nil
}

// fail breaks the queue pair with err (the first reason wins): the queue
// pair moves to the error state, so the device flushes what is posted,
// and a connected queue pair disconnects, so the peer learns of it
// (RDMA-CM DISCONNECTED) even where the device tells it nothing.
func (q *queuePair) fail(err error) {
	q.mu.Lock()
	if q.err != nil {
		q.mu.Unlock()
		return
	}
	q.err = err
	close(q.done)
	connected := q.connected
	q.mu.Unlock()
	if q.qp != nil {
		C.qp_to_error(q.qp)
	}
	if connected {
		q.disconnect()
	}
}

// established records that the connection is up, then watches its
// RDMA-CM events.
func (q *queuePair) established() {
	q.addrs()
	q.mu.Lock()
	q.connected = true
	broken := q.err != nil
	q.mu.Unlock()
	if broken {
		q.disconnect()
	}
	q.wg.Add(1)
	go q.cmLoop()
}

// disconnect sends the RDMA-CM disconnect once.
func (q *queuePair) disconnect() {
	q.discOnce.Do(func() { C.rdma_disconnect(q.id) })
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
			q.disconnect()
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
