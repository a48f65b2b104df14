package nfsclient

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rdmafs/rdmafs/internal/wait"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// SessionID is a sessionid4.
type SessionID [16]byte

// session is one NFSv4.1 session: its ID, negotiated channel attributes
// and fore channel slot table.
type session struct {
	id    SessionID
	fore  channelAttrs4
	back  channelAttrs4
	slots *slotTable
}

// maxSlots bounds the slot table whatever the server grants.
const maxSlots = 256

// exchangeID establishes the client ID (RFC 8881 s18.35), SP4_NONE.
func (c *Client) exchangeID(ctx context.Context) error {
	op := &exchangeIDOp{args: exchangeId4args{
		clientowner:  clientOwner4{verifier: c.verifier, ownerid: c.ownerID},
		flags:        exchgid4FlagUseNonPnfs,
		clientImplId: []nfsImplId4{{domain: "rdmafs.invalid", name: "rdmafs " + Version}},
	}}
	err := c.simple(ctx, op)
	if errors.Is(err, ErrMinorVersMismatch) && c.cfg.MinorVersion == 0 && c.minor.Load() == minorVersion2 {
		// RFC 8881 s16.2.3: the server does not speak 4.2; 4.1 then.
		c.trace("EXCHANGE_ID: server refuses NFSv4.2, falling back to 4.1")
		c.minor.Store(minorVersion1)
		err = c.simple(ctx, op)
	}
	if err != nil {
		return fmt.Errorf("EXCHANGE_ID: %w", err)
	}
	res := &op.res
	if len(res.serverImplId) == 1 {
		c.serverImpl = res.serverImplId[0].name
	}
	c.clientID, c.csSeq = res.clientid, res.sequenceid
	c.clientIDv.Store(res.clientid)
	c.trace("EXCHANGE_ID clientid=%#x seq=%d server=%q", res.clientid, res.sequenceid, c.serverImpl)
	return nil
}

// createSession makes a new session for the current client ID (RFC 8881
// s18.36) and asks for the connection to be bound as back channel too.
func (c *Client) createSession(ctx context.Context) (*session, error) {
	flags := uint32(0)
	if !c.cfg.NoBackChannel {
		flags |= createSession4FlagConnBackChan
	}
	op := &createSessionOp{args: createSession4args{
		clientid: c.clientID,
		sequence: c.csSeq,
		flags:    flags,
		foreChanAttrs: channelAttrs4{
			maxrequestsize:        uint32(c.cfg.WSize + writeCallOverhead),
			maxresponsesize:       uint32(c.cfg.RSize + readReplyOverhead),
			maxresponsesizeCached: 8192,
			maxoperations:         16,
			maxrequests:           uint32(c.cfg.MaxRequests),
		},
		backChanAttrs: channelAttrs4{maxrequestsize: cbMaxRequestSize, maxresponsesize: 4096, maxoperations: 8, maxrequests: cbSlots},
		cbProgram:     cbProgram,
		secParms: []callbackSecParms4{
			{flavor: authNone},
			{flavor: authSys, sysCred: rawXDR(c.sysCred.Body)},
		},
	}}
	if err := c.simple(ctx, op); err != nil {
		return nil, fmt.Errorf("CREATE_SESSION: %w", err)
	}
	res := &op.res
	s := &session{id: res.sessionid, fore: res.foreChanAttrs, back: res.backChanAttrs}
	if s.fore.maxrequests == 0 {
		return nil, fmt.Errorf("%w: CREATE_SESSION granted no slots", ErrProtocol)
	}
	c.csSeq++ // RFC 8881 s18.36.4: the next CREATE_SESSION uses the next sequence
	s.slots = newSlotTable(int(min(s.fore.maxrequests, maxSlots)))
	c.backChannel = res.flags&createSession4FlagConnBackChan != 0
	c.trace("CREATE_SESSION id=%x slots=%d maxreq=%d maxresp=%d backchannel=%v",
		s.id[:], s.fore.maxrequests, s.fore.maxrequestsize, s.fore.maxresponsesize, c.backChannel)
	return s, nil
}

// establish runs EXCHANGE_ID (when needed) and CREATE_SESSION. With a
// new client ID and no open state it sends RECLAIM_COMPLETE; with open
// state (the server restarted) the caller reclaims first (recovery.go).
func (c *Client) establish(ctx context.Context, newClient bool) error {
	if newClient {
		if err := c.exchangeID(ctx); err != nil {
			return err
		}
	}
	s, err := c.createSession(ctx)
	if errors.Is(err, ErrStaleClientID) && !newClient {
		// RFC 8881 s8.4.2: the server restarted and lost the client ID.
		if err := c.exchangeID(ctx); err != nil {
			return err
		}
		newClient = true
		s, err = c.createSession(ctx)
	}
	if err != nil {
		return err
	}
	c.sess.Store(s)
	c.cb.setSession(s.id, int(s.back.maxrequests))
	if bl, ok := c.cfg.Transport.(oncrpc.BackwardLimiter); ok {
		calls, size := backChannelLimits(s.back)
		bl.SetBackwardLimits(calls, size)
		c.trace("back channel: %d calls at once, of at most %d bytes", calls, size)
	}
	if err := c.bindConnections(ctx); err != nil {
		return err
	}
	if newClient {
		c.newClientID()
		if !c.needReclaim {
			// RFC 8881 s18.51.3: tell the server we have no state to reclaim.
			return c.reclaimComplete(ctx)
		}
	}
	return nil
}

