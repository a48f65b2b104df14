package nfsclient

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// channelAttrs is a channel_attrs4 (RFC 8881 s18.36).
type channelAttrs struct {
	HeaderPad, MaxRequest, MaxResponse, MaxResponseCached uint32
	MaxOps, MaxRequests                                   uint32
	RDMAIRD                                               []uint32
}

func (a *channelAttrs) encode(e *xdr.Encoder) {
	e.Uint32(a.HeaderPad)
	e.Uint32(a.MaxRequest)
	e.Uint32(a.MaxResponse)
	e.Uint32(a.MaxResponseCached)
	e.Uint32(a.MaxOps)
	e.Uint32(a.MaxRequests)
	e.Uint32(uint32(len(a.RDMAIRD)))
	for _, v := range a.RDMAIRD {
		e.Uint32(v)
	}
}

func decodeChannelAttrs(d *xdr.Decoder) channelAttrs {
	var a channelAttrs
	a.HeaderPad, a.MaxRequest, a.MaxResponse = d.Uint32(), d.Uint32(), d.Uint32()
	a.MaxResponseCached, a.MaxOps, a.MaxRequests = d.Uint32(), d.Uint32(), d.Uint32()
	if n := d.Length(1); n == 1 {
		a.RDMAIRD = []uint32{d.Uint32()}
	}
	return a
}

// SessionID is a sessionid4.
type SessionID [16]byte

// session is one NFSv4.1 session: its ID, negotiated channel attributes
// and fore channel slot table.
type session struct {
	id    SessionID
	fore  channelAttrs
	back  channelAttrs
	slots *slotTable
}

// maxSlots bounds the slot table whatever the server grants.
const maxSlots = 256

// exchangeID establishes the client ID (RFC 8881 s18.35), SP4_NONE.
func (c *Client) exchangeID(ctx context.Context) error {
	var cp compound
	cp.reset(c.rpc, c.sysCred, "")
	cp.op(opExchangeID)
	cp.e.FixedOpaque(c.verifier[:])
	cp.e.Opaque(c.ownerID)
	cp.e.Uint32(exchgidFlagUseNonPNFS)
	cp.e.Uint32(sp4None)
	cp.e.Uint32(1) // one nfs_impl_id4
	cp.e.String("rdmafs.invalid")
	cp.e.String("rdmafs " + Version)
	cp.e.Uint64(0)
	cp.e.Uint32(0)
	rep, err := c.rpc.Do(ctx, cp.call())
	if err != nil {
		return fmt.Errorf("EXCHANGE_ID: %w", err)
	}
	defer rep.Release()
	var r results
	if err := r.init(&cp, rep); err != nil {
		return err
	}
	if err := r.next(opExchangeID); err != nil {
		return err
	}
	d := &r.d
	clientID := d.Uint64()
	seq := d.Uint32()
	d.Uint32() // eir_flags
	if how := d.Uint32(); d.Err() == nil && how != sp4None {
		return fmt.Errorf("%w: EXCHANGE_ID: server chose state protection %d, asked for SP4_NONE", ErrProtocol, how)
	}
	d.Uint64()     // so_minor_id
	d.Opaque(1024) // so_major_id
	d.Opaque(1024) // eir_server_scope
	if n := d.Length(1); n == 1 {
		d.String(1024)
		c.serverImpl = d.String(1024)
		decodeTime(d)
	}
	if err := r.check(opExchangeID); err != nil {
		return err
	}
	c.clientID, c.csSeq = clientID, seq
	c.clientIDv.Store(clientID)
	c.trace("EXCHANGE_ID clientid=%#x seq=%d server=%q", clientID, seq, c.serverImpl)
	return nil
}

