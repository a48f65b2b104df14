package rpcrdma

import (
	"context"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/test/testpeer"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
	"os"
)

func TestMain(m *testing.M) { testpeer.Main(m) }

func TestKnfsdNull(t *testing.T) {
	k := testpeer.RequireKnfsd(t)
	tr := NewTransport(k.RDMAAddr, Config{Provider: &iwarp.Provider{}, Tracer: trace.New(os.Stderr, trace.RDMA)})
	defer tr.Close()
	c := oncrpc.NewClient(tr, 100003, 4, oncrpc.ClientOptions{Timeout: 10 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 3 {
		if err := c.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%+v", tr.Stats())
}
