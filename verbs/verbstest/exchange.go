package verbstest

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/verbs"
)

// The message pattern of an RPC-over-RDMA WRITE, for any provider: the
// same measurement over the pure-Go iWARP provider on this host and over
// the kernel's siw and rxe inside the knfsd guest, so that what the pull
// costs against TCP can be told apart from what a provider costs.

// Sizes of the exchange's small messages.
const (
	exchCall  = 200 // RPC-over-RDMA header, RPC call, NFS WRITE arguments
	exchReply = 64
	// exchReadReq stands for an iWARP RDMA Read Request on the wire:
	// MPA length, untagged DDP/RDMAP header, request, CRC (RFC 5044 s4,
	// RFC 5040 s4.4).
	exchReadReq = 2 + 18 + 28 + 4
)

// ExchangeRatios are the throughput ratios WriteExchange measured: the
// median over its batches of each batch's ratio of total times.
type ExchangeRatios struct {
	// RDMAOverTCP is the provider's exchange against TCP's push (the
	// call and the data in one write, the reply back).
	RDMAOverTCP float64
	// PullOverTCP is the provider's messages sent over plain TCP (the
	// call, a Read Request's bytes back, the data, the reply) against
	// TCP's push: what the pull's round trip costs without a provider.
	PullOverTCP float64
	// RDMAOverPull is the provider against the pull over plain TCP:
	// above 1, the provider moves the same messages faster than plain
	// socket calls.
	RDMAOverPull float64
	// Batches of Rounds exchanges of each kind.
	Batches, Rounds int
}

func (r ExchangeRatios) String() string {
	return fmt.Sprintf("rdma/tcp %.3f pull/tcp %.3f rdma/pull %.3f (median of %d batches of %d)",
		r.RDMAOverTCP, r.PullOverTCP, r.RDMAOverPull, r.Batches, r.Rounds)
}

// WriteExchange runs the exchange of a WRITE of size bytes over
// tg.Provider (the requester Sends the call; the peer reads size bytes of
// the requester's region with an RDMA Read, as for a Read chunk, RFC 8166
// s3.4.5, and Sends the reply) and its two TCP counterparts on the
// listening address's host, and returns the throughput ratios, median of
// batches (at least 5). Each round runs one of each kind in a random
// order: a call pays for the work the one before it left running, and in
// a fixed rotation each kind would mostly follow the same other.
// Completions are polled, which every provider offers.
func WriteExchange(t testing.TB, tg Target, size, batches, rounds int) ExchangeRatios {
	t.Helper()
	host, _, err := net.SplitHostPort(tg.ListenAddr)
	if err != nil {
		t.Fatalf("listen address %q: %v", tg.ListenAddr, err)
	}
	ops := [3]func() error{
		TCPExchange(t, host, size, false),
		RDMAExchange(t, tg, size),
		TCPExchange(t, host, size, true),
	}
	batches = max(batches, 5)
	rng, order := rand.New(rand.NewPCG(1, 2)), []int{0, 1, 2}
	var rdmaTCP, pullTCP, rdmaPull []float64
	for range batches {
		var spent [3]time.Duration
		for range rounds {
			rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			for _, j := range order {
				t0 := time.Now()
				if err := ops[j](); err != nil {
					t.Fatalf("exchange %d: %v", j, err)
				}
				spent[j] += time.Since(t0)
			}
		}
		tcp, rdma, pull := float64(spent[0]), float64(spent[1]), float64(spent[2])
		rdmaTCP, pullTCP, rdmaPull = append(rdmaTCP, tcp/rdma), append(pullTCP, tcp/pull), append(rdmaPull, pull/rdma)
	}
	return ExchangeRatios{RDMAOverTCP: median(rdmaTCP), PullOverTCP: median(pullTCP), RDMAOverPull: median(rdmaPull),
		Batches: batches, Rounds: rounds}
}

func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}