// createSession makes a new session for the current client ID (RFC 8881
// s18.36) and asks for the connection to be bound as back channel too.
func (c *Client) createSession(ctx context.Context) (*session, error) {
	var cp compound
	cp.reset(c.rpc, c.sysCred, "")
	cp.op(opCreateSession)
	cp.e.Uint64(c.clientID)
	cp.e.Uint32(c.csSeq)
	flags := uint32(0)
	if !c.cfg.NoBackChannel {
		flags |= createSessionConnBackCh
	}
	cp.e.Uint32(flags)
	fore := channelAttrs{
		MaxRequest:        uint32(c.cfg.WSize) + 8192,
		MaxResponse:       uint32(c.cfg.RSize) + 8192,
		MaxResponseCached: 8192,
		MaxOps:            16,
		MaxRequests:       uint32(c.cfg.MaxRequests),
	}
	back := channelAttrs{MaxRequest: 4096, MaxResponse: 4096, MaxOps: 8, MaxRequests: cbSlots}
	fore.encode(&cp.e)
	back.encode(&cp.e)
	cp.e.Uint32(cbProgram)
	cp.e.Uint32(2)
	cp.e.Uint32(oncrpc.FlavorNone)
	cp.e.Uint32(oncrpc.FlavorSys)
	cp.e.FixedOpaque(c.sysCred.Body)
	rep, err := c.rpc.Do(ctx, cp.call())
	if err != nil {
		return nil, fmt.Errorf("CREATE_SESSION: %w", err)
	}
	defer rep.Release()
	var r results
	if err := r.init(&cp, rep); err != nil {
		return nil, err
	}
	if err := r.next(opCreateSession); err != nil {
		return nil, err
	}
	s := &session{}
	copy(s.id[:], r.d.FixedOpaque(16))
	r.d.Uint32() // csr_sequence
	gotFlags := r.d.Uint32()
	s.fore = decodeChannelAttrs(&r.d)
	s.back = decodeChannelAttrs(&r.d)
	if err := r.check(opCreateSession); err != nil {
		return nil, err
	}
	if s.fore.MaxRequests == 0 {
		return nil, fmt.Errorf("%w: CREATE_SESSION granted no slots", ErrProtocol)
	}
	c.csSeq++ // RFC 8881 s18.36.4: the next CREATE_SESSION uses the next sequence
	s.slots = newSlotTable(int(min(s.fore.MaxRequests, maxSlots)))
	c.backChannel = gotFlags&createSessionConnBackCh != 0
	c.trace("CREATE_SESSION id=%x slots=%d maxreq=%d maxresp=%d backchannel=%v",
		s.id[:], s.fore.MaxRequests, s.fore.MaxRequest, s.fore.MaxResponse, c.backChannel)
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
	c.cb.setSession(s.id, int(s.back.MaxRequests))
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

// destroy ends the session and the client ID (RFC 8881 s18.37, s18.50).
func (c *Client) destroy(ctx context.Context) error {
	s := c.sess.Load()
	if s == nil {
		return nil
	}
	var errs []error
	var cp compound
	cp.reset(c.rpc, c.sysCred, "")
	cp.op(opDestroySession)
	cp.e.FixedOpaque(s.id[:])
	if err := c.simple(ctx, &cp, opDestroySession); err != nil {
		errs = append(errs, fmt.Errorf("DESTROY_SESSION: %w", err))
	}
	cp.reset(c.rpc, c.sysCred, "")
	cp.op(opDestroyClientID)
	cp.e.Uint64(c.clientID)
	if err := c.simple(ctx, &cp, opDestroyClientID); err != nil {
		errs = append(errs, fmt.Errorf("DESTROY_CLIENTID: %w", err))
	}
	c.sess.Store(nil)
	return errors.Join(errs...)
}

// simple sends a one-op compound outside a session and checks its
// status, retrying while the server answers NFS4ERR_DELAY (knfsd does so
// for DESTROY_SESSION while requests on the session are still running).
func (c *Client) simple(ctx context.Context, cp *compound, op uint32) error {
	call := cp.call()
	for attempt := 1; ; attempt++ {
		rep, err := c.rpc.Do(ctx, call)
		if err != nil {
			return err
		}
		var r results
		if err = r.init(cp, rep); err == nil {
			err = r.voidOp(op)
		}
		rep.Release()
		if !errors.Is(err, ErrDelay) || attempt >= 20 {
			return err
		}
		if err := sleep(ctx, retryDelay(attempt)); err != nil {
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
	var cp compound
	cp.reset(c.rpc, c.sysCred, "")
	cp.op(opBindConnToSession)
	cp.e.FixedOpaque(s.id[:])
	cp.e.Uint32(cdfc4ForeOrBoth)
	cp.e.Bool(false)
	err := c.simple(ctx, &cp, opBindConnToSession)
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
		err := c.do(ctx, c.sysCred, func(*compound) {}, func(*results) error { return nil })
		cancel()
		c.trace("lease renewal: %v", err)
	}
}
