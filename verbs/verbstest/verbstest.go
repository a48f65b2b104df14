// Package verbstest is the conformance suite of the verbs API: one set of
// tests, written against package verbs only, that every provider runs
// (the pure-Go iWARP provider in the ordinary test run, the rdma-core
// provider over rxe and siw inside the knfsd guest).
//
// It covers Send/Recv with gather and scatter lists, RDMA Write and Read
// with exact region bounds, remote access outside a registration,
// invalidation (local, fast-registration windows, Send With Invalidate),
// completion statuses and how errors map to them, disconnect events,
// completion queue behaviour, and connection setup with private data.
//
// Providers differ where their wire protocols differ (an iWARP RDMA Write
// is unacknowledged, an InfiniBand one is not; the InfiniBand CM pads
// private data to its field size; ...). Those differences are not hidden
// behind loose assertions: Caps states them, each with its reason, and the
// suite asserts the documented behaviour.
//
//	func TestConformance(t *testing.T) {
//		verbstest.Run(t, verbstest.Target{Provider: &iwarp.Provider{}, ListenAddr: "127.0.0.1:0", Caps: verbstest.IWARPCaps})
//	}
//
// WriteExchange is not a conformance test but a measurement: the message
// pattern of an RPC-over-RDMA WRITE over a provider against TCP, which
// the pure-Go provider and the kernel's siw and rxe run alike.
//
// All memory the suite registers is mapped outside the Go heap (whole
// pages, written before registration), as a hardware provider requires.
package verbstest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/verbs"
)

// Target is a provider under test.
type Target struct {
	// Provider makes both ends of every connection.
	Provider verbs.Provider
	// ListenAddr is the address the suite listens on, port 0: a
	// loopback address for a software provider, an address of the
	// device's network interface for a device ("10.0.2.15:0").
	ListenAddr string
	// Caps are the provider's documented differences.
	Caps Caps
}

// Caps describes where a provider legitimately differs; the suite
// asserts exactly the behaviour stated here.
type Caps struct {
	// SendSGEs, RecvSGEs and ReadSinkSGEs are the most scatter/gather
	// elements a Send or RDMA Write, a receive, and an RDMA Read sink
	// may have. One more is refused at post time with ErrInvalidWR.
	SendSGEs, RecvSGEs, ReadSinkSGEs int
	// RemoteInvalidate: a received Send With Invalidate invalidates a
	// region with remote access (true for iWARP, RFC 5040 s5.3;
	// InfiniBand and RoCE devices invalidate only fast-registration
	// regions and memory windows, which userspace verbs cannot make).
	RemoteInvalidate bool
	// WindowInvalidate: a received Send With Invalidate invalidates a
	// memory window bound on the queue pair (InfiniBand and RoCE
	// type-2 windows), while regions of registered memory stay refused
	// (SendInvRefused).
	WindowInvalidate bool
	// SendInvRefused is the receive status when RemoteInvalidate is
	// false and a Send With Invalidate arrives.
	SendInvRefused verbs.Status
	// InvalidationUnreported: the device invalidates the STag a Send
	// With Invalidate names but its receive completion does not say so
	// (libsiw of rdma-core 44 drops IBV_WC_WITH_INV): the receive
	// completes as a plain OpRecv, the region stays valid in its
	// domain until invalidated locally, and the peer's later access
	// with the key is refused. The provider then cannot refuse an
	// invalidation of a key it never offered either (siw invalidates
	// any STag of the protection domain).
	InvalidationUnreported bool
	// WriteRefused is the initiator's completion status of an RDMA
	// Write the target refuses: StatusSuccess on iWARP (RFC 5040 s4.3:
	// a Write completes when its data has left; the target's Terminate
	// then breaks the connection), StatusRemoteAccessErr on InfiniBand
	// and RoCE (the responder NAKs it).
	WriteRefused verbs.Status
	// ReadRefused is the initiator's completion status of an RDMA Read
	// the target refuses: StatusRemoteAccessErr (the target's
	// Terminate or NAK names the error), or StatusFlushed where the
	// device does not report it (siw flushes the Read when the
	// Terminate moves its queue pair to the error state).
	ReadRefused verbs.Status
	// ReadRightUnchecked: the target serves an RDMA Read of a region
	// granted remote write but not remote read access (siw, Linux 6.1:
	// siw_qp_tx.c checks a Read Response's source without asking for
	// IB_ACCESS_REMOTE_READ). The suite asserts the Read succeeds, so
	// that a fixed device shows up.
	ReadRightUnchecked bool
	// SendRefused is the initiator's completion status of a Send too
	// long for the receive buffer (iWARP: StatusSuccess, as for Writes;
	// InfiniBand: the NAK's StatusRemoteOpErr).
	SendRefused verbs.Status
	// RecvTooLong is the receive's status for that Send:
	// StatusLocalLengthErr (RFC 5041 s7, InfiniBand's Local Length
	// Error), or StatusRemoteOpErr for rxe (Linux 6.1), which completes
	// the receive with IBV_WC_LOC_QP_OP_ERR.
	RecvTooLong verbs.Status
	// PaddedPrivateData: the connection manager delivers private data
	// zero-padded to its field size (InfiniBand CM: 56 bytes in a
	// request, 196 in a reply); the sent bytes are a prefix.
	PaddedPrivateData bool
}