// TCPExchange returns one exchange of a WRITE of size bytes over a
// loopback TCP connection on host: the call and the data in one write
// then the reply (push), or the call, a Read Request's bytes back, the
// data, the reply (pull: the messages of an RDMA provider's exchange).
func TCPExchange(t testing.TB, host string, size int, pull bool) func() error {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatalf("tcp listen: %v", err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("tcp dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	s := <-accepted
	if s == nil {
		t.Fatal("tcp accept failed")
	}
	t.Cleanup(func() { s.Close() })
	go func() {
		call, data := make([]byte, exchCall), make([]byte, size)
		rr, reply := make([]byte, exchReadReq), make([]byte, exchReply)
		for {
			if _, err := io.ReadFull(s, call); err != nil {
				return
			}
			if pull {
				if _, err := s.Write(rr); err != nil {
					return
				}
			}
			if _, err := io.ReadFull(s, data); err != nil {
				return
			}
			if _, err := s.Write(reply); err != nil {
				return
			}
		}
	}()
	call, data := make([]byte, exchCall), make([]byte, size)
	rr, reply := make([]byte, exchReadReq), make([]byte, exchReply)
	return func() error {
		if !pull {
			bufs := net.Buffers{call, data}
			if _, err := bufs.WriteTo(c); err != nil {
				return err
			}
		} else {
			if _, err := c.Write(call); err != nil {
				return err
			}
			if _, err := io.ReadFull(c, rr); err != nil {
				return err
			}
			if _, err := c.Write(data); err != nil {
				return err
			}
		}
		_, err := io.ReadFull(c, reply)
		return err
	}
}

// RDMAExchange returns one exchange of a WRITE of size bytes over
// tg.Provider, completions polled: the requester Sends the call, a
// goroutine playing the responder (ServeReadExchange) reads the data with
// an RDMA Read and Sends the reply.
func RDMAExchange(t testing.TB, tg Target, size int) func() error {
	t.Helper()
	c, s := tg.connect(t, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	// The responder: takes the call, reads the data, Sends the reply.
	srecv, _ := region(t, s.PD(), exchCall, 0, verbs.AccessLocalWrite)
	sink, _ := region(t, s.PD(), size, 0, verbs.AccessLocalWrite)
	sreply, _ := region(t, s.PD(), exchReply, 0, 0)
	// The requester: the call, the data the Read takes, the reply's buffer.
	src, _ := region(t, c.PD(), size, 0x5a, verbs.AccessRemoteRead)
	ccall, _ := region(t, c.PD(), exchCall, 0, 0)
	crecv, _ := region(t, c.PD(), exchReply, 0, verbs.AccessLocalWrite)

	recvS := verbs.RecvWR{WRID: 1, SGL: []verbs.SGE{{MR: srecv, Length: exchCall}}}
	read := verbs.SendWR{WRID: 2, Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{{MR: sink, Length: uint32(size)}},
		Length: uint32(size), RemoteSTag: src.STag(), RemoteOffset: src.RemoteAddr()}
	reply := verbs.SendWR{WRID: 3, Opcode: verbs.OpSend, SGL: []verbs.SGE{{MR: sreply, Length: exchReply}}}
	recvC := verbs.RecvWR{WRID: 4, SGL: []verbs.SGE{{MR: crecv, Length: exchReply}}}
	call := verbs.SendWR{WRID: 5, Opcode: verbs.OpSend, SGL: []verbs.SGE{{MR: ccall, Length: exchCall}}}
	if err := s.PostRecv(recvS); err != nil {
		t.Fatalf("post receive: %v", err)
	}
	if err := c.PostRecv(recvC); err != nil {
		t.Fatalf("post receive: %v", err)
	}
	go ServeReadExchange(ctx, s, recvS, read, reply)
	var wc [4]verbs.Completion
	return func() error {
		if err := c.PostSend(call); err != nil {
			return err
		}
		if _, err := c.RecvCQ().Poll(ctx, wc[:1]); err != nil {
			return err
		}
		if wc[0].Status != verbs.StatusSuccess {
			return fmt.Errorf("reply: %v", wc[0].Status)
		}
		if err := c.PostRecv(recvC); err != nil {
			return err
		}
		// The call's Send completion, reaped without waiting.
		for _, w := range wc[:c.SendCQ().TryPoll(wc[:])] {
			if w.Status != verbs.StatusSuccess {
				return fmt.Errorf("call: %v", w.Status)
			}
		}
		return nil
	}
}

// ServeReadExchange is the responder of a WRITE's exchange on s until ctx
// ends or a work request fails: for every call it receives (recv, posted
// again at once) it posts read, the RDMA Read of the call's data, and
// once that completes Sends reply. s's completions are polled.
func ServeReadExchange(ctx context.Context, s verbs.QueuePair, recv verbs.RecvWR, read, reply verbs.SendWR) {
	var wc [4]verbs.Completion
	for {
		if _, err := s.RecvCQ().Poll(ctx, wc[:1]); err != nil || wc[0].Status != verbs.StatusSuccess {
			return
		}
		if s.PostRecv(recv) != nil || s.PostSend(read) != nil {
			return
		}
		// The last reply's Send completion may come with the Read's.
		for done := false; !done; {
			n, err := s.SendCQ().Poll(ctx, wc[:])
			if err != nil {
				return
			}
			for _, w := range wc[:n] {
				if w.Status != verbs.StatusSuccess {
					return
				}
				done = done || w.WRID == read.WRID
			}
		}
		if s.PostSend(reply) != nil {
			return
		}
	}
}
