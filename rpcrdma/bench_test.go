package rpcrdma

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/oncrpc/oncrpctest"
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
	buf func(b *testing.B, n int) dataBuf
}

// dataBuf is a data buffer: ordinary memory, or registered memory lent
// by a transport (mrcache.Buffer), for the calls to name.
type dataBuf = oncrpc.View

func heapBuf(_ *testing.B, n int) dataBuf { return oncrpc.Plain(make([]byte, n)) }

func slabBuf(t *Transport) func(b *testing.B, n int) dataBuf {
	return func(b *testing.B, n int) dataBuf {
		buf, err := t.Buffers().Get(n)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { buf.Release() })
		return oncrpc.Lent(buf)
	}
}

func benchTransports(b *testing.B) map[string]benchTransport {
	rdmaAddr, tcpAddr := benchPeers(b)
	rtr := NewTransport(rdmaAddr, Config{Provider: &iwarp.Provider{}})
	// The same over a provider that hides its receive handler: the
	// requester polls its receive CQ (BenchmarkRatioReceive).
	ptr := NewTransport(rdmaAddr, Config{Provider: pollingProvider{&iwarp.Provider{}}})
	ttr := oncrpc.NewTCPTransport(tcpAddr, oncrpc.TCPOptions{})
	b.Cleanup(func() {
		rtr.Close()
		ptr.Close()
		ttr.Close()
	})
	return map[string]benchTransport{
		"rdma": {clnt: oncrpc.NewClient(rtr, echoProg, 1, oncrpc.ClientOptions{}), buf: slabBuf(rtr)},
		"tcp":  {clnt: oncrpc.NewClient(ttr, echoProg, 1, oncrpc.ClientOptions{}), buf: heapBuf},
		// Only for BenchmarkRatioReceive (not in the sub-benchmarks).
		"rdma-poll": {clnt: oncrpc.NewClient(ptr, echoProg, 1, oncrpc.ClientOptions{}), buf: slabBuf(ptr)},
	}
}

// benchPeerEnv set to "process" runs the benchmarks' servers in a child
// process (this test binary again, TestBenchPeerProcess), so that the
// benchmark process's CPU time is the clients' alone (the cpu-s/GiB
// metrics of BenchmarkRatio1MiB):
//
//	RPCRDMA_BENCH_PEER=process go test -run '^$' -bench Ratio1MiB ./rpcrdma
const benchPeerEnv = "RPCRDMA_BENCH_PEER"

// benchPeers starts the echo servers the benchmarks compare, RPC-over-RDMA
// and TCP, in this process or in a child, and returns their addresses.
func benchPeers(b *testing.B) (rdmaAddr, tcpAddr string) {
	if os.Getenv(benchPeerEnv) != "process" {
		rdmaAddr, tcpAddr, stop, err := startBenchServers()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(stop)
		return rdmaAddr, tcpAddr
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestBenchPeerProcess$")
	cmd.Env = append(os.Environ(), benchPeerEnv+"=child")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close() // the child's signal to stop
		_ = cmd.Wait()
	})
	if _, err := fmt.Fscanln(stdout, &rdmaAddr, &tcpAddr); err != nil {
		b.Fatalf("bench peer process: %v", err)
	}
	return rdmaAddr, tcpAddr
}

// TestBenchPeerProcess is the child process of benchPeers: it serves
// until its standard input closes.
func TestBenchPeerProcess(t *testing.T) {
	if os.Getenv(benchPeerEnv) != "child" {
		t.Skip("the benchmarks' server process (" + benchPeerEnv + "=process)")
	}
	rdmaAddr, tcpAddr, stop, err := startBenchServers()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	fmt.Println(rdmaAddr, tcpAddr)
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// startBenchServers starts the echo program's servers over RPC-over-RDMA
// (iWARP provider) and over TCP.
func startBenchServers() (rdmaAddr, tcpAddr string, stop func(), err error) {
	// Both servers recycle their reply buffers, the responder's in its
	// registered memory: the benchmarks measure the transports, not the
	// garbage of a handler allocating 1 MiB per READ.
	rbufs := &replyBufs{}
	resp, err := Listen("127.0.0.1:0", ResponderConfig{Provider: &iwarp.Provider{}, Handler: echoHandler{bufs: rbufs}, ReplyBulk: echoReplyBulk, Credits: 64})
	if err != nil {
		return "", "", nil, err
	}
	rbufs.pool = resp.Buffers()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		resp.Close()
		return "", "", nil, err
	}
	go oncrpctest.Serve(ln, echoHandler{bufs: &replyBufs{}})
	return resp.Addr(), ln.Addr().String(), func() {
		resp.Close()
		ln.Close()
	}, nil
}