// IWARPCaps are the capabilities of the pure-Go iWARP provider.
var IWARPCaps = Caps{
	SendSGEs: verbs.MaxSGE,
	// The provider places a Send into one buffer and an RDMA Read
	// Request names one sink STag (RFC 5040 s4.4).
	RecvSGEs: 1, ReadSinkSGEs: 1,
	RemoteInvalidate: true,
	WriteRefused:     verbs.StatusSuccess,
	ReadRefused:      verbs.StatusRemoteAccessErr,
	SendRefused:      verbs.StatusSuccess,
	RecvTooLong:      verbs.StatusLocalLengthErr,
}

// timeout guards against hangs only; no test relies on timing. It is
// generous because the rdma-core runs happen under qemu's emulation.
const timeout = 3 * time.Minute

// Run runs the whole suite against tg, one subtest per area.
func Run(t *testing.T, tg Target) {
	if tg.Caps.SendSGEs < 1 || tg.Caps.RecvSGEs < 1 || tg.Caps.ReadSinkSGEs < 1 {
		t.Fatalf("verbstest: Caps %+v: SGE limits must be at least 1", tg.Caps)
	}
	for _, c := range []struct {
		name string
		run  func(*testing.T, *Target)
	}{
		{"SendRecv", testSendRecv},
		{"GatherScatter", testGatherScatter},
		{"WriteRead", testWriteRead},
		{"FastRegWindow", testFastRegWindow},
		{"RegistrationWR", testRegistrationWR},
		{"RegistrationWRErrors", testRegistrationWRErrors},
		{"ReadDepth", testReadDepth},
		{"RemoteAccessDenied", testRemoteAccessDenied},
		{"Reregister", testReregister},
		{"SendWithInvalidate", testSendWithInvalidate},
		{"InvalidateNotOffered", testInvalidateNotOffered},
		{"MessageTooLong", testMessageTooLong},
		{"PostErrors", testPostErrors},
		{"Disconnect", testDisconnect},
		{"CompletionQueue", testCompletionQueue},
		{"ForeignCQ", testForeignCQ},
		{"PrivateData", testPrivateData},
		{"Reject", testReject},
		{"SetupBeforeAccept", testSetupBeforeAccept},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t, &tg) })
	}
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// connect connects a client (active side) and a server (passive side)
// queue pair; both are closed when the test ends.
func (tg *Target) connect(t testing.TB, cp, sp *verbs.ConnParams) (c, s verbs.QueuePair) {
	t.Helper()
	if cp == nil {
		cp = &verbs.ConnParams{}
	}
	if sp == nil {
		sp = &verbs.ConnParams{}
	}
	ctx := testCtx(t)
	ln, err := tg.Provider.Listen(tg.ListenAddr, sp)
	if err != nil {
		t.Fatalf("listen %s: %v", tg.ListenAddr, err)
	}
	defer ln.Close()
	type res struct {
		qp  verbs.QueuePair
		err error
	}
	ch := make(chan res, 1)
	go func() {
		qp, err := ln.Accept(ctx)
		ch <- res{qp, err}
	}()
	c, err = tg.Provider.Dial(ctx, ln.Addr().String(), cp)
	if err != nil {
		t.Fatalf("dial %s: %v", ln.Addr(), err)
	}
	r := <-ch
	if r.err != nil {
		c.Close()
		t.Fatalf("accept: %v", r.err)
	}
	s = r.qp
	t.Cleanup(func() {
		c.Close()
		s.Close()
	})
	return c, s
}

