package iwarp

import (
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/verbs"
)

const benchWindow = 8 // work requests kept in flight by the throughput benchmarks

// benchPipelined keeps benchWindow work requests in flight.
func benchPipelined(b *testing.B, qp *QP, wr verbs.SendWR) {
	ctx := testCtx(b)
	var wc [benchWindow]verbs.Completion
	inflight := 0
	for i := 0; i < b.N; i++ {
		for inflight == benchWindow {
			k, err := qp.SendCQ().Poll(ctx, wc[:])
			if err != nil {
				b.Fatal(err)
			}
			for _, c := range wc[:k] {
				if c.Status != verbs.StatusSuccess {
					b.Fatalf("completion %+v", c)
				}
			}
			inflight -= k
		}
		wr.WRID = uint64(i)
		if err := qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		inflight++
	}
	pollN(b, qp.SendCQ(), inflight)
}

// BenchmarkRDMAWrite1MiB: 1 MiB RDMA Writes, provider to provider on
// loopback; a zero-length Read at the end waits for the last placement.
func BenchmarkRDMAWrite1MiB(b *testing.B) {
	c, s := pair(b, nil, nil)
	dst, _ := s.PD().RegisterMemory(make([]byte, 1<<20), verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	src := gather(b, c.PD(), randBytes(1<<20, 1))
	sink := reg(b, c.PD(), make([]byte, 1), verbs.AccessLocalWrite)
	b.SetBytes(1 << 20)
	b.ReportAllocs()
	b.ResetTimer()
	benchPipelined(b, c, verbs.SendWR{Opcode: verbs.OpRDMAWrite, SGL: src, RemoteSTag: dst.STag()})
	c.PostSend(verbs.SendWR{Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{{MR: sink}}, RemoteSTag: dst.STag()})
	pollOne(b, c.SendCQ())
}

// BenchmarkRDMARead1MiB: 1 MiB RDMA Reads with ORD 16.
func BenchmarkRDMARead1MiB(b *testing.B) {
	c, s := pair(b, nil, nil)
	src, _ := s.PD().RegisterMemory(randBytes(1<<20, 2), verbs.AccessRemoteRead)
	sink, _ := c.PD().RegisterMemory(make([]byte, 1<<20), verbs.AccessLocalWrite)
	b.SetBytes(1 << 20)
	b.ReportAllocs()
	b.ResetTimer()
	benchPipelined(b, c, verbs.SendWR{Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{{MR: sink, Length: 1 << 20}}, Length: 1 << 20, RemoteSTag: src.STag()})
}

// BenchmarkSendRecv64: 64-byte Send/Recv round trips (ping-pong).
func BenchmarkSendRecv64(b *testing.B) {
	c, s := pair(b, nil, nil)
	ctx := testCtx(b)
	msg := make([]byte, 64)
	// Registered once and reused: the benchmark measures the
	// provider's allocations.
	crecv, err := recvWR(c.PD(), 0, make([]byte, 64))
	if err != nil {
		b.Fatal(err)
	}
	srecv, err := recvWR(s.PD(), 0, make([]byte, 64))
	if err != nil {
		b.Fatal(err)
	}
	c.PostRecv(crecv)
	s.PostRecv(srecv)
	sgl, ssgl := gather(b, c.PD(), msg), gather(b, s.PD(), msg)
	done := make(chan error, 1)
	go func() {
		var wc [4]verbs.Completion
		for range b.N {
			if _, err := s.RecvCQ().Poll(ctx, wc[:1]); err != nil || wc[0].Status != verbs.StatusSuccess {
				done <- err
				return
			}
			s.PostRecv(srecv)
			s.PostSend(verbs.SendWR{Opcode: verbs.OpSend, SGL: ssgl})
			s.SendCQ().TryPoll(wc[:])
		}
		done <- nil
	}()
	var wc [4]verbs.Completion
	b.SetBytes(64)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		c.PostSend(verbs.SendWR{Opcode: verbs.OpSend, SGL: sgl})
		if _, err := c.RecvCQ().Poll(ctx, wc[:1]); err != nil || wc[0].Status != verbs.StatusSuccess {
			b.Fatalf("recv: %v %+v", err, wc[0])
		}
		c.PostRecv(crecv)
		c.SendCQ().TryPoll(wc[:])
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkSendRecv64Handler is BenchmarkSendRecv64 with receive
// handlers (SetRecvHandler): the server echoes from its handler, in the
// goroutine that read the message, and the client's handler wakes the
// goroutine waiting for the reply, as rpcrdma wakes a caller.
func BenchmarkSendRecv64Handler(b *testing.B) {
	trip := pingPong(b, true)
	b.SetBytes(64)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := trip(); err != nil {
			b.Fatal(err)
		}
	}
}

// tcpPair returns both ends of a loopback TCP connection, closed when
// the test or benchmark ends.
func tcpPair(tb testing.TB) (client, server net.Conn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { client.Close() })
	if server = <-ch; server == nil {
		tb.Fatal("loopback accept failed")
	}
	tb.Cleanup(func() { server.Close() })
	return client, server
}