// sink sends data like an NFS WRITE: the data is the DDP-eligible Bulk.
func sink(ctx context.Context, c *oncrpc.Client, e *xdr.Encoder, buf dataBuf) error {
	data := buf.Bytes()
	e.Reset(e.Bytes())
	xid := c.StartCall(e, procSink, oncrpc.AuthNone)
	e.Uint32(uint32(len(data)))
	rep, err := c.Do(ctx, &oncrpc.Call{XID: xid, Head: e.Bytes(), Bulk: buf, MaxReplySize: 64})
	if err != nil {
		return err
	}
	rep.Release()
	return nil
}

// source reads len(dest) bytes like an NFS READ: into dest, placed by a
// Write chunk over RDMA, copied from the reply over TCP.
func source(ctx context.Context, c *oncrpc.Client, e *xdr.Encoder, buf dataBuf) error {
	dest := buf.Bytes()
	e.Reset(e.Bytes())
	xid := c.StartCall(e, procSource, oncrpc.AuthNone)
	e.Uint32(uint32(len(dest)))
	rep, err := c.Do(ctx, &oncrpc.Call{XID: xid, Head: e.Bytes(), ReplyBulk: buf, MaxReplySize: 64})
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
			copy(data.Bytes(), pattern(1<<20))
			var e xdr.Encoder
			b.SetBytes(int64(len(data.Bytes())))
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
			b.SetBytes(int64(len(dest.Bytes())))
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
			b.SetBytes(int64(len(dest.Bytes())))
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
// It also reports the CPU time (user and system) the process spent per
// GiB moved over each transport and the voluntary context switches per
// call: getrusage around each call, which runs alone (calls are
// sequential), so the goroutines it wakes are counted too. With the servers in this process that is the client's
// and the server's; with RPCRDMA_BENCH_PEER=process, the client's alone.
//
//	go test -run '^$' -bench Ratio1MiB ./rpcrdma
func BenchmarkRatio1MiB(b *testing.B) {
	bts := benchTransports(b)
	for _, dir := range []string{"write", "read"} {
		b.Run(dir, func(b *testing.B) {
			trs := [2]benchTransport{bts["rdma"], bts["tcp"]}
			var bufs [2]dataBuf
			for i, bt := range trs {
				bufs[i] = bt.buf(b, 1<<20)
				copy(bufs[i].Bytes(), pattern(1<<20))
			}
			var e xdr.Encoder
			var spent, cpu [2]time.Duration
			var csw [2]int64
			calls := 0
			b.SetBytes(2 << 20)
			for i := 0; b.Loop(); i++ {
				for k := range 2 {
					j := (i + k) % 2
					cpu0, csw0 := usage(b)
					start := time.Now()
					var err error
					if dir == "write" {
						err = sink(b.Context(), trs[j].clnt, &e, bufs[j])
					} else {
						err = source(b.Context(), trs[j].clnt, &e, bufs[j])
					}
					spent[j] += time.Since(start)
					cpu1, csw1 := usage(b)
					cpu[j] += cpu1 - cpu0
					csw[j] += csw1 - csw0
					if err != nil {
						b.Fatal(err)
					}
				}
				calls++
			}
			b.ReportMetric(float64(spent[1])/float64(spent[0]), "rdma/tcp")
			gib := float64(calls) * (1 << 20) / (1 << 30)
			b.ReportMetric(cpu[0].Seconds()/gib, "rdma-cpu-s/GiB")
			b.ReportMetric(cpu[1].Seconds()/gib, "tcp-cpu-s/GiB")
			b.ReportMetric(float64(csw[0])/float64(calls), "rdma-csw/op")
			b.ReportMetric(float64(csw[1])/float64(calls), "tcp-csw/op")
		})
	}
}

// usage returns the user and system CPU time the process has used and
// the voluntary context switches its threads made (a thread that sleeps
// for lack of work: a wake-up that crossed threads).
func usage(b *testing.B) (time.Duration, int64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Nvcsw
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
			var bufs [3]dataBuf
			for i, bt := range trs {
				bufs[i] = bt.buf(b, tc.size)
				copy(bufs[i].Bytes(), pattern(tc.size))
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
