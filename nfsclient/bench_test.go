package nfsclient

import (
	"context"
	"testing"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/test/testpeer"
)

// BenchmarkReadCompound encodes SEQUENCE+PUTFH+READ(4 KiB) and decodes
// its reply, as every read(2) through the mount does.
func BenchmarkReadCompound(b *testing.B) {
	rpc := oncrpc.NewClient(nil, nfsProgram, nfsVersion, oncrpc.ClientOptions{})
	dest := make([]byte, 4096)
	var e xdr.Encoder
	e.Uint32(0)
	e.String("")
	e.Uint32(3)
	e.FixedOpaque(unhex(b, seqOK))
	e.Uint32(opPutFH)
	e.Uint32(0)
	e.Uint32(opRead)
	e.Uint32(0)
	e.Bool(false)
	e.Opaque(make([]byte, 4096))
	rep := &oncrpc.Reply{Results: e.Bytes()}
	fh := make([]byte, 28)
	var cp compound
	var r results
	var out readOut
	b.SetBytes(4096)
	b.ReportAllocs()
	for b.Loop() {
		cp.reset(rpc, oncrpc.AuthNone, "")
		cp.sequence(testSession, 7, 3, 5)
		cp.putFH(fh)
		cp.read(StateID{}, 0, oncrpc.Plain(dest), &out)
		cp.call()
		if err := r.init(&cp, rep); err != nil {
			b.Fatal(err)
		}
		if _, _, _, err := r.decodeSequence(testSession); err != nil {
			b.Fatal(err)
		}
		if err := r.decodeAll(&cp); err != nil || out.n != 4096 {
			b.Fatal(out.n, err)
		}
	}
}

// BenchmarkGaneshaGetAttr sends GETATTRs to ganesha over TCP: with
// -benchmem, what one COMPOUND through Client.do allocates, the
// transport's share included.
func BenchmarkGaneshaGetAttr(b *testing.B) {
	g := testpeer.RequireGanesha(b)
	ctx := context.Background()
	c, err := Dial(ctx, Config{Transport: oncrpc.NewTCPTransport(g.Addr, oncrpc.TCPOptions{}), Export: g.Export})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(ctx)
	cred := c.Cred(0, 0, nil)
	fh := c.RootFH()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.GetAttr(ctx, cred, fh); err != nil {
			b.Fatal(err)
		}
	}
}
