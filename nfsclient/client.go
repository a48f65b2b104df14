// Package nfsclient is an NFSv4.2 client with NFSv4.1 as its fallback
// (RFC 7862, RFC 8881, RFC 8276 extended attributes): the client ID and
// session (EXCHANGE_ID, CREATE_SESSION, SEQUENCE slots), the operations a
// file system needs as COMPOUNDs shaped like the Linux client's, open
// state, the callback service on the back channel, and recovery from lost
// sessions and client IDs. The operations' XDR is generated from
// nfs4.x (go generate).
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
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmafs/rdmafs/internal/lru"
	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/internal/wait"
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
	// MinorVersion is the NFSv4 minor version: 2 (RFC 7862) or 1 (RFC
	// 8881). Zero means 2, falling back to 1 when the server refuses 2
	// (NFS4ERR_MINOR_VERS_MISMATCH); an explicit 2 does not fall back.
	MinorVersion int
	// Tracer receives NFS trace events; nil traces nothing.
	Tracer *trace.Tracer
	// Security is the flavor of the calls made for users (nfs(5)
	// sec=); state management (EXCHANGE_ID, CREATE_SESSION, SEQUENCE
	// alone) stays AUTH_SYS, as RFC 8881 s2.4.3 allows. Zero is SecSys.
	Security Security
	// GSS gives each user's Kerberos mechanism; required with a
	// Kerberos Security.
	GSS GSSSource
}

// Client is an NFSv4.1 or NFSv4.2 client with one session to one server. It is safe
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

	lastRenew  atomic.Int64 // UnixNano of the last successful SEQUENCE
	bindBusy   atomic.Bool
	multiBound bool // nconnect: the MultiTransport's connections were bound (guarded by recoverMu after Dial)

	cb       *callbackServer
	ownerSeq atomic.Uint64 // open-owner numbers
	minor    atomic.Uint32 // NFSv4 minor version of the COMPOUNDs sent
	copies   copyTable     // asynchronous COPYs waiting for CB_OFFLOAD

	stats     Stats
	credCache lru.Cache[string, oncrpc.Credential] // Cred's encoded credentials, the most recently used (Max maxCachedCreds)
	gss       *gssContexts                         // the users' RPCSEC_GSS contexts; nil under SecSys

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
	switch cfg.MinorVersion {
	case 0, 1, 2:
	default:
		return nil, fmt.Errorf("nfsclient: NFS version 4.%d not supported (4.1 or 4.2)", cfg.MinorVersion)
	}
	c := &Client{
		cfg:       cfg,
		rpc:       oncrpc.NewClient(cfg.Transport, nfsProgram, nfsVersion, cfg.RPC),
		tracer:    cfg.Tracer,
		renewDone: make(chan struct{}),
		opens:     make(map[[12]byte]*OpenFile),
	}
	c.credCache.Max = maxCachedCreds
	if cfg.Security != SecSys {
		if cfg.GSS == nil {
			return nil, fmt.Errorf("nfsclient: sec=%v needs a GSSSource", cfg.Security)
		}
		c.gss = &gssContexts{src: cfg.GSS, service: cfg.Security.service()}
		c.gss.byUID.Max = maxGSSUsers
	}
	c.closing, c.stop = context.WithCancel(context.Background())
	c.minor.Store(minorVersion2)
	if cfg.MinorVersion == 1 {
		c.minor.Store(minorVersion1)
	}
	c.stats.init()
	rand.Read(c.verifier[:])
	// One client owner per Client: two mounts of one server from this
	// host are two NFSv4.1 clients, each with its own state.
	c.ownerID = []byte("rdmafs/" + cfg.Hostname + "/" + hex.EncodeToString(c.verifier[:]))
	c.sysCred = oncrpc.AuthSys{MachineName: cfg.Hostname}.Credential()
	c.cb = newCallbackServer(c)
	if !cfg.NoBackChannel {
		// Until CREATE_SESSION says what the back channel is, the
		// transport holds the server to what the client offers.
		if bl, ok := cfg.Transport.(oncrpc.BackwardLimiter); ok {
			bl.SetBackwardLimits(cbSlots, cbMaxRequestSize)
		}
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
	var fh getFHOp
	// Root's credential in the mount's flavor: a Kerberos export answers
	// NFS4ERR_WRONGSEC to AUTH_SYS (RFC 8881 s2.6.3.1).
	err := c.do(ctx, c.Cred(0, 0, nil), func(cp *compound) {
		cp.putRootFH()
		for _, p := range parts {
			cp.add(&lookupOp{args: lookup4args{objname: p}})
		}
		cp.add(&fh)
		cp.getAttr(serverAttrs, &a)
	})
	c.rootFH = fh.res.object
	if err != nil {
		return fmt.Errorf("export %q: %w", "/"+strings.Join(parts, "/"), err)
	}
	c.lease = time.Duration(max(a.LeaseTime, 5)) * time.Second
	s := c.sess.Load()
	c.rsize = clampIO(c.cfg.RSize, int(s.fore.maxresponsesize)-readReplyOverhead, a.MaxRead)
	c.wsize = clampIO(c.cfg.WSize, int(s.fore.maxrequestsize)-writeCallOverhead, a.MaxWrite)
	c.maxLen = a.MaxFileSize
	c.lastRenew.Store(time.Now().UnixNano())
	c.trace("mounted %s: lease=%v rsize=%d wsize=%d", c.cfg.Export, c.lease, c.rsize, c.wsize)
	return nil
}

