package rpcrdma

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
	"github.com/rdmafs/rdmafs/verbs/verbstest"
)

// BenchmarkRatioWriteLayers1MiB puts the RPC layers of a 1 MiB WRITE
// next to the bare message exchanges beneath them, five kinds of calls in
// one loop (one of each per iteration, in a random order):
//
//   - rdma: a WRITE through rpcrdma (Read chunk, RFC 8166 s3.4.5);
//   - tcp: the same WRITE through oncrpc over TCP;
//   - exch: the WRITE's messages straight on the same provider, no RPC
//     code (verbstest.RDMAExchange: Send, RDMA Read of 1 MiB, Send back);
//   - push: TCP's messages straight on a socket (the call and the data in
//     one write, the reply back);
//   - pull: exch's four messages straight on a socket (the call, a Read
//     Request's bytes back, the data, the reply).
//
// It reports, all as throughput ratios of total times: rdma/tcp
// (BenchmarkRatio1MiB's figure); exch/push, what the bare exchange
// allows; pull/push, what the pull's round trip costs without a
// provider; exch/pull, the provider against plain socket calls; and
// rdma/exch and tcp/push, the share of the bare exchange's speed each
// transport's RPC code keeps (1 would be free). rdma/tcp is exch/push
// times rdma/exch over tcp/push.
//
//	go test -run '^$' -bench RatioWriteLayers1MiB -count 5 ./rpcrdma
func BenchmarkRatioWriteLayers1MiB(b *testing.B) {
	const size = 1 << 20
	bts := benchTransports(b)
	rdma, tcp := bts["rdma"], bts["tcp"]
	rdmaData, tcpData := rdma.buf(b, size), tcp.buf(b, size)
	copy(rdmaData.Bytes(), pattern(size))
	copy(tcpData.Bytes(), pattern(size))
	var e xdr.Encoder
	ops := [...]func() error{
		func() error { return sink(b.Context(), rdma.clnt, &e, rdmaData) },
		func() error { return sink(b.Context(), tcp.clnt, &e, tcpData) },
		verbstest.RDMAExchange(b, verbstest.Target{Provider: &iwarp.Provider{}, ListenAddr: "127.0.0.1:0"}, size),
		verbstest.TCPExchange(b, "127.0.0.1", size, false),
		verbstest.TCPExchange(b, "127.0.0.1", size, true),
	}
	var spent [len(ops)]time.Duration
	b.SetBytes(int64(len(ops) * size))
	// Each iteration runs the kinds in a random order: the work a call
	// leaves behind (a responder reposting its receive, a server
	// goroutine going back to sleep) is paid by the call after it, and
	// in a fixed rotation each kind would mostly follow the same other.
	rng := rand.New(rand.NewPCG(1, 2))
	order := make([]int, len(ops))
	for i := range order {
		order[i] = i
	}
	for b.Loop() {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, j := range order {
			start := time.Now()
			if err := ops[j](); err != nil {
				b.Fatalf("call kind %d: %v", j, err)
			}
			spent[j] += time.Since(start)
		}
	}
	rdmaT, tcpT, exchT, pushT, pullT := float64(spent[0]), float64(spent[1]), float64(spent[2]), float64(spent[3]), float64(spent[4])
	b.ReportMetric(tcpT/rdmaT, "rdma/tcp")
	b.ReportMetric(pushT/exchT, "exch/push")
	b.ReportMetric(pushT/pullT, "pull/push")
	b.ReportMetric(pullT/exchT, "exch/pull")
	b.ReportMetric(exchT/rdmaT, "rdma/exch")
	b.ReportMetric(pushT/tcpT, "tcp/push")
}
