package main

import (
	"context"
	"encoding/binary"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/rpcrdma"
	"github.com/rdmafs/rdmafs/test/testpeer"
	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/iwarp"
)

// stallingConn is the TCP stream under a hostile requester's queue pair:
// once stalled it swallows everything the relay sends, so the relay's
// RDMA Reads of the requester's Read chunks are never answered, while
// the requester can still send and still sees the stream end.
type stallingConn struct {
	net.Conn
	stalled atomic.Bool
}

func (c *stallingConn) Read(p []byte) (int, error) {
	for {
		n, err := c.Conn.Read(p)
		if !c.stalled.Load() || err != nil {
			return n, err
		}
	}
}

// stallRelay connects a requester to the relay at addr that sends calls
// NFS NULL calls, each with a Read chunk of chunk bytes, and never lets
// the relay read them. It returns the queue pair.
func stallRelay(t *testing.T, ctx context.Context, addr string, calls, chunk int) verbs.QueuePair {
	t.Helper()
	pd := iwarp.NewProtectionDomain()
	var conn *stallingConn
	pv := &iwarp.Provider{DialConn: func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		conn = &stallingConn{Conn: c}
		return conn, nil
	}}
	recv := make([]byte, 8*4096)
	rmr, err := pd.RegisterMemory(recv, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	setup := func(qp verbs.QueuePair) error {
		for i := range 8 {
			sge := verbs.SGE{MR: rmr, Offset: uint64(i * 4096), Length: 4096}
			if err := qp.PostRecv(verbs.RecvWR{WRID: uint64(i), SGL: []verbs.SGE{sge}}); err != nil {
				return err
			}
		}
		return nil
	}
	// RFC 8797 private data, version 1.
	priv := rpcrdma.PrivateData{Version: 1, InlineSend: 4096, InlineRecv: 4096}.Marshal()
	qp, err := pv.Dial(ctx, addr, &verbs.ConnParams{PD: pd, PrivateData: priv, Setup: setup})
	if err != nil {
		t.Fatalf("hostile requester: %v", err)
	}
	t.Cleanup(func() { qp.Close() })
	src, err := pd.RegisterMemory(make([]byte, chunk), verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	// nullCall sends an NFS NULL call with reads as its Read chunk.
	nullCall := func(xid uint32, reads []rpcrdma.ReadSegment) {
		var call xdr.Encoder
		oncrpc.AppendCallHeader(&call, xid, 100003, 4, 0, oncrpc.AuthNone)
		for i := range reads {
			reads[i].Position = uint32(call.Len())
		}
		h := rpcrdma.Header{XID: xid, Vers: rpcrdma.Version1, Credit: 8, Proc: rpcrdma.ProcMsg, Reads: reads}
		var e xdr.Encoder
		h.Append(&e)
		msg := append(e.Bytes(), call.Bytes()...)
		mr, err := pd.RegisterMemory(msg, verbs.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		if err := qp.PostSend(verbs.SendWR{WRID: uint64(xid), Opcode: verbs.OpSend, SGL: []verbs.SGE{{MR: mr, Length: uint32(len(msg))}}}); err != nil {
			t.Fatal(err)
		}
	}
	// RFC 8166 s3.3.3: one credit until the first reply, which grants
	// the rest: a NULL call first, answered, then the stalled ones.
	nullCall(0x4fff, nil)
	var wc [1]verbs.Completion
	if n, err := qp.RecvCQ().Poll(ctx, wc[:]); err != nil || n != 1 || wc[0].Status != verbs.StatusSuccess {
		t.Fatalf("hostile requester: the first call's reply: %d completions, %v", n, err)
	}
	if g := binary.BigEndian.Uint32(recv[int(wc[0].WRID)*4096+8:]); g < uint32(calls) {
		t.Fatalf("hostile requester: the first reply grants %d credits; it sends %d calls", g, calls)
	}
	conn.stalled.Store(true)
	for i := range calls {
		nullCall(uint32(0x5000+i), []rpcrdma.ReadSegment{{Segment: rpcrdma.Segment{Handle: src.STag(), Length: uint32(chunk)}}})
	}
	return qp
}

// TestRelayHostileClient: a requester that offers Read chunks and never
// lets the relay read them holds no more than its share of the relay's
// registered memory and its credits, so an rdmafs mount through the same
// relay process runs its workload meanwhile; the relay closes the
// hostile connection once its Read has gone unanswered for
// --read-timeout, and says so in its stats.
func TestRelayHostileClient(t *testing.T) {
	g := testpeer.RequireGanesha(t)
	r := startRelayBin(t, g.Addr, "--memory", "64", "--credits", "16", "--read-timeout", "15s")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	hostile := stallRelay(t, ctx, r.addr, 16, 1<<20)
	mnt := mount(t, peer{name: "relay-ganesha", host: "127.0.0.1", port: r.port, export: g.Export, opts: []string{"proto=rdma", "rdmadev=iwarp-go"}})
	d := testDir(t, mnt)
	defer os.RemoveAll(d)
	if out := sh(t, 5*time.Minute, relayWorkload(t.TempDir(), d)); !strings.Contains(out, "workload ok") {
		t.Fatalf("workload beside the hostile client:\n%s", out)
	}
	select {
	case <-hostile.Done():
		t.Log("the hostile connection was closed before the workload ended")
	default:
		t.Log("the workload ended while the hostile client still stalled its Reads")
	}
	select {
	case <-hostile.Done():
	case <-ctx.Done():
		t.Fatalf("the relay did not close a connection whose Read chunks went unanswered; stats:\n%s", r.stats(t))
	}
	st := r.stats(t)
	t.Logf("relay stats:\n%s", st)
	if n := statField(t, st, "errors:", "read_timeouts"); n != 1 {
		t.Errorf("%d connections closed for unanswered Reads, want the hostile one", n)
	}
	if n := statField(t, st, "connections:", "open"); n != 1 {
		t.Errorf("%d connections open, want the mount's alone", n)
	}
}