// What a READ reply and a WRITE call carry besides the data, at most: the
// session's message limits minus these bound rsize and wsize (as Linux's
// nfs41_maxread_overhead and nfs41_maxwrite_overhead do). A READ reply:
// RPC reply header with its verifier (AUTH_NONE, 24 bytes), COMPOUND
// status, tag and count, SEQUENCE (44), PUTFH (8), READ's status, eof and
// length (16), padding: under 200 bytes. A WRITE call: RPC call header
// with an AUTH_SYS credential (at most about 440), COMPOUND header and
// tag, SEQUENCE (36), PUTFH with a 128-byte handle (136), WRITE's
// arguments (36), and a GETATTR or a SETATTR folded in after it (a few
// hundred): under 1200. Too generous an allowance costs RPCs: knfsd's
// 266240-byte limit (256 KiB of payload plus a page) less 8 KiB left
// 252 KiB, five READs per MiB where the kernel client sends four.
const (
	readReplyOverhead = 1024
	writeCallOverhead = 2048
)

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
		start := time.Now()
		c.cb.returnAll(ctx)
		c.trace("close: delegations returned in %v", time.Since(start).Round(time.Microsecond))
		start = time.Now()
		err = c.destroy(ctx)
		c.trace("close: DESTROY_SESSION, DESTROY_CLIENTID in %v: %v", time.Since(start).Round(time.Microsecond), err)
		if c.gss != nil {
			if gerr := c.gss.destroyAll(ctx, c.rpc); err == nil {
				err = gerr
			}
		}
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

// maxCachedCreds bounds the credentials Client.Cred keeps encoded: a
// mount shared by many users (allow_other) sees as many credentials as
// they care to make, so the least recently used is dropped beyond it.
const maxCachedCreds = 1024

// Cred returns the AUTH_SYS credential of a caller, cached so that each
// call does not encode it again: the maxCachedCreds most recently used
// are kept.
//
// Under Kerberos it names the user, whose RPCSEC_GSS context each call
// is bound to when it is sent (gss.go).
func (c *Client) Cred(uid, gid uint32, groups []uint32) oncrpc.Credential {
	if c.gss != nil {
		return gssCred(uid)
	}
	var kb strings.Builder
	fmt.Fprintf(&kb, "%d:%d", uid, gid)
	for _, g := range groups {
		fmt.Fprintf(&kb, ",%d", g)
	}
	key := kb.String()
	if cred, ok := c.credCache.Get(key); ok {
		return cred
	}
	cred := oncrpc.AuthSys{MachineName: c.cfg.Hostname, UID: uid, GID: gid, GIDs: groups}.Credential()
	c.credCache.Put(key, cred)
	return cred
}

func (c *Client) trace(format string, args ...any) {
	if c.tracer.On(trace.NFS) {
		c.tracer.Printf(trace.NFS, format, args...)
	}
}

var compoundPool = sync.Pool{New: func() any { return new(compound) }}

