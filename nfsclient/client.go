// Package nfsclient is an NFSv4.1 client (RFC 8881): the client ID and
// session (EXCHANGE_ID, CREATE_SESSION, SEQUENCE slots), the operations a
// file system needs as COMPOUNDs shaped like the Linux client's, open
// state, the callback service on the back channel, and recovery from lost
// sessions and client IDs.
//
// It talks to the server through an oncrpc.Transport, so the same client
// runs over TCP and over RPC-over-RDMA; it never imports either.
//
//	tr := oncrpc.NewTCPTransport("server:2049", oncrpc.TCPOptions{})
//	c, err := nfsclient.Dial(ctx, nfsclient.Config{Transport: tr, Export: "/export"})
//	...
//	fh, attr, err := c.Lookup(ctx, cred, c.RootFH(), "file")
//	defer c.Close(ctx)
package nfsclient

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// Version is the client version sent in EXCHANGE_ID's implementation ID.
const Version = "0.1"

var errTimeout = oncrpc.ErrTimeout

// Config describes how a Client reaches its server.
type Config struct {
	// Transport carries the RPC messages (TCP or RPC-over-RDMA).
	Transport oncrpc.Transport
	// RPC sets timeouts and retransmissions (timeo, retrans, hard/soft).
	RPC oncrpc.ClientOptions
	// Export is the path of the export below the server's pseudo-root;
	// "" or "/" is the root itself.
	Export string
	// Hostname names this machine in AUTH_SYS credentials and the client
	// owner. Empty means os.Hostname.
	Hostname string
	// RSize and WSize are the largest READ and WRITE sizes wanted; the
	// session's limits and the server's maxread/maxwrite lower them.
	// Zero means 1 MiB.
	RSize, WSize int
	// MaxRequests is the number of fore channel slots asked for. Zero
	// means 64.
	MaxRequests int
	// NoBackChannel skips asking for a back channel (no callbacks).
	NoBackChannel bool
	// Delegations lets the server hand out read and write delegations
	// on OPEN (deleg.go): Delegated tells the FUSE layer it may cache
	// without revalidating, and a recall runs the RecallHandler before
	// DELEGRETURN. By default OPEN asks for none
	// (OPEN4_SHARE_ACCESS_WANT_NO_DELEG).
	Delegations bool
	// Tracer receives NFS trace events; nil traces nothing.
	Tracer *trace.Tracer
}

// Client is an NFSv4.1 client with one session to one server. It is safe
// for concurrent use.
type Client struct {
	cfg        Config
	rpc        *oncrpc.Client
	tracer     *trace.Tracer
	verifier   [8]byte
	ownerID    []byte
	sysCred    oncrpc.Credential // root AUTH_SYS for state management
	serverImpl string

	recoverMu   sync.Mutex // serialises recovery; guards clientID, csSeq, needReclaim
	clientID    uint64
	clientIDv   atomic.Uint64 // clientID, for compound builders
	csSeq       uint32
	sess        atomic.Pointer[session]
	backChannel bool
	needReclaim bool // a new client ID was made while opens were held

	// Server restart recovery (recovery.go).
	epoch   atomic.Uint64                 // counts client IDs: stateids belong to one
	gate    atomic.Pointer[chan struct{}] // closed when the running recovery ends
	stateMu sync.Mutex                    // guards opens
	opens   map[[12]byte]*OpenFile        // by every stateid "other" an open had

	rootFH []byte
	lease  time.Duration
	rsize  int
	wsize  int
	maxLen uint64 // maxfilesize

	lastRenew atomic.Int64 // UnixNano of the last successful SEQUENCE
	bindBusy  atomic.Bool

	cb       *callbackServer
	ownerSeq atomic.Uint64 // open-owner numbers

	stats     Stats
	credCache sync.Map // credKey -> oncrpc.Credential

	closing   context.Context // done once Close or Abandon has begun
	stop      context.CancelFunc
	renewDone chan struct{}
	closeOnce sync.Once
}

