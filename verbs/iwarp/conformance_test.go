package iwarp_test

import (
	"testing"

	"github.com/rdmafs/rdmafs/verbs/iwarp"
	"github.com/rdmafs/rdmafs/verbs/verbstest"
)

// TestConformance runs the verbs conformance suite against the pure-Go
// iWARP provider over loopback TCP. The rdma-core provider runs the same
// suite over rxe and siw inside the knfsd guest (verbs/ibverbs, make
// test-guest-rdma).
func TestConformance(t *testing.T) {
	verbstest.Run(t, verbstest.Target{Provider: &iwarp.Provider{}, ListenAddr: "127.0.0.1:0", Caps: verbstest.IWARPCaps})
}

// BenchmarkWriteExchange1MiB is verbstest.WriteExchange over this
// provider: the same code TestKnfsdGuestRxeSiw (verbs/ibverbs) runs over
// the kernel's siw and rxe inside the knfsd guest, so the figures compare
// software RNICs. The requester polls its completion queue here, where
// BenchmarkRatioWriteExchange1MiB uses a receive handler as rpcrdma does.
//
//	go test -run '^$' -bench '^BenchmarkWriteExchange1MiB$' -benchtime 40x -count 7 ./verbs/iwarp
func BenchmarkWriteExchange1MiB(b *testing.B) {
	r := verbstest.WriteExchange(b, verbstest.Target{Provider: &iwarp.Provider{}, ListenAddr: "127.0.0.1:0"}, 1<<20, 5, b.N)
	b.ReportMetric(r.RDMAOverTCP, "rdma/tcp")
	b.ReportMetric(r.PullOverTCP, "pull/tcp")
	b.ReportMetric(r.RDMAOverPull, "rdma/pull")
}
