package rpcrdma

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// The data-path benchmarks run the same echo program over RPC-over-RDMA
// (iWARP provider, loopback) and over TCP (oncrpc.Serve, loopback), so
// their figures compare the transports in one run:
//
//	go test -run '^$' -bench . -benchmem ./rpcrdma

type benchTransport struct {
	clnt *oncrpc.Client
	// buf returns a data buffer as the data path keeps it: registered
	// memory of the transport over RDMA, ordinary memory over TCP.
	buf func(b *testing.B, n int) []byte
}

func heapBuf(_ *testing.B, n int) []byte { return make([]byte, n) }

func slabBuf(t *Transport) func(b *testing.B, n int) []byte {
	return func(b *testing.B, n int) []byte {
		buf, err := t.Buffers().Get(n)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { t.Buffers().Put(buf) })
		return buf
	}
}

func benchTransports(b *testing.B) map[string]benchTransport {
	// Both servers recycle their reply buffers, the responder's in its
	// registered memory: the benchmarks measure the transports, not the
	// garbage of a handler allocating 1 MiB per READ.
	rbufs := &replyBufs{}
	resp, err := Listen("127.0.0.1:0", ResponderConfig{Provider: &iwarp.Provider{}, Handler: echoHandler{bufs: rbufs}, ReplyBulk: echoReplyBulk, Credits: 64})
	if err != nil {
		b.Fatal(err)
	}
	rbufs.pool = resp.Buffers()
	rtr := NewTransport(resp.Addr(), Config{Provider: &iwarp.Provider{}})
	// The same over a provider that hides its receive handler: the
	// requester polls its receive CQ (BenchmarkRatioReceive).
	ptr := NewTransport(resp.Addr(), Config{Provider: pollingProvider{&iwarp.Provider{}}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go oncrpc.Serve(ln, echoHandler{bufs: &replyBufs{}})
	ttr := oncrpc.NewTCPTransport(ln.Addr().String(), oncrpc.TCPOptions{})
	b.Cleanup(func() {
		rtr.Close()
		ptr.Close()
		resp.Close()
		ttr.Close()
		ln.Close()
	})
	return map[string]benchTransport{
		"rdma": {clnt: oncrpc.NewClient(rtr, echoProg, 1, oncrpc.ClientOptions{}), buf: slabBuf(rtr)},
		"tcp":  {clnt: oncrpc.NewClient(ttr, echoProg, 1, oncrpc.ClientOptions{}), buf: heapBuf},
		// Only for BenchmarkRatioReceive (not in the sub-benchmarks).
		"rdma-poll": {clnt: oncrpc.NewClient(ptr, echoProg, 1, oncrpc.ClientOptions{}), buf: slabBuf(ptr)},
	}
}

// sink sends data like an NFS WRITE: the data is the DDP-eligible Bulk.
func sink(ctx context.Context, c *oncrpc.Client, e *xdr.Encoder, data []byte) error {
	e.Reset(e.Bytes())
	xid := c.StartCall(e, procSink, oncrpc.AuthNone)
	e.Uint32(uint32(len(data)))
	rep, err := c.Do(ctx, &oncrpc.Call{XID: xid, Head: e.Bytes(), Bulk: data, MaxReplySize: 64})
	if err != nil {
		return err
	}
	rep.Release()
	return nil
}

// source reads len(dest) bytes like an NFS READ: into dest, placed by a
// Write chunk over RDMA, copied from the reply over TCP.
func source(ctx context.Context, c *oncrpc.Client, e *xdr.Encoder, dest []byte) error {
	e.Reset(e.Bytes())
	xid := c.StartCall(e, procSource, oncrpc.AuthNone)
	e.Uint32(uint32(len(dest)))
	rep, err := c.Do(ctx, &oncrpc.Call{XID: xid, Head: e.Bytes(), ReplyBulk: dest, MaxReplySize: 64})
	if err != nil {
		return err
	}
	defer rep.Release()
	d := xdr.NewDecoder(rep.Results)
	if rep.BulkPlaced {
		if n := d.Uint32(); int(n) != len(dest) {
			return fmt.Errorf("placed %d bytes", n)
		}
		return nil
	}
	data := d.Opaque(len(dest))
	if len(data) != len(dest) {
		return fmt.Errorf("got %d bytes: %v", len(data), d.Err())
	}
	copy(dest, data)
	return nil
}

func BenchmarkWrite1MiB(b *testing.B) {
	for name, bt := range benchTransports(b) {
		if name == "rdma-poll" {
			continue
		}
		b.Run(name, func(b *testing.B) {
			data := bt.buf(b, 1<<20)
			copy(data, pattern(1<<20))
			var e xdr.Encoder
			b.SetBytes(int64(len(data)))
			b.ResetTimer()
			for b.Loop() {
				if err := sink(b.Context(), bt.clnt, &e, data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkRead1MiB(b *testing.B) {
	for name, bt := range benchTransports(b) {
		if name == "rdma-poll" {
			continue
		}
		b.Run(name, func(b *testing.B) {
			dest := bt.buf(b, 1<<20)
			var e xdr.Encoder
			b.SetBytes(int64(len(dest)))
			b.ResetTimer()
			for b.Loop() {
				if err := source(b.Context(), bt.clnt, &e, dest); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRead4KiB measures small READ round trips, one at a time.
func BenchmarkRead4KiB(b *testing.B) {
	for name, bt := range benchTransports(b) {
		if name == "rdma-poll" {
			continue
		}
		b.Run(name, func(b *testing.B) {
			dest := bt.buf(b, 4096)
			var e xdr.Encoder
			b.SetBytes(int64(len(dest)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := source(b.Context(), bt.clnt, &e, dest); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRatio1MiB alternates 1 MiB calls over RDMA and over TCP, one of
// each per iteration (in turns, which goes first), and reports rdma/tcp,
// the ratio of their throughputs: on a loaded machine the sub-benchmarks
// above, which run one after the other, see different loads.
//
//	go test -run '^$' -bench Ratio1MiB ./rpcrdma
func BenchmarkRatio1MiB(b *testing.B) {
	bts := benchTransports(b)
	for _, dir := range []string{"write", "read"} {
		b.Run(dir, func(b *testing.B) {
			trs := [2]benchTransport{bts["rdma"], bts["tcp"]}
			var bufs [2][]byte
			for i, bt := range trs {
				bufs[i] = bt.buf(b, 1<<20)
				copy(bufs[i], pattern(1<<20))
			}
			var e xdr.Encoder
			var spent [2]time.Duration
			b.SetBytes(2 << 20)
			for i := 0; b.Loop(); i++ {
				for k := range 2 {
					j := (i + k) % 2
					start := time.Now()
					var err error
					if dir == "write" {
						err = sink(b.Context(), trs[j].clnt, &e, bufs[j])
					} else {
						err = source(b.Context(), trs[j].clnt, &e, bufs[j])
					}
					spent[j] += time.Since(start)
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(spent[1])/float64(spent[0]), "rdma/tcp")
		})
	}
}

// BenchmarkRatioReceive alternates calls over RDMA with replies taken in
// the provider's receiving goroutine (receive handler), over RDMA with
// the receive CQ polled (the fallback), and over TCP, one of each per
// iteration in turns, and reports each RDMA variant's throughput over
// TCP's (as BenchmarkRatio1MiB): 4 KiB and 1 MiB READs, 1 MiB WRITEs.
//
//	go test -run '^$' -bench RatioReceive ./rpcrdma
func BenchmarkRatioReceive(b *testing.B) {
	bts := benchTransports(b)
	for _, tc := range []struct {
		name string
		size int
	}{{"read4KiB", 4 << 10}, {"read1MiB", 1 << 20}, {"write1MiB", 1 << 20}} {
		b.Run(tc.name, func(b *testing.B) {
			trs := [3]benchTransport{bts["tcp"], bts["rdma"], bts["rdma-poll"]}
			var bufs [3][]byte
			for i, bt := range trs {
				bufs[i] = bt.buf(b, tc.size)
				copy(bufs[i], pattern(tc.size))
			}
			var e xdr.Encoder
			var spent [3]time.Duration
			b.SetBytes(int64(3 * tc.size))
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				for k := range 3 {
					j := (i + k) % 3
					start := time.Now()
					var err error
					if tc.name == "write1MiB" {
						err = sink(b.Context(), trs[j].clnt, &e, bufs[j])
					} else {
						err = source(b.Context(), trs[j].clnt, &e, bufs[j])
					}
					spent[j] += time.Since(start)
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(spent[0])/float64(spent[1]), "handler/tcp")
			b.ReportMetric(float64(spent[0])/float64(spent[2]), "poll/tcp")
		})
	}
}
