package testpeer

import "testing"

// The test matrix: the servers the integration tests of every package
// run against, each reached one way (a Way), as subtests named after it.
// A package's tests turn a Server into their own peer (mount options,
// transports); which servers there are, where they listen and what they
// offer is said here once.

// Server is one NFS server of the matrix as a test reaches it.
type Server struct {
	Name   string // the subtest's name: "knfsd", "knfsd-rdma", "ganesha", "ganesha-rdma-v2"
	Addr   string // host:port of the listener (TCP, or iWARP over TCP)
	Export string // the path to mount
	RDMA   bool   // reached over RPC-over-RDMA
	V2     bool   // insist on RPC-over-RDMA version 2 (a relay: no public server speaks it)
	Kind   string // "knfsd" or "ganesha": whose limits and behaviour
	Knfsd  *Knfsd // the guest, for knfsd; nil for ganesha
	// Offers names the optional NFSv4.2 operations the server, and the
	// file system it exports, carry out: a test of such an operation
	// runs where it is offered and fails there when it breaks.
	Offers map[string]bool
}

// Optional operations each server offers here: knfsd (Linux 6.1, ext4
// with user_xattr) does COPY, READ_PLUS and the xattr operations of RFC
// 8276; nfs-ganesha's VFS FSAL does neither. Neither file system has
// reflinks, so no server offers CLONE.
var (
	knfsdOffers   = map[string]bool{"ALLOCATE": true, "DEALLOCATE": true, "COPY": true, "SETXATTR": true, "READ_PLUS": true}
	ganeshaOffers = map[string]bool{"ALLOCATE": true, "DEALLOCATE": true}
)

// Way is one server of the matrix and the way to reach it, started on
// first use (Require*).
type Way struct {
	Name    string
	resolve func(t testing.TB) Server
}

// The ways to the servers that need nothing beyond this package.
var (
	KnfsdTCP = Way{"knfsd", func(t testing.TB) Server {
		k := RequireKnfsd(t)
		return Server{Name: "knfsd", Addr: k.TCPAddr, Export: "/", Kind: "knfsd", Knfsd: k, Offers: knfsdOffers}
	}}
	KnfsdRDMA = Way{"knfsd-rdma", func(t testing.TB) Server {
		k := RequireKnfsd(t)
		return Server{Name: "knfsd-rdma", Addr: k.RDMAAddr, Export: "/", RDMA: true, Kind: "knfsd", Knfsd: k, Offers: knfsdOffers}
	}}
	GaneshaTCP = Way{"ganesha", func(t testing.TB) Server {
		g := RequireGanesha(t)
		return Server{Name: "ganesha", Addr: g.Addr, Export: g.Export, Kind: "ganesha", Offers: ganeshaOffers}
	}}
)

// GaneshaRDMAv2 is the way to ganesha over RPC-over-RDMA version 2,
// through the relay whose address relay returns (test/testpeer/v2relay,
// or a package's own where importing it would be a cycle).
func GaneshaRDMAv2(relay func(t testing.TB) string) Way {
	return Way{"ganesha-rdma-v2", func(t testing.TB) Server {
		g := RequireGanesha(t)
		return Server{Name: "ganesha-rdma-v2", Addr: relay(t), Export: g.Export, RDMA: true, V2: true, Kind: "ganesha", Offers: ganeshaOffers}
	}}
}

// Server starts the way's server if needed and returns it.
func (w Way) Server(t testing.TB) Server {
	t.Helper()
	return w.resolve(t)
}

// Each runs f as a subtest named after each way, on its server. A
// subtest that fails on a knfsd guest that has died says so, with the
// guest's console: the test's own errors are then the server's crash.
func Each(t *testing.T, ways []Way, f func(t *testing.T, s Server)) {
	for _, w := range ways {
		t.Run(w.Name, func(t *testing.T) {
			s := w.Server(t)
			if k := s.Knfsd; k != nil {
				t.Cleanup(func() {
					if t.Failed() && !k.Alive() {
						t.Logf("the knfsd guest (run directory %s) died during this test:\n%s", k.RunDir, k.LogTail())
					}
				})
			}
			f(t, s)
		})
	}
}