// BenchmarkTCPWrite1MiB is the baseline for BenchmarkRDMAWrite1MiB: 1 MiB
// writes on a plain loopback TCP connection, read by the peer into one
// buffer, with a one-byte acknowledgement at the end.
func BenchmarkTCPWrite1MiB(b *testing.B) {
	c, s := tcpPair(b)
	src := randBytes(1<<20, 1)
	go func() {
		dst := make([]byte, 1<<20)
		for range b.N {
			if _, err := io.ReadFull(s, dst); err != nil {
				return
			}
		}
		s.Write([]byte{1})
	}()
	b.SetBytes(1 << 20)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(src); err != nil {
			b.Fatal(err)
		}
	}
	var ack [1]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		b.Fatal(err)
	}
}

// tcpEcho64 returns one end of a loopback TCP connection whose other end
// a goroutine serves, echoing each 64 bytes back.
func tcpEcho64(b *testing.B) net.Conn {
	c, s := tcpPair(b)
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(s, buf); err != nil {
				return
			}
			if _, err := s.Write(buf); err != nil {
				return
			}
		}
	}()
	return c
}

// BenchmarkTCPPingPong64 is the baseline for BenchmarkSendRecv64: 64-byte
// echo round trips on plain loopback TCP.
func BenchmarkTCPPingPong64(b *testing.B) {
	c := tcpEcho64(b)
	buf := make([]byte, 64)
	b.SetBytes(64)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRatioSendRecv64 alternates 64-byte round trips over TCP,
// over the provider with the completion queues polled (as
// BenchmarkSendRecv64) and with receive handlers (as
// BenchmarkSendRecv64Handler), one of each per iteration in turns, and
// reports each provider variant's time over TCP's: on a loaded machine
// benchmarks run one after the other see different loads.
//
//	go test -run '^$' -bench RatioSendRecv64 ./verbs/iwarp
func BenchmarkRatioSendRecv64(b *testing.B) {
	tc := tcpEcho64(b)
	tbuf := make([]byte, 64)
	tcpTrip := func() error {
		if _, err := tc.Write(tbuf); err != nil {
			return err
		}
		_, err := io.ReadFull(tc, tbuf)
		return err
	}
	pollTrip := pingPong(b, false)
	handlerTrip := pingPong(b, true)
	trips := [3]func() error{tcpTrip, pollTrip, handlerTrip}
	var spent [3]time.Duration
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for k := range trips {
			j := (i + k) % len(trips)
			start := time.Now()
			err := trips[j]()
			spent[j] += time.Since(start)
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "poll/tcp")
	b.ReportMetric(float64(spent[2])/float64(spent[0]), "handler/tcp")
}

// pingPong sets up a queue pair pair whose server echoes 64-byte Sends and
// returns a function making one round trip: with handler set, both sides
// take receive completions by receive handler (the server echoes from it),
// else by polling the receive CQ (the server in a goroutine of its own).
func pingPong(b *testing.B, handler bool) func() error {
	ctx := testCtx(b)
	c, s := pair(b, nil, nil)
	crecv, err := recvWR(c.PD(), 0, make([]byte, 64))
	if err != nil {
		b.Fatal(err)
	}
	srecv, err := recvWR(s.PD(), 0, make([]byte, 64))
	if err != nil {
		b.Fatal(err)
	}
	c.PostRecv(crecv)
	s.PostRecv(srecv)
	sgl, ssgl := gather(b, c.PD(), make([]byte, 64)), gather(b, s.PD(), make([]byte, 64))
	var swc [4]verbs.Completion
	echo := func(wc verbs.Completion) bool {
		if wc.Status != verbs.StatusSuccess {
			return false
		}
		s.PostRecv(srecv)
		s.PostSend(verbs.SendWR{Opcode: verbs.OpSend, SGL: ssgl})
		s.SendCQ().TryPoll(swc[:])
		return true
	}
	var wc [4]verbs.Completion
	if !handler {
		go func() {
			var rwc [1]verbs.Completion
			for {
				if _, err := s.RecvCQ().Poll(ctx, rwc[:]); err != nil || !echo(rwc[0]) {
					return
				}
			}
		}()
		return func() error {
			c.PostSend(verbs.SendWR{Opcode: verbs.OpSend, SGL: sgl})
			if _, err := c.RecvCQ().Poll(ctx, wc[:1]); err != nil {
				return err
			}
			if wc[0].Status != verbs.StatusSuccess {
				return fmt.Errorf("receive: %v", wc[0].Status)
			}
			c.PostRecv(crecv)
			c.SendCQ().TryPoll(wc[:])
			return nil
		}
	}
	if err := s.SetRecvHandler(func(wc verbs.Completion) { echo(wc) }); err != nil {
		b.Fatal(err)
	}
	got := recvToChan(b, c, nil)
	return func() error {
		c.PostSend(verbs.SendWR{Opcode: verbs.OpSend, SGL: sgl})
		select {
		case w := <-got:
			if w.Status != verbs.StatusSuccess {
				return fmt.Errorf("receive: %v", w.Status)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
		c.PostRecv(crecv)
		c.SendCQ().TryPoll(wc[:])
		return nil
	}
}

// BenchmarkRDMARead1MiBOneAtATime: 1 MiB RDMA Reads one at a time, as an
// RPC-over-RDMA server reads an NFS WRITE's Read chunk. inline-rest/op is
// how often the responder's receiving goroutine left the rest of the
// response to the responder goroutine (the socket did not take it all).
func BenchmarkRDMARead1MiBOneAtATime(b *testing.B) {
	c, s := pair(b, nil, nil)
	src, _ := s.PD().RegisterMemory(randBytes(1<<20, 2), verbs.AccessRemoteRead)
	sink, _ := c.PD().RegisterMemory(make([]byte, 1<<20), verbs.AccessLocalWrite)
	wr := verbs.SendWR{Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{{MR: sink, Length: 1 << 20}}, Length: 1 << 20, RemoteSTag: src.STag()}
	b.SetBytes(1 << 20)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := c.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		if wc := pollOne(b, c.SendCQ()); wc.Status != verbs.StatusSuccess {
			b.Fatalf("completion %+v", wc)
		}
	}
	b.ReportMetric(float64(s.respHandoffs.Load())/float64(b.N), "inline-rest/op")
}

// recvToChan sets a receive handler on qp that hands each completion to
// the returned channel, for a caller waiting on one message at a time,
// then calls after (if not nil) with it.
func recvToChan(tb testing.TB, qp *QP, after func(verbs.Completion)) <-chan verbs.Completion {
	got := make(chan verbs.Completion, 1)
	if err := qp.SetRecvHandler(func(wc verbs.Completion) {
		select {
		case got <- wc:
		default: // a flush after a failure: nobody waits
		}
		if after != nil {
			after(wc)
		}
	}); err != nil {
		tb.Fatal(err)
	}
	return got
}