// Dial establishes a client ID and session with the server behind
// cfg.Transport and looks up the export's root file handle.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.Transport == nil {
		return nil, errors.New("nfsclient: no transport")
	}
	if cfg.RSize <= 0 {
		cfg.RSize = 1 << 20
	}
	if cfg.WSize <= 0 {
		cfg.WSize = 1 << 20
	}
	if cfg.MaxRequests <= 0 {
		cfg.MaxRequests = 64
	}
	if cfg.Hostname == "" {
		cfg.Hostname, _ = os.Hostname()
	}
	c := &Client{
		cfg:       cfg,
		rpc:       oncrpc.NewClient(cfg.Transport, nfsProgram, nfsVersion, cfg.RPC),
		tracer:    cfg.Tracer,
		renewDone: make(chan struct{}),
		opens:     make(map[[12]byte]*OpenFile),
	}
	c.closing, c.stop = context.WithCancel(context.Background())
	c.stats.init()
	rand.Read(c.verifier[:])
	// One client owner per Client: two mounts of one server from this
	// host are two NFSv4.1 clients, each with its own state.
	c.ownerID = []byte("rdmafs/" + cfg.Hostname + "/" + hex.EncodeToString(c.verifier[:]))
	c.sysCred = oncrpc.AuthSys{MachineName: cfg.Hostname}.Credential()
	c.cb = newCallbackServer(c)
	if !cfg.NoBackChannel {
		cfg.Transport.SetCallHandler(c.cb)
	}

	if err := c.rpc.Ping(ctx); err != nil {
		return nil, fmt.Errorf("nfs server not answering: %w", err)
	}
	if err := c.establish(ctx, true); err != nil {
		return nil, fmt.Errorf("create session: %w", err)
	}
	if err := c.mountRoot(ctx); err != nil {
		c.destroy(ctx)
		return nil, err
	}
	go c.renewLoop()
	return c, nil
}

// mountRoot finds the export's file handle and the server's limits.
func (c *Client) mountRoot(ctx context.Context) error {
	var parts []string
	for _, p := range strings.Split(c.cfg.Export, "/") {
		if p != "" {
			parts = append(parts, p)
		}
	}
	var a Attr
	err := c.do(ctx, c.sysCred, func(cp *compound) {
		cp.putRootFH()
		for _, p := range parts {
			cp.lookup(p)
		}
		cp.getFH()
		cp.getAttr(serverAttrs)
	}, func(r *results) error {
		if err := r.voidOp(opPutRootFH); err != nil {
			return err
		}
		for range parts {
			if err := r.voidOp(opLookup); err != nil {
				return err
			}
		}
		fh, err := r.decodeGetFH()
		if err != nil {
			return err
		}
		c.rootFH = fh
		return r.decodeGetAttr(&a)
	})
	if err != nil {
		return fmt.Errorf("export %q: %w", "/"+strings.Join(parts, "/"), err)
	}
	c.lease = time.Duration(max(a.LeaseTime, 5)) * time.Second
	s := c.sess.Load()
	c.rsize = clampIO(c.cfg.RSize, int(s.fore.MaxResponse)-8192, a.MaxRead)
	c.wsize = clampIO(c.cfg.WSize, int(s.fore.MaxRequest)-8192, a.MaxWrite)
	c.maxLen = a.MaxFileSize
	c.lastRenew.Store(time.Now().UnixNano())
	c.trace("mounted %s: lease=%v rsize=%d wsize=%d", c.cfg.Export, c.lease, c.rsize, c.wsize)
	return nil
}

// clampIO lowers want to the session limit and the server's attribute,
// keeping a multiple of 4 KiB.
func clampIO(want, sessionLimit int, attr uint64) int {
	n := want
	if sessionLimit > 0 && sessionLimit < n {
		n = sessionLimit
	}
	if attr > 0 && attr < uint64(n) {
		n = int(attr)
	}
	if n >= 4096 {
		n &^= 4095
	}
	return max(n, 512)
}

// RootFH returns the file handle of the export's root.
func (c *Client) RootFH() []byte { return c.rootFH }

// RSize and WSize return the negotiated READ and WRITE sizes.
func (c *Client) RSize() int { return c.rsize }

// WSize returns the negotiated WRITE size.
func (c *Client) WSize() int { return c.wsize }

// LeaseTime returns the server's lease period.
func (c *Client) LeaseTime() time.Duration { return c.lease }

