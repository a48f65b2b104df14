package rpcrdma

import (
	"context"
	"io"

	"github.com/rdmafs/rdmafs/verbs"

	"github.com/rdmafs/rdmafs/mrcache"
)

// Accepting a connection: its receive buffers posted in Setup, before
// the requester can send (the gate, responder_gate.go, decides first
// whether it is served), then its handler made and served.

// connSetup is what setupQP prepared for a connection.
type connSetup struct {
	bufs  []*mrcache.Buffer
	mem   *connBudget
	src   string        // the source admit counted the connection against
	taken chan struct{} // closed once acceptLoop owns the connection
}

// setupQP posts a new connection's first receive buffers before it is
// accepted, enough for the one credit a requester has until the first
// reply (RFC 8166 s3.3.3), from the connection's share of registered
// memory; if the slab has no room for them in setupWait, the connection
// is refused. The buffers for the rest of the grant are posted when the
// first call arrives (growRecv): a connection that sends nothing holds
// only these.
func (s *Responder) setupQP(qp verbs.QueuePair) error {
	src, err := s.admit(qp.RemoteAddr())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupWait)
	defer cancel()
	cs := &connSetup{bufs: make([]*mrcache.Buffer, 0, recvCount(1)), mem: newConnBudget(s.cfg.ConnMemory / 2),
		src: src, taken: make(chan struct{})}
	fail := func(err error) error {
		for _, b := range cs.bufs {
			_ = s.pool.Put(b)
		}
		s.release(src)
		return err
	}
	for i := range cap(cs.bufs) {
		b, err := s.getBuf(ctx, cs.mem, s.cfg.InlineRecv, true)
		if err != nil {
			return fail(err)
		}
		cs.bufs = append(cs.bufs, b)
		if err := s.postRecv(qp, uint64(i), b); err != nil {
			return fail(err)
		}
	}
	s.recvBufs.Store(qp, cs)
	// Not in the wait group: Close must not wait on a provider to end
	// a queue pair it never handed over; a Put after the pool's Close
	// is refused harmlessly.
	go s.unclaimed(qp, cs)
	return nil
}

func (s *Responder) acceptLoop() {
	defer s.wg.Done()
	for {
		qp, err := s.ln.Accept(context.Background())
		if err != nil {
			return
		}
		v, ok := s.recvBufs.LoadAndDelete(qp)
		if !ok {
			qp.Close()
			continue
		}
		cs := v.(*connSetup)
		close(cs.taken)
		peer, _, err := ParsePrivateData(qp.PeerPrivateData())
		if err != nil {
			qp.Close()
			for _, b := range cs.bufs {
				_ = s.pool.Put(b)
			}
			s.release(cs.src)
			continue
		}
		c := &serverConn{s: s, qp: qp, recvBufs: cs.bufs, mem: cs.mem, out: newConnBudget(s.cfg.ConnMemory / 2), slots: make(chan struct{}, s.cfg.Credits),
			privSend: min(peer.InlineRecv, s.cfg.InlineSend), peerInv: peer.RemoteInvalidate,
			recvSize: s.cfg.InlineRecv, peerChars: DefaultChars, handler: s.cfg.Handler,
			bcSlots: make(chan struct{}, backwardSlots), bcPending: make(map[uint32]chan []byte)}
		c.posted.Store(int32(len(cs.bufs)))
		c.recvSGL = make([][1]verbs.SGE, len(cs.bufs), recvCount(s.cfg.Credits))
		c.ctx, c.cancel = context.WithCancel(context.Background())
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		// NewConn runs on the connection's own goroutine: a handler slow
		// to make (a relay dialing its server) holds up no other
		// requester's accept. The requester's first messages wait in
		// the receive buffers setupQP posted.
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				s.release(cs.src)
			}()
			if s.cfg.NewConn != nil {
				h, err := s.cfg.NewConn(&ResponderConn{c: c})
				if err != nil {
					c.tracef("refusing %v: %v", qp.RemoteAddr(), err)
					s.stats.refused.Add(1)
					qp.Close()
					c.cancel()
					for _, b := range cs.bufs {
						c.putBuf(b, true)
					}
					return
				}
				c.handler = h
				if cl, ok := h.(io.Closer); ok {
					defer cl.Close()
				}
			}
			s.stats.accepted.Add(1)
			c.serve()
		}()
	}
}
