package nfsclient

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// The session layer: every COMPOUND in a session starts with SEQUENCE on
// a slot of the fore channel (RFC 8881 s2.10.6, s18.46). send takes the
// slot, sends the request and acts on SEQUENCE's status (lease renewal,
// slot accounting, lost sessions and client IDs); Client.do (client.go)
// decodes the operations' results and applies the op-level error
// policy.

// sequence encodes SEQUENCE by hand: sa_cachethis is patched in by call
// once the whole COMPOUND is known.
func (c *compound) sequence(id SessionID, seq uint32, slot, highest int) {
	c.op(opSequence)
	c.e.FixedOpaque(id[:])
	c.e.Uint32(seq)
	c.e.Uint32(uint32(slot))
	c.e.Uint32(uint32(highest))
	c.cacheAt = c.e.Len()
	c.e.Bool(false) // sa_cachethis: set by call() for non-idempotent compounds
}

// decodeSequence returns the SEQUENCE status, the target highest slot
// and the status flags.
func (r *results) decodeSequence(id SessionID) (Status, int, uint32, error) {
	err := r.next(opSequence)
	if oe, ok := err.(*OpError); ok { // next returns *OpError unwrapped
		return oe.Status, -1, 0, nil
	}
	if err != nil {
		return 0, -1, 0, err
	}
	var got SessionID
	copy(got[:], r.d.FixedOpaque(16))
	r.d.Uint32() // sr_sequenceid
	r.d.Uint32() // sr_slotid
	r.d.Uint32() // sr_highest_slotid
	target := r.d.Uint32()
	flags := r.d.Uint32()
	if err := r.check(opSequence); err != nil {
		return 0, -1, 0, err
	}
	if got != id {
		return 0, -1, 0, fmt.Errorf("%w: SEQUENCE reply for another session", ErrProtocol)
	}
	return StatusOK, int(min(target, maxSlots)), flags, nil
}

// errRetry says the session layer dealt with a failure (a recovery, a
// slot to retire, NFS4ERR_DELAY on SEQUENCE): send the COMPOUND again.
var errRetry = errors.New("nfs: send the COMPOUND again")

// sent is one COMPOUND whose SEQUENCE succeeded.
type sent struct {
	s     *session
	epoch uint64 // client ID epoch when it was built
	rep   *oncrpc.Reply
	call  *oncrpc.Call
	start time.Time
}

// send builds SEQUENCE and what build adds in cp on a slot of the
// current session, sends it and checks SEQUENCE's result. On success r
// is positioned after SEQUENCE and the caller releases the reply; errRetry
// means send again.
func (c *Client) send(ctx context.Context, cred oncrpc.Credential, cp *compound, r *results, build func(*compound)) (sent, error) {
	if err := c.waitGate(ctx); err != nil {
		return sent{}, err
	}
	x := sent{epoch: c.epoch.Load(), s: c.sess.Load()}
	s := x.s
	if s == nil {
		return x, fmt.Errorf("nfs: %w", oncrpc.ErrClosed)
	}
	slot, seq, highest, err := s.slots.acquire(ctx)
	if errors.Is(err, errNoSlots) {
		if err := c.recoverSession(ctx, s, err); err != nil {
			return x, err
		}
		return x, errRetry
	}
	if err != nil {
		return x, err
	}
	cp.resetMinor(c.rpc, cred, "", c.minor.Load())
	cp.sequence(s.id, seq, slot, highest)
	build(cp)
	if cp.err != nil {
		s.slots.release(slot, slotUnused, -1)
		return x, cp.err
	}
	x.start = time.Now()
	x.call = cp.call()
	s.slots.noteSent(slot, cp.xid, mainOpCode(cp.ops), x.start)
	rep, err := c.rpc.Do(ctx, x.call)
	if err != nil {
		// The server may or may not have executed the request; an
		// RPC-level rejection means it did not.
		var ae *oncrpc.AcceptError
		var de *oncrpc.DeniedError
		outcome := slotUnknown
		if errors.As(err, &ae) || errors.As(err, &de) {
			outcome = slotUnused
		}
		s.slots.release(slot, outcome, -1)
		c.traceCompound(cp, x.call, 0, err, x.start)
		return x, err
	}
	if err := r.init(cp, rep); err != nil {
		s.slots.release(slot, slotUnknown, -1)
		rep.Release()
		return x, err
	}
	st, target, flags, err := r.decodeSequence(s.id)
	if err != nil {
		s.slots.release(slot, slotUnknown, -1)
		rep.Release()
		return x, err
	}
	if st == StatusOK {
		s.slots.release(slot, slotProcessed, target)
		c.lastRenew.Store(time.Now().UnixNano())
		c.checkSeqFlags(flags)
		x.rep = rep
		return x, nil
	}
	rep.Release()
	switch st {
	case ErrBadSession, ErrDeadSession, ErrConnNotBound:
		s.slots.release(slot, slotUnused, -1)
		if inRecovery(ctx) {
			// The server went away again during the recovery.
			return x, &OpError{Op: "SEQUENCE", Status: st}
		}
		if err := c.recoverSession(ctx, s, st); err != nil {
			return x, err
		}
		return x, errRetry
	case ErrDelay:
		s.slots.release(slot, slotUnused, -1)
		return x, errRetry
	case ErrBadSlot, ErrSeqMisordered, ErrSeqFalseRetry, ErrBadHighSlot:
		s.slots.release(slot, slotUnknown, -1)
		return x, errRetry
	case ErrStaleClientID, ErrExpired:
		s.slots.release(slot, slotUnused, -1)
		if inRecovery(ctx) {
			return x, &OpError{Op: "SEQUENCE", Status: st}
		}
		if err := c.recoverClient(ctx, s, st); err != nil {
			return x, err
		}
		return x, errRetry
	default:
		s.slots.release(slot, slotUnused, -1)
		return x, &OpError{Op: "SEQUENCE", Status: st}
	}
}

// checkSeqFlags acts on SEQUENCE status flags (RFC 8881 s18.46.3).
func (c *Client) checkSeqFlags(flags uint32) {
	if flags&(seq4StatusCbPathDown|seq4StatusCbPathDownSession|seq4StatusBackchannelFault) != 0 &&
		!c.cfg.NoBackChannel && c.bindBusy.CompareAndSwap(false, true) {
		// A reconnect left the back channel without a connection.
		go func() {
			defer c.bindBusy.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c.bindConn(ctx)
		}()
	}
}
