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