// alloc maps n bytes (rounded up to whole pages) outside the Go heap,
// fills them with fill, and unmaps them when the test ends (after the
// regions registered later are deregistered).
func alloc(t testing.TB, n int, fill byte) []byte {
	t.Helper()
	pg := os.Getpagesize()
	size := (max(n, 1) + pg - 1) / pg * pg
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatalf("mmap %d bytes: %v", size, err)
	}
	// Touch every page: a registration pins the pages behind the
	// address, and an untouched anonymous page is the shared zero page.
	for i := range b {
		b[i] = fill
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}

// reg registers buf in pd; the region is deregistered when the test ends.
func reg(t testing.TB, pd *verbs.ProtectionDomain, buf []byte, access verbs.Access) *verbs.MemoryRegion {
	t.Helper()
	mr, err := pd.RegisterMemory(buf, access)
	if err != nil {
		t.Fatalf("register %d bytes %v: %v", len(buf), access, err)
	}
	t.Cleanup(func() { _ = mr.Deregister() })
	return mr
}

// region maps and registers n bytes (whole pages) filled with fill.
func region(t testing.TB, pd *verbs.ProtectionDomain, n int, fill byte, access verbs.Access) (*verbs.MemoryRegion, []byte) {
	t.Helper()
	buf := alloc(t, n, fill)
	return reg(t, pd, buf, access), buf
}

// window binds a fast-registration region to [off, off+n) of target, for
// the peer of qp (a provider with memory windows binds it on qp,
// verbs.WindowBinder).
func window(t testing.TB, qp verbs.QueuePair, target *verbs.MemoryRegion, off uint64, n int, access verbs.Access) *verbs.MemoryRegion {
	t.Helper()
	w, err := target.PD().AllocFastReg()
	if err != nil {
		t.Fatalf("alloc fast registration: %v", err)
	}
	t.Cleanup(func() { _ = w.Deregister() })
	if _, err := w.FastRegister(target, off, n, access); err != nil {
		t.Fatalf("fast register [%d, +%d): %v", off, n, err)
	}
	if wb, ok := qp.(verbs.WindowBinder); ok {
		if err := wb.BindWindows(context.Background(), w); err != nil {
			t.Fatalf("bind window [%d, +%d): %v", off, n, err)
		}
	}
	return w
}

// postRecv posts a receive of the n bytes at off of mr.
func postRecv(t testing.TB, qp verbs.QueuePair, wrid uint64, mr *verbs.MemoryRegion, off uint64, n int) {
	t.Helper()
	if err := qp.PostRecv(verbs.RecvWR{WRID: wrid, SGL: []verbs.SGE{{MR: mr, Offset: off, Length: uint32(n)}}}); err != nil {
		t.Fatalf("post receive %d: %v", wrid, err)
	}
}

// postSend posts wr and fails the test if the post is refused.
func postSend(t testing.TB, qp verbs.QueuePair, wr verbs.SendWR) {
	t.Helper()
	if err := qp.PostSend(wr); err != nil {
		t.Fatalf("post %v %d: %v", wr.Opcode, wr.WRID, err)
	}
}

// PollN polls exactly n completions from cq.
func PollN(t testing.TB, cq verbs.CompletionQueue, n int) []verbs.Completion {
	t.Helper()
	ctx := testCtx(t)
	out := make([]verbs.Completion, 0, n)
	buf := make([]verbs.Completion, 16)
	for len(out) < n {
		k, err := cq.Poll(ctx, buf[:min(len(buf), n-len(out))])
		if err != nil {
			t.Fatalf("poll: %d of %d completions (%+v): %v", len(out), n, out, err)
		}
		out = append(out, buf[:k]...)
	}
	return out
}

// PollOne waits for the next completion on cq.
func PollOne(t testing.TB, cq verbs.CompletionQueue) verbs.Completion {
	t.Helper()
	return PollN(t, cq, 1)[0]
}

