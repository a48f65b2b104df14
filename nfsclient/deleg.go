package nfsclient

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// Delegations (RFC 8881 s10.2). With Config.Delegations the client lets
// OPEN hand out read and write delegations and records them by file
// handle; while one is held, nobody else may change the file (s10.4), so
// the FUSE layer serves attributes and cached data without revalidating
// (Client.Delegated). A CB_RECALL queues the delegation for the one
// recall worker, which runs the recall handler (the FUSE layer writes
// out dirty data and drops its caches) and then DELEGRETURNs, within the
// lease (s10.4.1, s20.2). The work is bounded: a CB_RECALL for a stateid
// the client does not hold gets NFS4ERR_BAD_STATEID at once, a
// delegation is queued at most once, at most maxDelegations are held
// (further OPENs ask for none), and one goroutine returns them.

// maxDelegations bounds the delegations held, and so the recall queue.
const maxDelegations = 4096

// delegation is one delegation held.
type delegation struct {
	sid      StateID
	fh       []byte
	write    bool // OPEN_DELEGATE_WRITE
	recalled bool // queued for return
}

// delegTable is the client's delegations; callbackServer.mu guards it.
type delegTable struct {
	bySID   map[StateID]*delegation
	byFH    map[string]*delegation
	queue   []*delegation // recalled, to be returned by the worker
	working bool          // the recall worker runs

	granted, recalled, returned atomic.Uint64
}

func newDelegTable() delegTable {
	return delegTable{bySID: make(map[StateID]*delegation), byFH: make(map[string]*delegation)}
}

// RecallHandler is called before a recalled delegation on fh is
// returned: it must write back data modified under a write delegation
// and drop what was cached on the strength of the delegation.
type RecallHandler func(ctx context.Context, fh []byte)

// SetRecallHandler sets the function run for each recalled delegation.
func (c *Client) SetRecallHandler(h RecallHandler) {
	c.cb.mu.Lock()
	c.cb.onRecall = h
	c.cb.mu.Unlock()
}

// wantDeleg reports whether OPEN may ask for a delegation.
func (s *callbackServer) wantDeleg() bool {
	if !s.c.cfg.Delegations {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.delegs.bySID) < maxDelegations
}

// addDelegation records a delegation OPEN granted. It reports false if
// the client already holds it.
func (s *callbackServer) addDelegation(sid StateID, fh []byte, write bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := &s.delegs
	if _, ok := t.bySID[sid]; ok {
		return
	}
	d := &delegation{sid: sid, fh: append([]byte(nil), fh...), write: write}
	t.bySID[sid] = d
	t.byFH[string(d.fh)] = d
	t.granted.Add(1)
}

// Delegated reports whether the client holds a delegation on fh that is
// not being recalled: nobody else can change the file meanwhile.
func (c *Client) Delegated(fh []byte) bool {
	c.cb.mu.Lock()
	defer c.cb.mu.Unlock()
	d := c.cb.delegs.byFH[string(fh)]
	return d != nil && !d.recalled
}

// recall serves a CB_RECALL (RFC 8881 s20.2): a known delegation is
// queued for return and the reply is NFS4_OK at once; an unknown
// stateid is NFS4ERR_BAD_STATEID (s20.2.3).
func (s *callbackServer) recall(sid StateID, fh []byte) Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recalls++
	d := s.delegs.bySID[sid]
	if d == nil {
		return ErrBadStateID
	}
	s.queueLocked(d)
	return StatusOK
}

// ReturnDelegation gives back the delegation held on fh, if any, the way
// a recall would (the recall handler runs first), and waits for the
// DELEGRETURN. The FUSE layer calls it before removing a file's last
// link: a delegation keeps the server's file alive, and with it the
// space of a removed file, until it is returned (Linux nfs4_proc_remove
// returns the delegation when i_nlink is 1).
func (c *Client) ReturnDelegation(fh []byte) {
	s := c.cb
	s.mu.Lock()
	d := s.delegs.byFH[string(fh)]
	if d == nil || d.recalled {
		s.mu.Unlock()
		return
	}
	d.recalled = true
	h := s.onRecall
	s.mu.Unlock()
	s.returnDeleg(d, h)
}