// do runs one COMPOUND in the session: SEQUENCE, then the operations
// build adds, each of which decodes its own result (build runs again for
// each attempt, so stateids are looked up afresh after a recovery). It
// applies the op-level error policy (opRetry): retries after
// NFS4ERR_DELAY and NFS4ERR_GRACE with backoff, and recovers the client
// ID or stale stateids; send (sequence.go) handles the session.
func (c *Client) do(ctx context.Context, cred oncrpc.Credential, build func(*compound)) error {
	cp := compoundPool.Get().(*compound)
	defer func() {
		cp.res = results{} // no reply is kept alive in the pool
		compoundPool.Put(cp)
	}()
	// The results decoder lives in the pooled compound: a local would
	// move to the heap, as decodeAll hands it to each operation's
	// decoder through an interface.
	r := &cp.res
	staleRetries, gssRetried := 0, false
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if err := wait.Sleep(ctx, retryDelay(attempt)); err != nil {
				return err
			}
		}
		bound, err := c.bind(ctx, cred)
		if err != nil {
			return err
		}
		x, err := c.send(ctx, bound, cp, r, build)
		if errors.Is(err, errRetry) {
			continue
		}
		if errors.Is(err, oncrpc.ErrGSSContext) && bound.GSS != nil && !gssRetried {
			// RFC 2203 s5.3.3.3: the server no longer knows the
			// context (CREDPROBLEM, CTXPROBLEM): a new one, once.
			c.gss.expired(binary.BigEndian.Uint32(cred.Body), bound.GSS)
			gssRetried = true
			continue
		}
		if err != nil {
			return err
		}
		err = r.decodeAll(cp)
		if err == nil && r.held != nil {
			*r.held = x.rep.Release // the caller holds slices of the reply
		} else {
			x.rep.Release()
		}
		c.stats.copied.Add(uint64(r.copied))
		c.traceCompound(cp, x.call, r.status, err, x.start)
		c.stats.record(cp.ops, time.Since(x.start), x.call.Len(), err)
		retry, err := c.opRetry(ctx, cp, x, err, &staleRetries)
		if !retry {
			return err
		}
	}
}

// opRetry is the op-level error policy: whether a COMPOUND whose
// operation failed with err is sent again (after a recovery it runs),
// or the error to return.
func (c *Client) opRetry(ctx context.Context, cp *compound, x sent, err error, staleRetries *int) (bool, error) {
	if err == nil {
		return false, nil // before oe, which errors.As moves to the heap
	}
	var oe *OpError
	if !errors.As(err, &oe) {
		return false, err
	}
	switch oe.Status {
	case ErrDelay, ErrGrace:
		return true, nil
	case ErrRetryUncachedRep:
		// A retransmission found the server executed the request
		// without caching its reply. Idempotent compounds are sent
		// again on a fresh sequence; others report it.
		return !cp.cacheThis, err
	case ErrStaleClientID:
		if inRecovery(ctx) {
			return false, err
		}
		if err := c.recoverClient(ctx, x.s, oe.Status); err != nil {
			return false, err
		}
		return true, nil
	case ErrStaleStateID, ErrBadStateID:
		// A stateid from before a server restart: sent again with the
		// reclaimed one if a recovery ran meanwhile (RFC 8881 s8.4.2);
		// a stale one with no recovery yet makes one, which finds out
		// whether the client ID is gone (s8.2.2).
		if inRecovery(ctx) || *staleRetries >= 3 {
			return false, err
		}
		*staleRetries++
		if c.epoch.Load() != x.epoch {
			return true, nil
		}
		if oe.Status == ErrStaleStateID {
			if err := c.recoverSession(ctx, x.s, oe.Status); err != nil {
				return false, err
			}
			return true, nil
		}
	}
	return false, err
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
		cp.xid, strings.Join(names, "|"), call.Len(), call.Bulk.Len(), res, time.Since(start).Round(time.Microsecond))
}

func retryDelay(attempt int) time.Duration {
	return min(10*time.Millisecond<<min(attempt, 10), 2*time.Second)
}

// currentClientID returns the client ID for use in an operation.
func (c *Client) currentClientID() uint64 { return c.clientIDv.Load() }

// OwnerID returns the client owner string sent in EXCHANGE_ID; servers
// list clients by it (knfsd: /proc/fs/nfsd/clients/*/info).
func (c *Client) OwnerID() string { return string(c.ownerID) }