// Expect checks a completion's WRID, status and opcode.
func Expect(t testing.TB, c verbs.Completion, wrid uint64, st verbs.Status, op verbs.Opcode) {
	t.Helper()
	if c.WRID != wrid || c.Status != st || c.Opcode != op {
		t.Fatalf("completion %+v (%v %v), want WRID %d %v %v", c, c.Status, c.Opcode, wrid, st, op)
	}
}

// expectLen checks a successful completion and its byte count.
func expectLen(t testing.TB, c verbs.Completion, wrid uint64, op verbs.Opcode, n int) {
	t.Helper()
	Expect(t, c, wrid, verbs.StatusSuccess, op)
	if c.ByteLen != uint32(n) {
		t.Fatalf("completion %+v: ByteLen %d, want %d", c, c.ByteLen, n)
	}
}

// broken waits until qp breaks and checks that its error names a lost or
// terminated connection (not a local close).
func broken(t testing.TB, qp verbs.QueuePair, who string) {
	t.Helper()
	select {
	case <-qp.Done():
	case <-testCtx(t).Done():
		t.Fatalf("%s: queue pair still working after the error (Err %v)", who, qp.Err())
	}
	err := qp.Err()
	if !errors.Is(err, verbs.ErrTerminated) && !errors.Is(err, verbs.ErrConnectionLost) {
		t.Fatalf("%s: queue pair error %v, want ErrTerminated or ErrConnectionLost", who, err)
	}
}

// flushedAfter checks that work requests posted on a broken queue pair
// complete as flushed, on both queues.
func flushedAfter(t testing.TB, qp verbs.QueuePair, mr *verbs.MemoryRegion) {
	t.Helper()
	postSend(t, qp, verbs.SendWR{WRID: 901, Opcode: verbs.OpSend})
	Expect(t, PollOne(t, qp.SendCQ()), 901, verbs.StatusFlushed, verbs.OpSend)
	postRecv(t, qp, 902, mr, 0, 1)
	Expect(t, PollOne(t, qp.RecvCQ()), 902, verbs.StatusFlushed, verbs.OpRecv)
}

// fence sends a Send from c to s and waits for its receive: RDMA Writes
// c posted before it have then been placed at s (both RFC 5040 s5.5 and
// InfiniBand order a Send after earlier Writes).
func fence(t testing.TB, c, s verbs.QueuePair, rmr *verbs.MemoryRegion, wrid uint64) {
	t.Helper()
	postRecv(t, s, wrid, rmr, 0, 16)
	postSend(t, c, verbs.SendWR{WRID: wrid, Opcode: verbs.OpSend})
	expectLen(t, PollOne(t, c.SendCQ()), wrid, verbs.OpSend, 0)
	expectLen(t, PollOne(t, s.RecvCQ()), wrid, verbs.OpRecv, 0)
}

// pattern fills b with bytes that depend on seed and position.
func pattern(b []byte, seed uint64) {
	x := seed*0x9e3779b97f4a7c15 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

// sameBytes fails the test at the first difference of got and want.
func sameBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d bytes, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: byte %d is %#02x, want %#02x", what, i, got[i], want[i])
		}
	}
}

// allBytes fails the test unless every byte of b is v.
func allBytes(t testing.TB, what string, b []byte, v byte) {
	t.Helper()
	for i, x := range b {
		if x != v {
			t.Fatalf("%s: byte %d is %#02x, want %#02x (memory outside the access was touched)", what, i, x, v)
		}
	}
}

// split cuts [off, off+n) of mr into k SGEs of nearly equal, non-zero
// length (fewer if n < k; zero-length SGEs are not portable: some
// hardware reads a zero length as 2 GiB).
func split(mr *verbs.MemoryRegion, off uint64, n, k int) []verbs.SGE {
	if n == 0 {
		return nil
	}
	k = min(k, n)
	sgl := make([]verbs.SGE, 0, k)
	for i := range k {
		lo, hi := n*i/k, n*(i+1)/k
		sgl = append(sgl, verbs.SGE{MR: mr, Offset: off + uint64(lo), Length: uint32(hi - lo)})
	}
	return sgl
}

// name formats a subtest name.
func name(format string, args ...any) string { return fmt.Sprintf(format, args...) }
