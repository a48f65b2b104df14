package nfsclient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// Server restart recovery (RFC 8881 s8.4.2). A restarted server has
// forgotten the client ID (NFS4ERR_STALE_CLIENTID), its sessions
// (NFS4ERR_BADSESSION, DEADSESSION, usually seen after the connection
// broke and a retransmission arrived at the new instance) and all
// stateids (NFS4ERR_STALE_STATEID). The client then, under recoverMu and
// with every other request held back at the gate:
//
//  1. makes a new client ID and session (EXCHANGE_ID, CREATE_SESSION),
//  2. reclaims each open with OPEN CLAIM_PREVIOUS and each byte-range
//     lock with LOCK reclaim=true, inside the server's grace period
//     (s8.4.2.1, s9.6, s18.16.3, s18.10.3),
//  3. sends RECLAIM_COMPLETE (s18.51),
//
// and lets the held requests go. Callers keep the stateids they got from
// OPEN: each request looks its stateid up in the open table at the time
// it is built and sends the reclaimed one. An open whose reclaim the
// server refuses (NFS4ERR_NO_GRACE after the grace period, RECLAIM_BAD,
// a conflicting lock granted meanwhile) is marked lost: every later
// request on it fails with ErrStateLost (EIO), so an application never
// silently loses a write or a lock. Unstable writes are sent again when
// COMMIT returns another verifier (UnstableWriter, s18.3.3).

// ErrStateLost is returned for an open file whose open or lock state the
// server lost in a restart and refused to give back (RFC 8881 s8.4.3).
var ErrStateLost = errors.New("nfs: open or lock state lost in a server restart")

// recoveryTimeout bounds one recovery, which runs detached from the
// request that noticed the restart (another may be waiting for it).
const recoveryTimeout = 10 * time.Minute

// openState is the client's record of an open, for reclaim.
type openState struct {
	owner  [16]byte
	access uint32
	deny   uint32
	cred   oncrpc.Credential

	mu      sync.Mutex
	sid     StateID    // current open stateid
	others  [][12]byte // every stateid "other" the open had, for lookup
	epoch   uint64     // client ID epoch sid belongs to
	lost    error      // reclaim refused: requests fail with this
	lockers []*Locker
	closed  bool
}

type recoveryKey struct{}

// recoveryCtx marks a context as the recovery's own: its requests pass
// the gate and never start a nested recovery.
func recoveryCtx(ctx context.Context) context.Context {
	return context.WithValue(ctx, recoveryKey{}, true)
}

func inRecovery(ctx context.Context) bool { return ctx.Value(recoveryKey{}) != nil }

// waitGate holds a request back while a recovery runs.
func (c *Client) waitGate(ctx context.Context) error {
	g := c.gate.Load()
	if g == nil || inRecovery(ctx) {
		return nil
	}
	select {
	case <-*g:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for server restart recovery: %w", ctx.Err())
	}
}

// trackOpen records a new open for reclaim.
func (c *Client) trackOpen(of *OpenFile, owner [16]byte, access, deny uint32, cred oncrpc.Credential) {
	of.st = &openState{owner: owner, access: access, deny: deny, cred: cred,
		sid: of.StateID, others: [][12]byte{of.StateID.Other}, epoch: c.epoch.Load()}
	c.stateMu.Lock()
	c.opens[of.StateID.Other] = of
	c.stateMu.Unlock()
}

// untrackOpen forgets of once it is closed.
func (c *Client) untrackOpen(of *OpenFile) {
	if of.st == nil {
		return
	}
	of.st.mu.Lock()
	of.st.closed = true
	others := of.st.others
	of.st.mu.Unlock()
	c.stateMu.Lock()
	for _, o := range others {
		delete(c.opens, o)
	}
	c.stateMu.Unlock()
}

// lookupOpen returns the open that had stateid "other" o, or nil.
func (c *Client) lookupOpen(o [12]byte) *OpenFile {
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	return c.opens[o]
}

// currentSID returns the stateid to send for sid: the reclaimed one when
// sid is an open's stateid from before a server restart, sid itself when
// the client does not know it (special and delegation stateids). An open
// that was lost gives its error.
func (c *Client) currentSID(sid StateID) (StateID, error) {
	of := c.lookupOpen(sid.Other)
	if of == nil {
		return sid, nil
	}
	return of.st.current(sid)
}

