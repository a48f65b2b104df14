package oncrpc

import (
	"context"
	"encoding/binary"
	"time"
)

// Relay returns a handler that forwards each call it is given over tr,
// XID unchanged, and returns the server's reply. With an RPC-over-RDMA
// responder in front it turns a TCP server into an RDMA one ("rdmafs
// relay", and tests that need a peer whose faults they control). A call
// that gets no reply within timeout is dropped (the caller retransmits).
//
// As a ViewHandler it lends the reply where the transport received it,
// so a server that knows ViewHandler sends it without the copy HandleCall
// makes; the transport's buffer goes back with ReleaseView.
func Relay(tr Transport, timeout time.Duration) ViewHandler {
	return relay{tr: tr, timeout: timeout}
}

type relay struct {
	tr      Transport
	timeout time.Duration
}

// relayedReply is a server's reply as the transport received it, lent
// to the relay's caller until ReleaseView.
type relayedReply struct{ rep *Reply }

func (r *relayedReply) Bytes() []byte { return r.rep.Msg }

func (r relay) roundTrip(msg []byte) *Reply {
	if len(msg) < 4 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	rep, err := r.tr.RoundTrip(ctx, &Call{XID: binary.BigEndian.Uint32(msg), Head: msg})
	if err != nil {
		return nil
	}
	return rep
}

// HandleCall returns a copy of the reply.
func (r relay) HandleCall(msg []byte) []byte {
	rep := r.roundTrip(msg)
	if rep == nil {
		return nil
	}
	defer rep.Release()
	return append([]byte(nil), rep.Msg...)
}

// HandleCallView returns the reply in the transport's buffer; the zero
// View when there is none.
func (r relay) HandleCallView(msg []byte) View {
	rep := r.roundTrip(msg)
	if rep == nil {
		return View{}
	}
	return Lent(&relayedReply{rep: rep})
}

// ReleaseView gives a reply HandleCallView returned back to the
// transport.
func (r relay) ReleaseView(reply View) {
	if owner, _ := reply.Owner(); owner != nil {
		if rr, ok := owner.(*relayedReply); ok {
			rr.rep.Release()
		}
	}
}
