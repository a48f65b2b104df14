package iwarp

import (
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

// BenchmarkReadvPerMiB reports the receive side's readv system calls per
// MiB received as 1 MiB RDMA Reads (Read Responses) and 1 MiB RDMA Writes,
// one at a time between two queue pairs on loopback: about one per FPDU
// (64 KiB). Speculative runs of several FPDUs per readv took Reads to 6-10
// per MiB but saved no time or CPU over raw readv calls (they were
// dropped; see rxsocket_test.go).
//
//	go test -run '^$' -bench ReadvPerMiB ./verbs/iwarp
func BenchmarkReadvPerMiB(b *testing.B) {
	for _, op := range []verbs.Opcode{verbs.OpRDMARead, verbs.OpRDMAWrite} {
		b.Run(op.String(), func(b *testing.B) {
			c, s := pair(b, nil, nil)
			remote := reg(b, s.PD(), randBytes(1<<20, 2), verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
			local := reg(b, c.PD(), randBytes(1<<20, 3), verbs.AccessLocalWrite)
			wr := verbs.SendWR{Opcode: op, SGL: []verbs.SGE{{MR: local, Length: 1 << 20}}, Length: 1 << 20, RemoteSTag: remote.STag()}
			// A zero-length Read after a Write completes after the
			// Write is placed (RFC 5040 s5.5).
			fence := verbs.SendWR{Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{{MR: local, Length: 0}}, RemoteSTag: remote.STag()}
			b.SetBytes(1 << 20)
			calls := readvCalls.Load()
			for b.Loop() {
				if err := c.PostSend(wr); err != nil {
					b.Fatal(err)
				}
				if op == verbs.OpRDMAWrite {
					if err := c.PostSend(fence); err != nil {
						b.Fatal(err)
					}
					pollOne(b, c.SendCQ())
				}
				if wc := pollOne(b, c.SendCQ()); wc.Status != verbs.StatusSuccess {
					b.Fatalf("completion %+v", wc)
				}
			}
			b.ReportMetric(float64(readvCalls.Load()-calls)/float64(b.N), "readv/MiB")
		})
	}
}