func (st *openState) current(sid StateID) (StateID, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.lost != nil {
		return sid, st.lost
	}
	if st.sid.Other == sid.Other {
		return sid, nil
	}
	return st.sid, nil
}

// sid is currentSID for a compound builder: an error stops the compound.
func (c *Client) sid(cp *compound, sid StateID) StateID {
	cur, err := c.currentSID(sid)
	if err != nil && cp.err == nil {
		cp.err = err
	}
	return cur
}

// OpenLost returns the error that made of unusable (its reclaim after a
// server restart was refused), or nil.
func (c *Client) OpenLost(of *OpenFile) error {
	if of.st == nil {
		return nil
	}
	of.st.mu.Lock()
	defer of.st.mu.Unlock()
	return of.st.lost
}

// startRecovery closes the gate; the returned function opens it.
func (c *Client) startRecovery() func() {
	ch := make(chan struct{})
	c.gate.Store(&ch)
	return func() {
		c.gate.Store(nil)
		close(ch)
	}
}

// recoverState replaces the session bad (RFC 8881 s2.10.13) and, when the
// server lost the client ID too (newClient, or a CREATE_SESSION answered
// NFS4ERR_STALE_CLIENTID), reclaims the client's state. It runs once for
// all requests that saw bad fail; they retry afterwards.
func (c *Client) recoverState(ctx context.Context, bad *session, newClient bool, why error) error {
	c.recoverMu.Lock()
	defer c.recoverMu.Unlock()
	if c.sess.Load() != bad && !c.needReclaim {
		return nil // recovered by someone else meanwhile
	}
	open := c.startRecovery()
	defer open()
	c.stats.recoveries.Add(1)
	c.trace("recovery (new client ID: %v): %v", newClient, why)
	// The recovery outlives the request that noticed the restart: others
	// wait for it at the gate.
	rctx, cancel := context.WithTimeout(recoveryCtx(context.WithoutCancel(ctx)), recoveryTimeout)
	defer cancel()
	if c.sess.Load() == bad {
		if err := c.establish(rctx, newClient); err != nil {
			return fmt.Errorf("recovery: %w", err)
		}
	}
	if !c.needReclaim {
		return nil
	}
	if err := c.reclaimAll(rctx); err != nil {
		return fmt.Errorf("recovery: %w", err)
	}
	// RFC 8881 s18.51.3: the server may end its grace period once every
	// client sent RECLAIM_COMPLETE.
	if err := c.reclaimComplete(rctx); err != nil {
		return fmt.Errorf("recovery: %w", err)
	}
	c.needReclaim = false
	return nil
}

// newClientID is called (under recoverMu) when EXCHANGE_ID made a new
// client ID: every stateid of the old one is gone, so the opens need
// reclaiming and delegations are forgotten (RFC 8881 s8.4.2, s10.2.1).
func (c *Client) newClientID() {
	c.epoch.Add(1)
	c.stateMu.Lock()
	n := len(c.opens)
	c.stateMu.Unlock()
	c.needReclaim = n > 0
	c.cb.forgetDelegations()
}

func (c *Client) reclaimComplete(ctx context.Context) error {
	err := c.do(ctx, c.sysCred, func(cp *compound) {
		cp.add(&reclaimCompleteOp{args: reclaimComplete4args{oneFs: false}}) // all file systems
	})
	if err != nil && !errors.Is(err, ErrCompleteAlready) {
		return fmt.Errorf("RECLAIM_COMPLETE: %w", err)
	}
	return nil
}

// reclaimAll reclaims every open not yet reclaimed for the current
// client ID, and its locks. A reclaim the server refuses marks that open
// lost; any other failure (the server went away again) stops the reclaim,
// to be taken up by the next recovery.
func (c *Client) reclaimAll(ctx context.Context) error {
	epoch := c.epoch.Load()
	c.stateMu.Lock()
	seen := make(map[*OpenFile]bool, len(c.opens))
	var opens []*OpenFile
	for _, of := range c.opens {
		if !seen[of] {
			seen[of] = true
			opens = append(opens, of)
		}
	}
	c.stateMu.Unlock()
	for _, of := range opens {
		st := of.st
		st.mu.Lock()
		skip := st.closed || st.lost != nil || st.epoch == epoch
		st.mu.Unlock()
		if skip {
			continue
		}
		err := c.reclaimOpen(ctx, of)
		if err == nil {
			err = c.reclaimLocks(ctx, of)
		}
		if err != nil && !refused(err) {
			return err
		}
		st.mu.Lock()
		if err != nil {
			st.lost = fmt.Errorf("%w: %w", ErrStateLost, err)
			c.stats.lostOpens.Add(1)
		}
		st.epoch = epoch
		st.mu.Unlock()
		c.trace("reclaim fh=%x: %v", of.FH, err)
	}
	return nil
}

