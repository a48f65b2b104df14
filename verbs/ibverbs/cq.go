//go:build cgo && linux && !noibverbs

package ibverbs

/*
#include "helpers.h"

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
*/
import "C"

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/verbs"
)

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
			w := &wcs[i]
			q.deliver(workCompletion{wrID: uint64(w.wr_id), status: int(w.status), byteLen: uint32(w.byte_len),
				invRkey: uint32(w.inv_rkey), withInv: w.with_inv != 0})
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

// workCompletion is a device completion in Go terms.
type workCompletion struct {
	wrID    uint64
	status  int
	byteLen uint32
	invRkey uint32 // the STag a Send With Invalidate named (withInv)
	withInv bool
}

// deliver turns one device completion into an API completion.
func (q *queuePair) deliver(w workCompletion) {
	q.mu.Lock()
	info, ok := q.wrs[w.wrID]
	delete(q.wrs, w.wrID)
	q.mu.Unlock()
	if !ok {
		if w.status != wcSuccess && w.status != wcWRFlushErr {
			// An unsignaled window bind failed.
			q.fail(fmt.Errorf("%w: a memory window bind failed (status %d)", verbs.ErrConnectionLost, w.status))
		}
		return
	}
	st := w.status
	if info.internal() {
		q.deliverInternal(info, st)
		return
	}
	c := verbs.Completion{WRID: info.wrid, Status: mapStatus(st), Opcode: info.op}
	if info.recv {
		c.ByteLen = w.byteLen
		if w.withInv && c.Status == verbs.StatusSuccess {
			c.Opcode = verbs.OpRecvWithInvalidate
			c.InvalidatedSTag = w.invRkey
			// The device invalidated the key; the domain must agree
			// that it was a remotely accessible region of ours. If
			// not, the receive fails and the connection breaks:
			// remote invalidation is honoured only for the STags we
			// offered (RFC 8166 s3.4.4). siw invalidates any STag of
			// the protection domain (it checks only the domain, and
			// only the key's index), so a slab chunk's key may be
			// dead on the device now: it is registered again.
			q.h.remoteInvalidated(c.InvalidatedSTag)
			if err := link.InvalidateRemote(q.pd, c.InvalidatedSTag); err != nil {
				q.fail(fmt.Errorf("%w: peer invalidated an STag we did not expose: %w", verbs.ErrTerminated, err))
				c = verbs.Completion{WRID: info.wrid, Status: verbs.StatusRemoteOpErr, Opcode: verbs.OpRecv}
				q.h.recoverKeys(q.h.epoch.Load(), w.invRkey)
			}
		}
	} else if c.Status == verbs.StatusSuccess {
		c.ByteLen = info.n
	}
	if st == wcLocProtErr {
		// A local key the work request named was refused. siw with
		// rdma-core 44 does not report the Send With Invalidate that
		// killed it (see recoverKeys): the memory is registered again
		// unless that was done since this request was posted.
		q.h.recoverKeys(info.epoch, 0)
	}
	if err := statusError(st, info.op); err != nil {
		q.fail(err)
	} else if c.Status == verbs.StatusFlushed {
		// A flush we did not cause: the device moved the queue pair
		// to the error state (siw on the peer's Terminate).
		q.fail(fmt.Errorf("%w: the device flushed %v (queue pair in error state)", verbs.ErrConnectionLost, info.op))
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
		if info.internal() {
			q.deliverInternal(info, wcWRFlushErr)
			continue
		}
		c := verbs.Completion{WRID: info.wrid, Status: verbs.StatusFlushed, Opcode: info.op}
		if info.recv {
			q.recvCQ.Push(c)
		} else {
			q.sendCQ.Push(c)
		}
	}
}

// deliverInternal ends a work request of the provider's own: a window's
// local invalidation, or binds posted alone.
func (q *queuePair) deliverInternal(info wrInfo, st int) {
	ok := st == wcSuccess
	if info.win != nil {
		info.win.invalidated(ok)
	}
	if info.bound != nil {
		info.bound <- ok
	}
	if !ok && st != wcWRFlushErr {
		q.fail(fmt.Errorf("%w: a memory window bind or invalidation failed (status %d)", verbs.ErrConnectionLost, st))
	}
}
