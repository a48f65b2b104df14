package oncrpc

import (
	"context"
	"encoding/binary"
	"time"
)

// Relay returns a CallHandler that forwards each call it is given over
// tr, XID unchanged, and returns the server's reply. With an RPC-over-RDMA
// responder in front it turns a TCP server into an RDMA one, for tests
// that need a peer whose faults they control. A call that gets no reply
// within timeout is dropped (the caller retransmits).
func Relay(tr Transport, timeout time.Duration) CallHandler {
	return relay{tr: tr, timeout: timeout}
}

type relay struct {
	tr      Transport
	timeout time.Duration
}

func (r relay) HandleCall(msg []byte) []byte {
	if len(msg) < 4 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	rep, err := r.tr.RoundTrip(ctx, &Call{XID: binary.BigEndian.Uint32(msg), Head: msg})
	if err != nil {
		return nil
	}
	defer rep.Release()
	return append([]byte(nil), rep.Msg...)
}
