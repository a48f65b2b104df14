//go:build cgo && linux && !noibverbs

package ibverbs

import (
	"testing"

	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/verbs"
)

// sendInvEnv is a queue pair of a fake device, with a slab chunk's
// receive buffer posted (as the transport posts its receives).
type sendInvEnv struct {
	dev  *fakeDevice
	h    *hook
	q    *queuePair
	pool *mrcache.Pool
	buf  *mrcache.Buffer
	next uint64
}

func newSendInvEnv(t *testing.T) *sendInvEnv {
	t.Helper()
	dev := newFakeDevice()
	h := newHook(nil, dev)
	pd := link.NewDomain(h)
	pool := mrcache.New(pd, mrcache.ChunkSize)
	t.Cleanup(pool.Close)
	buf, err := pool.GetWait(t.Context(), 4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Put(buf) })
	q := &queuePair{pd: pd, h: h, wrs: make(map[uint64]wrInfo), done: make(chan struct{}),
		sendCQ: verbs.NewSoftCQ(), recvCQ: verbs.NewSoftCQ()}
	return &sendInvEnv{dev: dev, h: h, q: q, pool: pool, buf: buf}
}

// postRecv records a receive as PostRecv does, without a device.
func (e *sendInvEnv) postRecv() uint64 {
	e.next++
	e.q.wrs[e.next] = wrInfo{wrid: e.next, op: verbs.OpRecv, recv: true, epoch: e.h.epoch.Load()}
	return e.next
}

// chunkKey returns the slab chunk's key as the domain and the device
// know it, and whether the device accepts it.
func (e *sendInvEnv) chunkKey(t *testing.T) (uint32, bool) {
	t.Helper()
	sge, err := e.buf.SGE(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	e.h.mu.Lock()
	r := e.h.regs[sge.MR]
	e.h.mu.Unlock()
	if r == nil || r.lkey != sge.MR.LKey() {
		t.Fatalf("domain and device disagree on the chunk's key: %#x, %+v", sge.MR.LKey(), r)
	}
	return r.lkey, e.dev.usable(r.lkey)
}

// TestHostileSendInvalidateSlabKey: siw carries out a Send With
// Invalidate naming any STag of the protection domain (here the slab
// chunk's, which was never offered) before software can check it. The
// connection that did it breaks, and the chunk is registered again under
// a new key, so the transport's memory stays usable for the connections
// that follow instead of failing every work request that names it:
//
//   - "reported": the device reports the invalidated STag;
//   - "unreported": siw's userspace library (rdma-core 44) does not, and
//     the next receive into the chunk fails with a local protection
//     error. A second receive posted with the old key fails the same way
//     and does not set off another re-registration.
func TestHostileSendInvalidateSlabKey(t *testing.T) {
	t.Run("reported", func(t *testing.T) {
		e := newSendInvEnv(t)
		old, _ := e.chunkKey(t)
		wr := e.postRecv()
		e.dev.invalidate(old) // the peer's Send With Invalidate lands
		e.q.deliver(workCompletion{wrID: wr, status: wcSuccess, byteLen: 32, withInv: true, invRkey: old})
		if e.q.Err() == nil {
			t.Fatal("the connection survived an invalidation of an STag never offered")
		}
		key, ok := e.chunkKey(t)
		if !ok || key == old {
			t.Fatalf("slab chunk key %#x (was %#x) usable on the device: %v; want a new, live key", key, old, ok)
		}
	})
	t.Run("unreported", func(t *testing.T) {
		e := newSendInvEnv(t)
		old, _ := e.chunkKey(t)
		first, second := e.postRecv(), e.postRecv()
		e.dev.invalidate(old)
		e.q.deliver(workCompletion{wrID: first, status: wcLocProtErr})
		key, ok := e.chunkKey(t)
		if !ok || key == old {
			t.Fatalf("slab chunk key %#x (was %#x) usable on the device: %v; want a new, live key", key, old, ok)
		}
		e.q.deliver(workCompletion{wrID: second, status: wcLocProtErr})
		if again, ok := e.chunkKey(t); again != key || !ok {
			t.Fatalf("a second failure on the old key registered the chunk again: key %#x, was %#x", again, key)
		}
		if e.q.Err() == nil {
			t.Fatal("the queue pair survived a local protection error")
		}
	})
}