// refused reports whether err is the server's answer to a reclaim (an
// operation's status, e.g. NFS4ERR_NO_GRACE, RECLAIM_BAD, DENIED), not a
// lost session or connection.
func refused(err error) bool {
	var oe *OpError
	return errors.As(err, &oe) && oe.Op != "SEQUENCE"
}

// reclaimOpen sends OPEN with CLAIM_PREVIOUS for of (RFC 8881 s18.16.3:
// the current file handle is the file; the open-owner and share access
// are the ones of the lost open).
func (c *Client) reclaimOpen(ctx context.Context, of *OpenFile) error {
	st := of.st
	var open openOp
	err := c.do(ctx, st.cred, func(cp *compound) {
		// No delegation to reclaim: they were dropped.
		open.args = openArgs(c.currentClientID(), st.owner[:], st.access|open4ShareAccessWantNoDeleg, st.deny,
			openflag4{opentype: open4Nocreate}, openClaim4{claim: claimPrevious, delegateType: openDelegateNone})
		cp.putFH(of.FH)
		cp.add(&open)
	})
	if err != nil {
		return fmt.Errorf("OPEN CLAIM_PREVIOUS: %w", err)
	}
	if deleg, _, ok := open.res.delegation.granted(); ok {
		// Not asked for; give it back rather than track it.
		c.delegReturn(ctx, deleg, of.FH)
	}
	sid := open.res.stateid
	st.mu.Lock()
	st.sid = sid
	st.others = append(st.others, sid.Other)
	st.mu.Unlock()
	c.stateMu.Lock()
	c.opens[sid.Other] = of
	c.stateMu.Unlock()
	c.stats.reclaimedOpens.Add(1)
	return nil
}

// reclaimLocks sends LOCK with reclaim=true for every range each
// lock-owner of of held (RFC 8881 s9.6, s18.10.3); a lock-owner's first
// reclaim names the reclaimed open stateid (open_to_lock_owner4).
func (c *Client) reclaimLocks(ctx context.Context, of *OpenFile) error {
	st := of.st
	st.mu.Lock()
	lockers := append([]*Locker(nil), st.lockers...)
	openSID := st.sid
	st.mu.Unlock()
	for _, l := range lockers {
		l.smu.Lock()
		ranges := append([]lockRange(nil), l.ranges...)
		l.have, l.sid = false, StateID{}
		l.smu.Unlock()
		for _, rg := range ranges {
			l.smu.Lock()
			a := lockArgs(rg.typ, rg.off, rg.length, true, !l.have, openSID, c.currentClientID(), l.owner, l.sid)
			l.smu.Unlock()
			sid, _, err := c.sendLock(ctx, st.cred, of.FH, func(*compound) lock4args { return a })
			if err != nil {
				return fmt.Errorf("LOCK reclaim [%d,+%d): %w", rg.off, rg.length, err)
			}
			l.smu.Lock()
			l.sid, l.have = sid, true
			l.smu.Unlock()
			c.stats.reclaimedLocks.Add(1)
		}
	}
	return nil
}

// RecoveryStats are the counters of server restart recovery.
type RecoveryStats struct {
	Recoveries     int64 // session or client ID recoveries
	ReclaimedOpens uint64
	ReclaimedLocks uint64
	LostOpens      uint64 // opens whose reclaim was refused (EIO)
}

// Recovery returns the recovery counters.
func (c *Client) Recovery() RecoveryStats {
	return RecoveryStats{
		Recoveries:     c.stats.recoveries.Load(),
		ReclaimedOpens: c.stats.reclaimedOpens.Load(),
		ReclaimedLocks: c.stats.reclaimedLocks.Load(),
		LostOpens:      c.stats.lostOpens.Load(),
	}
}
