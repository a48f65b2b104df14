package rpcrdma

import (
	"context"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// TestSendsReapedWithoutPoller: no goroutine waits for Send completions
// (reapSendsLocked takes them when the next Send is posted and when a
// reply comes), yet sequential calls leave at most the last batch of the
// provider's transmit side unreaped, however many calls went before, and
// closing the transport gives every send buffer back to the pool.
func TestSendsReapedWithoutPoller(t *testing.T) {
	env := newEnv(t, Version1, ResponderConfig{}, Config{})
	// A transport of the test's own, closed by the test.
	tr := NewTransport(env.resp.Addr(), Config{Provider: &iwarp.Provider{}})
	defer tr.Close()
	own := &testEnv{resp: env.resp, tr: tr, clnt: oncrpc.NewClient(tr, echoProg, 1, oncrpc.ClientOptions{})}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 300 {
		if err := own.echo(ctx, pattern(100+i), nil); err != nil {
			t.Fatal(err)
		}
	}
	tr.mu.Lock()
	c := tr.conn
	tr.mu.Unlock()
	c.mu.Lock()
	// The provider completes Sends in order, so with one call at a
	// time at most the last call's Send and the one before it (a
	// transmit batch the provider has written and not yet completed)
	// can be unreaped.
	unreaped := len(c.sends)
	c.mu.Unlock()
	if unreaped > 2 {
		t.Errorf("after 300 sequential calls %d Sends are not reaped, want at most 2", unreaped)
	}
	tr.Close()
	if m := tr.Stats().Memory; m.BytesInUse != 0 {
		t.Errorf("transport closed: %d bytes of its pool still in use (send or receive buffers not given back)", m.BytesInUse)
	}
}