// recallAll serves CB_RECALL_ANY by returning every delegation
// (RFC 8881 s20.6 lets the client keep some; it keeps none).
func (s *callbackServer) recallAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.delegs.bySID {
		s.queueLocked(d)
	}
}

// queueLocked queues d for return, once, and starts the worker if it
// does not run.
func (s *callbackServer) queueLocked(d *delegation) {
	if d.recalled {
		return
	}
	d.recalled = true
	s.delegs.recalled.Add(1)
	s.delegs.queue = append(s.delegs.queue, d)
	if !s.delegs.working {
		s.delegs.working = true
		go s.recallWorker()
	}
}

// recallWorker returns queued delegations until the queue is empty.
func (s *callbackServer) recallWorker() {
	for {
		s.mu.Lock()
		if len(s.delegs.queue) == 0 {
			s.delegs.working = false
			s.mu.Unlock()
			return
		}
		d := s.delegs.queue[0]
		s.delegs.queue[0] = nil
		s.delegs.queue = s.delegs.queue[1:]
		h := s.onRecall
		s.mu.Unlock()
		s.returnDeleg(d, h)
	}
}

// returnDeleg flushes and returns one recalled delegation. The server
// revokes a delegation not returned within the lease (RFC 8881 s10.4.1),
// so the whole return is bounded by it.
func (s *callbackServer) returnDeleg(d *delegation, h RecallHandler) {
	ctx, cancel := context.WithTimeout(context.Background(), max(s.c.lease, 5*time.Second))
	defer cancel()
	if h != nil {
		h(ctx, d.fh)
	}
	err := s.c.delegReturn(ctx, d.sid, d.fh)
	s.c.trace("DELEGRETURN after recall fh=%x: %v", d.fh, err)
	if err == nil || errors.Is(err, ErrBadStateID) || errors.Is(err, ErrStaleStateID) || errors.Is(err, ErrDelegRevoked) {
		s.forget(d)
		s.delegs.returned.Add(1)
	}
}

// forget removes d from the table.
func (s *callbackServer) forget(d *delegation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.delegs.bySID[d.sid] == d {
		delete(s.delegs.bySID, d.sid)
	}
	if s.delegs.byFH[string(d.fh)] == d {
		delete(s.delegs.byFH, string(d.fh))
	}
}

// returnAll returns every delegation still held, before unmount.
func (s *callbackServer) returnAll(ctx context.Context) {
	s.mu.Lock()
	var all []*delegation
	for _, d := range s.delegs.bySID {
		if !d.recalled {
			d.recalled = true
			all = append(all, d)
		}
	}
	s.mu.Unlock()
	for _, d := range all {
		if err := s.c.delegReturn(ctx, d.sid, d.fh); err == nil {
			s.delegs.returned.Add(1)
		}
		s.forget(d)
	}
}

// forgetDelegations drops every delegation: the server that granted them
// restarted and has forgotten them (RFC 8881 s10.2.1). The FUSE layer's
// caches are dropped through the recall handler, without a DELEGRETURN.
func (s *callbackServer) forgetDelegations() {
	s.mu.Lock()
	old := s.delegs.bySID
	s.delegs.bySID = make(map[StateID]*delegation)
	s.delegs.byFH = make(map[string]*delegation)
	for _, d := range old {
		d.recalled = true
	}
	h := s.onRecall
	s.mu.Unlock()
	if h == nil || len(old) == 0 {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, d := range old {
			h(ctx, d.fh)
		}
	}()
}

// Delegations returns how many delegations the client holds.
func (c *Client) Delegations() int {
	c.cb.mu.Lock()
	defer c.cb.mu.Unlock()
	return len(c.cb.delegs.bySID)
}

// Recalls returns how many CB_RECALLs the client has served.
func (c *Client) Recalls() int {
	c.cb.mu.Lock()
	defer c.cb.mu.Unlock()
	return c.cb.recalls
}

// DelegationStats counts delegations over the client's life.
type DelegationStats struct {
	Granted, Recalled, Returned uint64
	Held                        int
}

// DelegationStats returns the delegation counters.
func (c *Client) DelegationStats() DelegationStats {
	t := &c.cb.delegs
	return DelegationStats{Granted: t.granted.Load(), Recalled: t.recalled.Load(), Returned: t.returned.Load(), Held: c.Delegations()}
}
