package nfsclient

import (
	"context"
	"errors"
	"fmt"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// Several connections per session (nconnect): when the transport is an
// oncrpc.MultiTransport, the first connection carries EXCHANGE_ID and
// CREATE_SESSION, which binds it to the session in both directions
// (RFC 8881 s18.36.3, CREATE_SESSION4_FLAG_CONN_BACK_CHAN); every other
// connection is then bound to the fore channel with
// BIND_CONN_TO_SESSION (s18.34), and so is each connection the transport
// redials, before it carries a call. A call whose connection breaks is
// sent again on another one with the same slot and sequence ID, which
// the server's reply cache recognises (s2.10.6.2).

// multi returns the client's MultiTransport, or nil.
func (c *Client) multi() *oncrpc.MultiTransport {
	mt, _ := c.cfg.Transport.(*oncrpc.MultiTransport)
	return mt
}

// bindConnections binds the connections after the first to the session
// just made: all of them after the first CREATE_SESSION, the live ones
// again after a recovery made a new session (RFC 8881 s2.10.13: the old
// session's bindings went with it).
func (c *Client) bindConnections(ctx context.Context) error {
	mt := c.multi()
	if mt == nil {
		return nil
	}
	if !c.multiBound {
		c.multiBound = true
		if err := mt.Bind(ctx, c.bindConnection); err != nil {
			return fmt.Errorf("nconnect=%d: %w", mt.Len(), err)
		}
		return nil
	}
	mt.Rebind(ctx)
	return nil
}

// bindConnection sends BIND_CONN_TO_SESSION on connection i of the
// MultiTransport, over tr, that connection's own transport. RFC 8881
// s18.34.3: it is the only operation of its COMPOUND (no SEQUENCE). The
// first connection is the back channel's too (CDFC4_FORE_OR_BOTH), the
// others the fore channel's only (CDFC4_FORE). Over RPC-over-RDMA the
// client asks for RDMA mode (bctsa_use_conn_in_rdma_mode).
func (c *Client) bindConnection(ctx context.Context, i int, tr oncrpc.Transport) error {
	s := c.sess.Load()
	if s == nil {
		return fmt.Errorf("BIND_CONN_TO_SESSION: no session: %w", oncrpc.ErrClosed)
	}
	dir := uint32(cdfc4Fore)
	if i == 0 && !c.cfg.NoBackChannel {
		dir = cdfc4ForeOrBoth
	}
	rdma := false
	if mt := c.multi(); mt != nil {
		rdma = mt.RDMA()
	}
	// A soft client of the connection's own: a bind that fails is
	// retried by the MultiTransport, on a new connection.
	rpc := oncrpc.NewClient(tr, nfsProgram, nfsVersion, oncrpc.ClientOptions{Timeout: c.cfg.RPC.Timeout, Retrans: 1})
	op := &bindConnToSessionOp{args: bindConnToSession4args{sessionid: s.id, dir: dir, useConnInRdmaMode: rdma}}
	err := c.simpleOn(ctx, rpc, op)
	c.trace("BIND_CONN_TO_SESSION connection %d dir=%d rdma=%v: reply dir=%d rdma=%v: %v",
		i, dir, rdma, op.res.dir, op.res.useConnInRdmaMode, err)
	if dir == cdfc4Fore && errors.Is(err, ErrInval) {
		// RFC 8881 s18.34.3, last paragraph: a connection already
		// bound to the session in both directions cannot be narrowed
		// to the fore channel (NFS4ERR_INVAL). After a recovery it is
		// the one that carried CREATE_SESSION, which bound it
		// (s18.36.3): bound as wanted, and then some.
		return nil
	}
	if err != nil {
		return fmt.Errorf("BIND_CONN_TO_SESSION on connection %d: %w", i, err)
	}
	if op.res.sessionid != s.id {
		return fmt.Errorf("%w: BIND_CONN_TO_SESSION reply names another session", ErrProtocol)
	}
	return nil
}
