package nfsclient

import (
	"slices"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/test/testpeer"
)

// BenchmarkRatioReadPlusRead reads a 16 MiB file with READ and with
// READ_PLUS, alternating, in one run, and reports the median of the
// READ_PLUS/READ time ratios (readplus/read) for a dense file and for a
// sparse one (1 MiB of data at its start, the rest a hole), on knfsd
// over TCP and over RDMA (nfs-ganesha 4.3's READ_PLUS is broken).
//
//	go test -run XXX -bench RatioReadPlusRead ./nfsclient
func BenchmarkRatioReadPlusRead(b *testing.B) {
	for _, name := range []string{"knfsd", "knfsd-rdma"} {
		b.Run(name, func(b *testing.B) {
			k := testpeer.RequireKnfsd(b)
			p := peer{name: name, addr: k.TCPAddr, export: "/", knfsd: k}
			if name == "knfsd-rdma" {
				p.addr, p.rdma = k.RDMAAddr, true
			}
			ctx := b.Context()
			c, err := Dial(ctx, Config{Transport: p.transport(oncrpc.TCPOptions{}), Export: p.export})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close(ctx)
			dirM, err := c.Mkdir(ctx, rootCred, c.RootFH(), "readplus-bench-"+name+"-"+time.Now().Format("150405.000"), &SetAttr{Mode: ptr(uint32(0o777))})
			if err != nil {
				b.Fatal(err)
			}
			const size = 16 << 20
			for _, kind := range []string{"dense", "sparse"} {
				of, err := c.Open(ctx, rootCred, dirM.FH, kind, OpenArgs{Access: ShareAccessBoth, Create: Guarded})
				if err != nil {
					b.Fatal(err)
				}
				data := pattern(size, 5)
				n := size
				if kind == "sparse" {
					n = 1 << 20
				}
				for off := 0; off < n; off += c.WSize() {
					if _, err := c.Write(ctx, rootCred, of.FH, of.StateID, uint64(off), oncrpc.Plain(data[off:min(n, off+c.WSize())]), FileSync); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := c.SetAttr(ctx, rootCred, of.FH, of.StateID, &SetAttr{Size: ptr(uint64(size))}); err != nil {
					b.Fatal(err)
				}
				buf := make([]byte, c.RSize())
				readAllWith := func(plus bool) time.Duration {
					start := time.Now()
					for off := 0; off < size; {
						var m int
						var err error
						if plus {
							m, _, _, err = c.ReadPlus(ctx, rootCred, of.FH, of.StateID, uint64(off), buf)
						} else {
							m, _, err = c.Read(ctx, rootCred, of.FH, of.StateID, uint64(off), oncrpc.Plain(buf))
						}
						if err != nil || m == 0 {
							b.Fatalf("read at %d: %d, %v", off, m, err)
						}
						off += m
					}
					return time.Since(start)
				}
				var ratios []float64
				for i := 0; i < max(b.N, 5); i++ {
					r := readAllWith(false)
					rp := readAllWith(true)
					ratios = append(ratios, float64(rp)/float64(r))
				}
				slices.Sort(ratios)
				b.ReportMetric(ratios[len(ratios)/2], kind+"-readplus/read")
				c.CloseFile(ctx, rootCred, of)
			}
		})
	}
}
