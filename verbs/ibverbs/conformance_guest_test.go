//go:build guestrdma

package ibverbs_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/ibverbs"
	"github.com/rdmafs/rdmafs/verbs/verbstest"
)

// deviceCaps states where the rdma-core provider on p's device differs
// from the API's reference behaviour, and why.
func deviceCaps(p *ibverbs.Provider) verbstest.Caps {
	n := p.MaxSGE()
	c := verbstest.Caps{SendSGEs: n, RecvSGEs: n, ReadSinkSGEs: p.MaxReadSGE(),
		ReadRefused: verbs.StatusRemoteAccessErr, RecvTooLong: verbs.StatusLocalLengthErr}
	if p.Device().IWARP() {
		// Kernel iWARP (siw): Writes and Sends complete when sent
		// (RFC 5040), a Terminate follows; any STag of the protection
		// domain can be invalidated remotely, but libsiw does not
		// report the invalidation in the completion. A refused Read is
		// flushed when the Terminate moves the queue pair to the error
		// state, and siw serves Reads of regions without the remote
		// read right (see verbstest.Caps).
		c.RemoteInvalidate = true
		c.WriteRefused = verbs.StatusSuccess
		c.SendRefused = verbs.StatusSuccess
		c.ReadRefused = verbs.StatusFlushed
		c.ReadRightUnchecked = true
		c.InvalidationUnreported = true
		return c
	}
	// RoCE and InfiniBand: the responder NAKs a refused Write or Send;
	// the CM pads private data; ibv_reg_mr regions cannot be
	// invalidated remotely.
	if p.Device().Name[:3] == "rxe" {
		// rxe completes an overlong receive with IBV_WC_LOC_QP_OP_ERR.
		c.RecvTooLong = verbs.StatusRemoteOpErr
	}
	// Type-2 memory windows (rxe, mlx5) can be invalidated by the
	// peer's Send With Invalidate on the queue pair they are bound on.
	c.WindowInvalidate = p.MemoryWindows()
	c.WriteRefused = verbs.StatusRemoteAccessErr
	c.SendRefused = verbs.StatusRemoteOpErr
	c.SendInvRefused = verbs.StatusRemoteOpErr
	c.PaddedPrivateData = true
	return c
}

// guestDevice opens the device RDMAFS_CONFORMANCE_DEV, closed when the
// test ends, and returns it, its name and RDMAFS_CONFORMANCE_ADDR.
func guestDevice(t *testing.T) (p *ibverbs.Provider, dev, addr string) {
	dev, addr = os.Getenv("RDMAFS_CONFORMANCE_DEV"), os.Getenv("RDMAFS_CONFORMANCE_ADDR")
	if dev == "" || addr == "" {
		t.Fatal("set RDMAFS_CONFORMANCE_DEV and RDMAFS_CONFORMANCE_ADDR; TestKnfsdGuestRxeSiw (make test-guest-rdma) runs this inside the knfsd guest")
	}
	p, err := ibverbs.Open(dev)
	if err != nil {
		t.Fatalf("open %s: %v", dev, err)
	}
	t.Cleanup(func() { p.Close() })
	return p, dev, addr
}

// TestGuestConformance runs the verbs conformance suite (package
// verbstest, the same tests the pure-Go provider passes) against the
// rdma-core provider on the device RDMAFS_CONFORMANCE_DEV, listening on
// RDMAFS_CONFORMANCE_ADDR. TestKnfsdGuestRxeSiw runs it inside the knfsd
// guest over siw0 and rxe0; on its own it fails, as there is no device to
// test.
func TestGuestConformance(t *testing.T) {
	p, _, addr := guestDevice(t)
	caps := deviceCaps(p)
	t.Logf("%v: %+v", p, caps)
	verbstest.Run(t, verbstest.Target{Provider: p, ListenAddr: addr, Caps: caps})
}

// TestGuestWriteExchange measures the message pattern of an RPC-over-RDMA
// WRITE of 1 MiB (verbstest.WriteExchange) over the device
// RDMAFS_CONFORMANCE_DEV against TCP on the same address: the kernel's
// own software RNICs against the kernel's TCP, where the pure-Go provider
// has BenchmarkWriteExchange1MiB in verbs/iwarp. TestKnfsdGuestRxeSiw
// runs it inside the knfsd guest and reports the figures.
func TestGuestWriteExchange(t *testing.T) {
	p, dev, addr := guestDevice(t)
	r := verbstest.WriteExchange(t, verbstest.Target{Provider: p, ListenAddr: addr}, 1<<20, 5, 20)
	if !(r.RDMAOverTCP > 0 && r.PullOverTCP > 0 && r.RDMAOverPull > 0) {
		t.Fatalf("no figures: %v", r)
	}
	fmt.Printf("EXCHANGE %s 1MiB %v\n", dev, r)
}