// ServerImpl returns the server's implementation name from EXCHANGE_ID.
func (c *Client) ServerImpl() string { return c.serverImpl }

// Close returns delegations, destroys the session and the client ID and
// stops the lease renewal. Open files should be closed first.
func (c *Client) Close(ctx context.Context) error {
	var err error
	c.closeOnce.Do(func() {
		c.stop()
		if c.lease > 0 {
			<-c.renewDone
		}
		c.cb.returnAll(ctx)
		err = c.destroy(ctx)
		if cerr := c.cfg.Transport.Close(); err == nil && cerr != nil {
			err = cerr
		}
	})
	return err
}

// Abandon gives up on the server: it closes the transport, so that calls
// in flight and every later one fail at once (oncrpc.ErrClosed) however
// hard the mount. Close still runs afterwards, to end the renewal and
// release what is left; its DESTROY calls then fail at once too.
func (c *Client) Abandon() {
	c.stop()
	c.cfg.Transport.Close()
}

// Cred returns the AUTH_SYS credential of a caller, cached so that each
// call does not encode it again.
func (c *Client) Cred(uid, gid uint32, groups []uint32) oncrpc.Credential {
	var kb strings.Builder
	fmt.Fprintf(&kb, "%d:%d", uid, gid)
	for _, g := range groups {
		fmt.Fprintf(&kb, ",%d", g)
	}
	key := kb.String()
	if v, ok := c.credCache.Load(key); ok {
		return v.(oncrpc.Credential)
	}
	cred := oncrpc.AuthSys{MachineName: c.cfg.Hostname, UID: uid, GID: gid, GIDs: groups}.Credential()
	c.credCache.Store(key, cred)
	return cred
}

func (c *Client) trace(format string, args ...any) {
	if c.tracer.On(trace.NFS) {
		c.tracer.Printf(trace.NFS, format, args...)
	}
}

var compoundPool = sync.Pool{New: func() any { return new(compound) }}

