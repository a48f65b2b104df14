package rpcrdma

import (
	"context"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// pollingProvider hides the receive handler of its queue pairs
// (verbs.RecvHandlerSetter): the transport falls back to polling the receive
// CQ, as with verbs/ibverbs.
type pollingProvider struct{ verbs.Provider }

func (p pollingProvider) Dial(ctx context.Context, addr string, cp *verbs.ConnParams) (verbs.QueuePair, error) {
	qp, err := p.Provider.Dial(ctx, addr, cp)
	if err != nil {
		return nil, err
	}
	return struct{ verbs.QueuePair }{qp}, nil
}

// TestReceivePaths: calls with inline data, a Read chunk and a Write
// chunk (whose invalidation runs on the receive path) work whether
// replies are taken in the provider's receiving goroutine (iwarp's
// receive handler) or by polling the receive CQ, and the transport uses
// the handler where the queue pair offers one.
func TestReceivePaths(t *testing.T) {
	for _, tc := range []struct {
		name      string
		provider  verbs.Provider
		byHandler bool
	}{
		{"handler", &iwarp.Provider{}, true},
		{"polling", pollingProvider{&iwarp.Provider{}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEachVersion(t, func(t *testing.T, v int) {
				env := newEnv(t, v, ResponderConfig{}, Config{})
				env.tr.cfg.Provider = tc.provider
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				for _, n := range []int{16, 3000, 64 << 10} {
					for range 3 {
						if err := env.echo(ctx, pattern(n), make([]byte, n)); err != nil {
							t.Fatalf("echo %d bytes into a Write chunk: %v", n, err)
						}
						if err := env.echo(ctx, pattern(n), nil); err != nil {
							t.Fatalf("echo %d bytes: %v", n, err)
						}
					}
				}
				env.tr.mu.Lock()
				c := env.tr.conn
				env.tr.mu.Unlock()
				if c == nil {
					t.Fatal("no connection")
				}
				if c.byHandler != tc.byHandler {
					t.Fatalf("receive completions by handler: %v, want %v", c.byHandler, tc.byHandler)
				}
				if st := env.tr.Stats(); st.Replies < 18 {
					t.Fatalf("%d replies, want at least 18", st.Replies)
				}
			})
		})
	}
}
