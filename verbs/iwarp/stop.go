package iwarp

import (
	"sync"
	"time"
)

// stopper lets an invalidation stop an access to registered memory that
// waits for the peer (Aborter): the receive side's placement of a
// tagged segment whose payload the peer stalls, and the responder's Read
// Response that the peer does not take. Without it, invalidating the
// region would wait until the peer goes on, and the late bytes would
// still land (or the memory would still be read) before the invalidation
// returned. Stopping a socket operation in the middle of an FPDU leaves
// the stream unusable, so the queue pair breaks (RFC 8166 s8.1.4: the
// connection is terminated).
//
// The socket operation is interrupted with a deadline in the past, and
// only while one of the access's operations is in progress: the
// responder holds the frame writer's lock from ioStart to ioEnd, so no
// other sender's write can see the deadline.
type stopper struct {
	q     *QP
	write bool // the access writes to the socket (else it reads)

	mu      sync.Mutex
	io      bool // a socket operation of the access is in progress
	stopped bool // an invalidation stopped the access
}

// AbortAccess implements Aborter.
func (s *stopper) AbortAccess() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	if s.io {
		s.deadline(aLongTimeAgo)
	}
}

// prepare readies the stopper for a new access, before the region is
// looked up (no invalidation can reach the access before that).
func (s *stopper) prepare() {
	s.mu.Lock()
	s.stopped, s.io = false, false
	s.mu.Unlock()
}

// ioStart marks the start of a socket operation of the access; false if
// the access was stopped already and must not touch the memory.
func (s *stopper) ioStart() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	s.io = true
	return true
}

// ioEnd marks the end of the socket operation and reports whether the
// access was stopped meanwhile. A deadline set to stop the operation is
// cleared (an operation that completed first went through).
func (s *stopper) ioEnd() (stopped bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.io = false
	if s.stopped {
		s.deadline(noDeadline)
	}
	return s.stopped
}

func (s *stopper) deadline(t time.Time) {
	if s.q == nil || s.q.conn == nil {
		return // a receive path under test, without a connection
	}
	if s.write {
		_ = s.q.conn.SetWriteDeadline(t)
	} else {
		_ = s.q.conn.SetReadDeadline(t)
	}
}