// do runs one COMPOUND in the session: SEQUENCE, then what build adds.
// parse decodes the results after SEQUENCE; it must copy what it keeps.
// do retries after NFS4ERR_DELAY and NFS4ERR_GRACE with backoff, and
// recovers the session or client ID when the server lost them.
func (c *Client) do(ctx context.Context, cred oncrpc.Credential, build func(*compound), parse func(*results) error) error {
	cp := compoundPool.Get().(*compound)
	defer compoundPool.Put(cp)
	var r results
	staleRetries := 0
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if err := sleep(ctx, retryDelay(attempt)); err != nil {
				return err
			}
		}
		if err := c.waitGate(ctx); err != nil {
			return err
		}
		epoch := c.epoch.Load()
		s := c.sess.Load()
		if s == nil {
			return fmt.Errorf("nfs: %w", oncrpc.ErrClosed)
		}
		slot, seq, highest, err := s.slots.acquire(ctx)
		if errors.Is(err, errNoSlots) {
			if err := c.recoverSession(ctx, s, err); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		cp.reset(c.rpc, cred, "")
		cp.sequence(s.id, seq, slot, highest)
		build(cp)
		if cp.err != nil {
			s.slots.release(slot, false, false, -1)
			return cp.err
		}
		start := time.Now()
		call := cp.call()
		rep, err := c.rpc.Do(ctx, call)
		if err != nil {
			// The server may or may not have executed the request; an
			// RPC-level rejection means it did not.
			var ae *oncrpc.AcceptError
			var de *oncrpc.DeniedError
			known := errors.As(err, &ae) || errors.As(err, &de)
			s.slots.release(slot, false, !known, -1)
			c.traceCompound(cp, call, 0, err, start)
			return err
		}
		if err := r.init(cp, rep); err != nil {
			s.slots.release(slot, false, true, -1)
			rep.Release()
			return err
		}
		st, target, flags, err := r.decodeSequence(s.id)
		if err != nil {
			s.slots.release(slot, false, true, -1)
			rep.Release()
			return err
		}
		switch st {
		case StatusOK:
			s.slots.release(slot, true, false, target)
			c.lastRenew.Store(time.Now().UnixNano())
			c.checkSeqFlags(flags)
		case ErrBadSession, ErrDeadSession, ErrConnNotBound:
			s.slots.release(slot, false, false, -1)
			rep.Release()
			if inRecovery(ctx) {
				// The server went away again during the recovery.
				return &OpError{Op: "SEQUENCE", Status: st}
			}
			if err := c.recoverSession(ctx, s, st); err != nil {
				return err
			}
			continue
		case ErrDelay:
			s.slots.release(slot, false, false, -1)
			rep.Release()
			continue
		case ErrBadSlot, ErrSeqMisordered, ErrSeqFalseRetry, ErrBadHighSlot:
			s.slots.release(slot, false, true, -1)
			rep.Release()
			continue
		case ErrStaleClientID, ErrExpired:
			s.slots.release(slot, false, false, -1)
			rep.Release()
			if inRecovery(ctx) {
				return &OpError{Op: "SEQUENCE", Status: st}
			}
			if err := c.recoverClient(ctx, s, st); err != nil {
				return err
			}
			continue
		default:
			s.slots.release(slot, false, false, -1)
			rep.Release()
			return &OpError{Op: "SEQUENCE", Status: st}
		}
		err = parse(&r)
		if err == nil && r.held != nil {
			*r.held = rep.Release // the caller holds slices of the reply
		} else {
			rep.Release()
		}
		c.stats.copied.Add(uint64(r.copied))
		c.traceCompound(cp, call, r.status, err, start)
		c.stats.record(cp.ops, time.Since(start), call.Len(), err)
		var oe *OpError
		if errors.As(err, &oe) {
			switch oe.Status {
			case ErrDelay, ErrGrace:
				continue
			case ErrRetryUncachedRep:
				// A retransmission found the server executed the request
				// without caching its reply. Idempotent compounds are
				// sent again on a fresh sequence; others report it.
				if !cp.cacheThis {
					continue
				}
			case ErrStaleClientID:
				if inRecovery(ctx) {
					return err
				}
				if err := c.recoverClient(ctx, s, oe.Status); err != nil {
					return err
				}
				continue
			case ErrStaleStateID, ErrBadStateID:
				// A stateid from before a server restart: sent again
				// with the reclaimed one if a recovery ran meanwhile
				// (RFC 8881 s8.4.2); a stale one with no recovery yet
				// makes one, which finds out whether the client ID is
				// gone (s8.2.2).
				if inRecovery(ctx) || staleRetries >= 3 {
					return err
				}
				staleRetries++
				if c.epoch.Load() != epoch {
					continue
				}
				if oe.Status == ErrStaleStateID {
					if err := c.recoverSession(ctx, s, oe.Status); err != nil {
						return err
					}
					continue
				}
			}
		}
		return err
	}
}

func (c *Client) traceCompound(cp *compound, call *oncrpc.Call, st Status, err error, start time.Time) {
	if !c.tracer.On(trace.NFS) {
		return
	}
	var names []string
	for _, op := range cp.ops {
		names = append(names, opName(op))
	}
	res := st.String()
	if err != nil {
		res = err.Error()
	}
	c.tracer.Printf(trace.NFS, "xid=%#08x %s len=%d bulk=%d status=%s time=%v",
		cp.xid, strings.Join(names, "|"), call.Len(), len(call.Bulk), res, time.Since(start).Round(time.Microsecond))
}

// checkSeqFlags acts on SEQUENCE status flags (RFC 8881 s18.46.3).
func (c *Client) checkSeqFlags(flags uint32) {
	if flags&(seq4StatusCBPathDown|seq4StatusCBPathDownSession|seq4StatusBackchannelFault) != 0 &&
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

func retryDelay(attempt int) time.Duration {
	return min(10*time.Millisecond<<min(attempt, 10), 2*time.Second)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// currentClientID returns the client ID for use in an operation.
func (c *Client) currentClientID() uint64 { return c.clientIDv.Load() }

// OwnerID returns the client owner string sent in EXCHANGE_ID; servers
// list clients by it (knfsd: /proc/fs/nfsd/clients/*/info).
func (c *Client) OwnerID() string { return string(c.ownerID) }
