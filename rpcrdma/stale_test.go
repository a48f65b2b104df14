package rpcrdma

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/mrcache"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// No stale byte, pure-Go provider and responder: every buffer of both
// ends' slabs holds a marker before first use; then every chunk kind
// runs, in both directions (calls inline, by Read chunk and by
// Position-Zero Read chunk; replies inline, by Write chunk into
// registered and into ordinary memory, and by Reply chunk), with sizes
// that need XDR padding, and nothing delivered (the call message the
// handler gets, the reply message and the placed bulk data the caller
// gets) holds the marker. The data never holds the marker byte, so one
// can only be memory that a buffer held before.
// The rdma-core provider's path (through its hooks, and in the guest)
// is checked by the verbs/ibverbs tests.

const slabMarker = 0xee

// No RPC header word of these calls and replies (XIDs, program,
// lengths) holds the marker byte either, so one marker byte anywhere is
// a stale one, XDR padding included.

// noMarker returns n bytes of data without the marker byte.
func noMarker(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		v := byte(i*7+i>>8) + seed
		if v == slabMarker {
			v++
		}
		b[i] = v
	}
	return b
}

// fillSlabByte takes n bytes of p in chunk-sized buffers, fills them with the
// marker and gives them back: the memory every later buffer is cut from
// holds the marker.
func fillSlabByte(t *testing.T, p *mrcache.Pool, n int) {
	t.Helper()
	var held []*mrcache.Buffer
	for got := 0; got < n; got += mrcache.ChunkSize {
		b, err := p.GetWait(noWait, mrcache.ChunkSize) // up to the budget
		if err != nil {
			break
		}
		fill(b.Bytes(), slabMarker)
		held = append(held, b)
	}
	if len(held) == 0 {
		t.Fatal("fill slab: no memory")
	}
	for _, b := range held {
		if err := p.Put(b); err != nil {
			t.Fatal(err)
		}
	}
}

// markerHandler is the echo handler, failing the test when a call it is
// given holds the marker.
type markerHandler struct {
	echoHandler
	mu    *sync.Mutex
	stale *[]string
}

func (h markerHandler) HandleCall(msg []byte) []byte {
	if i := bytes.IndexByte(msg, slabMarker); i >= 0 {
		h.mu.Lock()
		*h.stale = append(*h.stale, fmt.Sprintf("a %d-byte call holds the marker at %d", len(msg), i))
		h.mu.Unlock()
	}
	return h.echoHandler.HandleCall(msg)
}

func TestNoStaleBytes(t *testing.T) {
	forEachVersion(t, func(t *testing.T, v int) {
		var mu sync.Mutex
		var stale []string
		env := newEnv(t, v, ResponderConfig{Handler: markerHandler{mu: &mu, stale: &stale}}, Config{})
		// Most of each slab: the pools grow into memory that holds
		// the marker, for every buffer kind (receive, send, Reply
		// chunk, bounce, Read sink).
		fillSlabByte(t, env.resp.Buffers(), 64<<20)
		fillSlabByte(t, env.tr.Buffers(), 64<<20)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		regDest, err := env.tr.Buffers().Get(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		defer regDest.Release()
		type tc struct {
			name string
			call func(xid uint32) (*oncrpc.Call, []byte) // the call; the data expected back
		}
		echo := func(n int, dest oncrpc.View) func(uint32) (*oncrpc.Call, []byte) {
			return func(xid uint32) (*oncrpc.Call, []byte) {
				data := noMarker(n, byte(xid))
				var e xdr.Encoder
				oncrpc.AppendCallHeader(&e, xid, echoProg, 1, procEcho, oncrpc.AuthNone)
				e.Uint32(uint32(n))
				maxReply := 128
				if dest.IsZero() {
					maxReply += n
				} else {
					dest = dest.Slice(0, n)
					fill(dest.Bytes(), slabMarker)
				}
				return &oncrpc.Call{XID: xid, Head: e.Bytes(), Bulk: oncrpc.Plain(data), ReplyBulk: dest, MaxReplySize: maxReply}, data
			}
		}
		cases := []tc{
			{"inline both ways", echo(101, oncrpc.View{})},
			{"Read chunk, Reply chunk", echo(5001, oncrpc.View{})},
			{"Read chunk, Write chunk", echo(65537, oncrpc.Plain(make([]byte, 65537)))},
			{"Read chunk, Write chunk in registered memory", echo(1<<20-3, oncrpc.Lent(regDest))},
			{"Read chunk, Write chunk of many segments", echo(3<<20+1, oncrpc.Plain(make([]byte, 3<<20+1)))},
			{"Position-Zero Read chunk", func(xid uint32) (*oncrpc.Call, []byte) {
				// A large call without Bulk, whose reply fits inline.
				data := noMarker(9001, byte(xid))
				var e xdr.Encoder
				oncrpc.AppendCallHeader(&e, xid, echoProg, 1, procSink, oncrpc.AuthNone)
				e.Opaque(data)
				return &oncrpc.Call{XID: xid, Head: e.Bytes(), MaxReplySize: 128}, nil
			}},
		}
		for i, c := range cases {
			for round := range 3 {
				xid := uint32(0x5000 + i*16 + round)
				call, want := c.call(xid)
				rep, err := env.clnt.Do(ctx, call)
				if err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				if j := bytes.IndexByte(rep.Msg, slabMarker); j >= 0 {
					t.Fatalf("%s: the %d-byte reply holds the marker at %d", c.name, len(rep.Msg), j)
				}
				d := xdr.NewDecoder(rep.Results)
				var got []byte
				switch {
				case want == nil:
					if n := d.Uint32(); d.Err() != nil || int(n) != 9001 {
						t.Fatalf("%s: sink result %d (%v)", c.name, n, d.Err())
					}
				case rep.BulkPlaced:
					n := int(d.Uint32())
					if n != rep.BulkLen || n > call.ReplyBulk.Len() {
						t.Fatalf("%s: count %d, %d placed", c.name, n, rep.BulkLen)
					}
					got = call.ReplyBulk.Bytes()[:n]
				default:
					got = d.Opaque(len(want))
				}
				if want != nil && !bytes.Equal(got, want) {
					t.Fatalf("%s: %d bytes back, %d sent, different (marker at %d)", c.name, len(got), len(want), bytes.IndexByte(got, slabMarker))
				}
				rep.Release()
			}
		}
		mu.Lock()
		defer mu.Unlock()
		for _, s := range stale {
			t.Error(s)
		}
		if st := env.tr.Stats(); st.Replies == 0 {
			t.Fatal("no replies")
		}
	})
}
