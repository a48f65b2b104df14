package rpcrdma

import (
	"context"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// TestResponderRecvFollowsGrant: a connection that has sent nothing
// holds the receive buffers of one credit only (RFC 8166 s3.3.3); its
// first call has those of the whole grant posted before the reply that
// grants it goes out.
func TestResponderRecvFollowsGrant(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const credits = 32
	resp, err := Listen("127.0.0.1:0", ResponderConfig{Provider: &iwarp.Provider{}, Handler: echoHandler{}, Credits: credits})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Close()
	r := dialRaw(t, ctx, resp.Addr(), 8)
	idle := waitSettled(t, ctx, resp, 1)
	if want := int64(recvCount(1)) * 4096; idle > want {
		t.Fatalf("a connection that sent nothing holds %d bytes of receive buffers; one credit's are %d", idle, want)
	}
	if g := r.firstCall(ctx); g != credits {
		t.Fatalf("the first reply grants %d credits, want %d", g, credits)
	}
	busy := waitSettled(t, ctx, resp, idle+1)
	if want := int64(recvCount(credits)) * 4096; busy < want {
		t.Fatalf("after the first call the connection holds %d bytes of receive buffers; a grant of %d needs %d", busy, credits, want)
	}
}