// recoverSession replaces bad after BADSESSION/DEADSESSION or when its
// slots are exhausted; a stale client ID is re-established and the
// client's state reclaimed (RFC 8881 s2.10.13, s8.4.2).
func (c *Client) recoverSession(ctx context.Context, bad *session, why error) error {
	return c.recoverState(ctx, bad, false, why)
}

// recoverClient re-establishes the client ID after STALE_CLIENTID or
// EXPIRED and reclaims the client's state.
func (c *Client) recoverClient(ctx context.Context, bad *session, why error) error {
	return c.recoverState(ctx, bad, true, why)
}

// destroy ends the session and the client ID (RFC 8881 s18.37, s18.50).
func (c *Client) destroy(ctx context.Context) error {
	s := c.sess.Load()
	if s == nil {
		return nil
	}
	var errs []error
	if err := c.simple(ctx, &destroySessionOp{args: destroySession4args{sessionid: s.id}}); err != nil {
		errs = append(errs, fmt.Errorf("DESTROY_SESSION: %w", err))
	}
	if err := c.simple(ctx, &destroyClientIDOp{args: destroyClientid4args{clientid: c.clientID}}); err != nil {
		errs = append(errs, fmt.Errorf("DESTROY_CLIENTID: %w", err))
	}
	c.sess.Store(nil)
	return errors.Join(errs...)
}

// simple sends a COMPOUND of ops outside a session (the operations that
// make and end sessions and client IDs, RFC 8881 s18.35-s18.37, s18.50)
// and decodes their results into them, retrying while the server answers
// NFS4ERR_DELAY (knfsd does so for DESTROY_SESSION while requests on the
// session are still running).
func (c *Client) simple(ctx context.Context, ops ...nfsOp) error {
	return c.simpleOn(ctx, c.rpc, ops...)
}

// simpleOn is simple over rpc (one connection of several: nconnect.go).
func (c *Client) simpleOn(ctx context.Context, rpc *oncrpc.Client, ops ...nfsOp) error {
	var cp compound
	for attempt := 1; ; attempt++ {
		cp.resetMinor(rpc, c.sysCred, "", c.minor.Load())
		cp.add(ops...)
		rep, err := rpc.Do(ctx, cp.call())
		if err != nil {
			return err
		}
		var r results
		if err = r.init(&cp, rep); err == nil {
			err = r.decodeAll(&cp)
		}
		rep.Release()
		if !errors.Is(err, ErrDelay) || attempt >= 20 {
			return err
		}
		if err := wait.Sleep(ctx, retryDelay(attempt)); err != nil {
			return err
		}
	}
}

// bindConn binds the current connection to the session in both
// directions (RFC 8881 s18.34), after a reconnect lost the back channel.
func (c *Client) bindConn(ctx context.Context) error {
	s := c.sess.Load()
	if s == nil {
		return nil
	}
	if mt := c.multi(); mt != nil {
		// nconnect: the first connection is the back channel's.
		return c.bindConnection(ctx, 0, mt.Conn(0))
	}
	err := c.simple(ctx, &bindConnToSessionOp{args: bindConnToSession4args{sessionid: s.id, dir: cdfc4ForeOrBoth}})
	c.trace("BIND_CONN_TO_SESSION: %v", err)
	return err
}

// renewLoop keeps the lease alive while the client is idle: any SEQUENCE
// renews it (RFC 8881 s8.3), so one is sent when nothing else was for a
// third of the lease.
func (c *Client) renewLoop() {
	defer close(c.renewDone)
	period := c.lease / 3
	t := time.NewTicker(max(period/2, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-c.closing.Done():
			return
		case <-t.C:
		}
		// A tick and Close can both be ready after a long renewal against
		// a server that is gone: select picks either, so look again, or
		// Close could wait through renewal after renewal.
		if c.closing.Err() != nil {
			return
		}
		if time.Since(time.Unix(0, c.lastRenew.Load())) < period {
			continue
		}
		// Close ends a renewal in flight rather than wait up to a lease
		// for it.
		ctx, cancel := context.WithTimeout(c.closing, c.lease)
		err := c.do(ctx, c.sysCred, func(*compound) {})
		cancel()
		c.trace("lease renewal: %v", err)
	}
}
