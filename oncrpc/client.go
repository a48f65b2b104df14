package oncrpc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/rdmafs/rdmafs/internal/wait"
	"github.com/rdmafs/rdmafs/internal/xdr"
)

// ClientOptions tune a Client's retry behaviour, as the NFS mount options
// timeo, retrans and soft/hard do.
type ClientOptions struct {
	// Timeout is how long one transmission waits for its reply before the
	// call is sent again (timeo). Zero means 60 s, the Linux TCP default.
	Timeout time.Duration
	// Retrans is how many times a call is sent again after a timeout or a
	// broken connection before a soft client gives up. Zero means 2.
	Retrans int
	// Hard makes the client retry forever (until ctx ends) instead of
	// failing with ErrTimeout after Retrans retransmissions.
	Hard bool
	// OnRetransmit, if set, is called before each retransmission.
	OnRetransmit func(xid uint32, attempt int, cause error)
}

// ErrTimeout is returned by a soft client that got no reply after its
// retransmissions.
var ErrTimeout = errors.New("rpc: timed out")

// ErrNoReply is the cause (context.Cause) of the context a Client gives
// one transmission when its Timeout passes without a reply. A Transport
// that sees it breaks the connection the call went out on, so that the
// retransmission goes over a new one: RFC 8881 s2.9.2 lets a client
// retry a request only once the connection it was sent on is gone (the
// server never drops a request on a connection that stays up), and
// RFC 8166 (rfc5666bis s7.3.2) has the client re-establish the
// connection before it sends again.
var ErrNoReply = errors.New("rpc: no reply within the timeout")

// Client sends calls of one RPC program and version over a Transport.
type Client struct {
	tr         Transport
	prog, vers uint32
	opts       ClientOptions
	xid        atomic.Uint32
}

// NewClient returns a Client for program prog, version vers over tr.
func NewClient(tr Transport, prog, vers uint32, opts ClientOptions) *Client {
	if opts.Timeout <= 0 {
		opts.Timeout = 60 * time.Second
	}
	if opts.Retrans <= 0 {
		opts.Retrans = 2
	}
	c := &Client{tr: tr, prog: prog, vers: vers, opts: opts}
	// RFC 5531 s9: XIDs only need to be unique per client; a random start
	// keeps a restarted client from reusing a server's replay-cache entry.
	c.xid.Store(rand.Uint32())
	return c
}

// Transport returns the client's transport.
func (c *Client) Transport() Transport { return c.tr }

// StartCall appends the RPC header for procedure proc to e and returns the
// XID it allocated. The caller then appends the arguments.
func (c *Client) StartCall(e *xdr.Encoder, proc uint32, cred Credential) uint32 {
	xid := c.xid.Add(1)
	AppendCallHeader(e, xid, c.prog, c.vers, proc, cred)
	return xid
}

// Do sends call and returns its reply with Results set to the procedure
// results. It retransmits after a timeout or a broken connection, keeping
// the XID so the server's duplicate request cache can recognise the call.
// The caller must Release the reply.
//
// A soft client gives up after Retrans retransmissions, but not before
// Timeout has passed since the first: a server that refuses connections
// while it restarts fails each attempt at once, and those attempts are
// not timeouts (Linux likewise keeps reconnecting until the major
// timeout).
func (c *Client) Do(ctx context.Context, call *Call) (*Reply, error) {
	var lastErr error
	start := time.Now()
	var sent *gssSent
	if call.GSS != nil {
		sent = &gssSent{}
	} else if gssPlaceholder(call.Head) {
		return nil, errors.New("rpc: a call under an RPCSEC_GSS context without the context (Call.GSS)")
	}
	garbled := 0
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if !c.opts.Hard && attempt > c.opts.Retrans && time.Since(start) >= c.opts.Timeout {
				return nil, fmt.Errorf("%w after %d transmissions: %w", ErrTimeout, attempt, lastErr)
			}
			if c.opts.OnRetransmit != nil {
				c.opts.OnRetransmit(call.XID, attempt, lastErr)
			}
		}
		rep, err := c.roundTrip(ctx, call, sent)
		if err == nil {
			return rep, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		if errors.Is(err, errGSSReply) {
			// Dropped (RFC 2203 s5.3.3.2); sent again with a new
			// sequence number, a bounded number of times.
			if garbled++; garbled > gssReplyRetries {
				return nil, err
			}
			lastErr = err
			continue
		}
		if !errors.Is(err, ErrConnection) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		lastErr = err
		if errors.Is(err, ErrConnection) {
			// Do not spin against a server that refuses connections.
			if err := wait.Sleep(ctx, backoff(attempt)); err != nil {
				return nil, err
			}
		}
	}
}

// roundTrip sends call once and checks its reply. sent is nil, or
// records an RPCSEC_GSS call's transmissions (gsscall.go).
func (c *Client) roundTrip(ctx context.Context, call *Call, sent *gssSent) (*Reply, error) {
	tctx, cancel := context.WithTimeoutCause(ctx, c.opts.Timeout, ErrNoReply)
	defer cancel()
	wire := call
	if call.GSS != nil {
		var err error
		if wire, err = call.GSS.seal(call, sent); err != nil {
			return nil, err
		}
	}
	rep, err := c.tr.RoundTrip(tctx, wire)
	if err != nil {
		return nil, err
	}
	xid, verf, results, err := parseReply(rep.Msg)
	if err == nil && call.GSS != nil && xid == call.XID {
		results, err = call.GSS.open(verf, results, sent, cmp.Or(call.gssProc, gssData))
	}
	if err == nil && xid != call.XID {
		err = fmt.Errorf("%w: XID %#x for call %#x", ErrBadReply, xid, call.XID)
	}
	if err != nil {
		rep.Release()
		var ae *AcceptError
		if errors.As(err, &ae) {
			ae.Prog, ae.Vers = c.prog, c.vers
		}
		return nil, err
	}
	rep.Results = results
	return rep, nil
}

func backoff(attempt int) time.Duration {
	d := 100 * time.Millisecond << min(attempt, 6)
	return d
}

// Ping sends the NULL procedure (procedure 0) and waits for its reply.
func (c *Client) Ping(ctx context.Context) error {
	var e xdr.Encoder
	xid := c.StartCall(&e, 0, AuthNone)
	rep, err := c.Do(ctx, &Call{XID: xid, Head: e.Bytes()})
	if err != nil {
		return fmt.Errorf("rpc NULL: %w", err)
	}
	rep.Release()
	return nil
}
