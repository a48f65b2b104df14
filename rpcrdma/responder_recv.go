package rpcrdma

import (
	"context"
	"fmt"

	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/verbs"
)

// A connection's receive buffers and the credits they back. RFC 8166
// s3.3.1: a requester may have as many calls in flight as the responder
// grants, so each credit granted is a receive buffer posted before the
// reply that grants it goes out. setupQP posts those for the single
// credit of a new connection (s3.3.3); the first call that arrives has
// the rest posted (growRecv), and every message we send carries the
// grant those buffers back (grant).

// grant returns the credits our posted receive buffers back: every
// buffer beyond the margin for backward replies and RDMA_OPTIONALs
// (recvCount), at most Credits.
func (c *serverConn) grant() uint32 {
	return uint32(max(1, min(c.s.cfg.Credits, int(c.posted.Load())-recvCount(0))))
}

// growRecv posts the receive buffers of the whole grant once a call has
// arrived, so that the reply to it may grant Credits. It takes what the
// connection's share and the slab have now without waiting (serve must
// go on receiving): what it cannot have is not granted, and the next call
// tries again.
func (c *serverConn) growRecv(bufs []*mrcache.Buffer) []*mrcache.Buffer {
	want := recvCount(c.s.cfg.Credits)
	if len(bufs) >= want {
		return bufs
	}
	now, cancel := context.WithCancel(c.ctx)
	cancel() // a try: getBuf fails at once rather than wait
	c.mu.Lock()
	size := max(c.recvSize, c.growTo) // v2: a buffer posted while growing has the new size
	c.mu.Unlock()
	for len(bufs) < want {
		b, err := c.s.getBuf(now, c.mem, size, true)
		if err != nil {
			break
		}
		wrid := uint64(len(bufs))
		bufs = append(bufs, b)
		if err := c.repostRecv(wrid, b); err != nil {
			// Closing: serve's cleanup gives the buffer back with
			// the others.
			break
		}
		c.posted.Add(1)
	}
	return bufs
}

// repostRecv posts buf again as receive wrid, whose last buffer the
// queue pair has completed: its scatter list can be reused.
func (c *serverConn) repostRecv(wrid uint64, buf *mrcache.Buffer) error {
	sge, err := buf.SGE(0, len(buf.Bytes()))
	if err != nil {
		return fmt.Errorf("rpcrdma: responder receive buffer: %w", err)
	}
	for uint64(len(c.recvSGL)) <= wrid {
		c.recvSGL = append(c.recvSGL, [1]verbs.SGE{})
	}
	c.recvSGL[wrid][0] = sge
	return c.qp.PostRecv(verbs.RecvWR{WRID: wrid, SGL: c.recvSGL[wrid][:]})
}

func (s *Responder) postRecv(qp verbs.QueuePair, wrid uint64, buf *mrcache.Buffer) error {
	sge, err := buf.SGE(0, len(buf.Bytes()))
	if err != nil {
		return fmt.Errorf("rpcrdma: responder receive buffer: %w", err)
	}
	return qp.PostRecv(verbs.RecvWR{WRID: wrid, SGL: []verbs.SGE{sge}})
}
