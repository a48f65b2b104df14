package nfsclient

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/oncrpc/oncrpctest"
)

// faultServer is an NFSv4.1 server of the few operations a Client needs
// to mount (EXCHANGE_ID, CREATE_SESSION, SEQUENCE, RECLAIM_COMPLETE,
// PUTROOTFH, GETFH, GETATTR with no attributes) whose READDIR answers
// come from the test: for fault injection no real server can do.
type faultServer struct {
	// readDir encodes READDIR4resok for a READDIR after cookie.
	readDir  func(e *xdr.Encoder, cookie uint64)
	readDirs atomic.Int64
}

var faultSession = SessionID{'f', 'a', 'u', 'l', 't'}

// dialFaultServer serves s on a loopback port and dials a Client to it.
func dialFaultServer(t *testing.T, s *faultServer) *Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- oncrpctest.Serve(ln, s) }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, Config{
		Transport:     oncrpc.NewTCPTransport(ln.Addr().String(), oncrpc.TCPOptions{}),
		NoBackChannel: true,
		RPC:           oncrpc.ClientOptions{Timeout: 10 * time.Second, Retrans: 1},
	})
	if err != nil {
		ln.Close()
		t.Fatalf("dial the fault server: %v", err)
	}
	t.Cleanup(func() {
		c.Abandon()
		c.Close(context.Background())
		ln.Close()
		if err := <-done; err != nil {
			t.Errorf("fault server: %v", err)
		}
	})
	return c
}

// HandleCall answers one call: NULL, or a COMPOUND.
func (s *faultServer) HandleCall(msg []byte) []byte {
	h, args, err := oncrpc.ParseCall(msg)
	if err != nil {
		return nil
	}
	var e xdr.Encoder
	oncrpc.AppendAcceptedReply(&e, h.XID, oncrpc.Success, 0, 0)
	if h.Proc == 0 {
		return e.Bytes()
	}
	if err := s.compound(&e, xdr.NewDecoder(args)); err != nil {
		var g xdr.Encoder
		oncrpc.AppendAcceptedReply(&g, h.XID, oncrpc.GarbageArgs, 0, 0)
		return g.Bytes()
	}
	return e.Bytes()
}

// compound decodes COMPOUND4args from d and appends COMPOUND4res to e.
func (s *faultServer) compound(e *xdr.Encoder, d *xdr.Decoder) error {
	d.Opaque(maxTagLen)
	d.Uint32() // minorversion
	nops := d.Length(maxCompoundOps)
	var res xdr.Encoder
	n := 0
	for ; n < nops && d.Err() == nil; n++ {
		op := d.Uint32()
		res.Uint32(op)
		res.Uint32(uint32(StatusOK))
		if err := s.op(&res, d, op); err != nil {
			return err
		}
	}
	if d.Err() != nil {
		return d.Err()
	}
	e.Uint32(uint32(StatusOK))
	e.Opaque(nil)
	e.Uint32(uint32(n))
	e.FixedOpaque(res.Bytes())
	return nil
}

// op decodes the arguments of op and appends its result body.
func (s *faultServer) op(e *xdr.Encoder, d *xdr.Decoder, op uint32) error {
	switch op {
	case opExchangeID: // the last operation of its COMPOUND: arguments unread
		d.Skip(d.Remaining())
		e.Uint64(1) // clientid
		e.Uint32(1) // sequenceid
		e.Uint32(0) // flags
		e.Uint32(0) // SP4_NONE
		e.Uint64(0) // so_minor_id
		e.Opaque([]byte("fault"))
		e.Opaque([]byte("fault"))
		e.Uint32(0) // no implementation id
	case opCreateSession:
		d.Skip(d.Remaining())
		e.FixedOpaque(faultSession[:])
		e.Uint32(1) // sequence
		e.Uint32(0) // flags: no back channel
		for range 2 {
			for _, v := range []uint32{0, 1 << 20, 1 << 20, 8192, 16, 8, 0} {
				e.Uint32(v)
			}
		}
	case opSequence:
		d.FixedOpaque(16)
		seq, slot := d.Uint32(), d.Uint32()
		d.Uint32() // highest slot
		d.Bool()   // cachethis
		e.FixedOpaque(faultSession[:])
		for _, v := range []uint32{seq, slot, 7, 7, 0} {
			e.Uint32(v)
		}
	case opReclaimComplete:
		d.Bool()
	case opPutRootFH:
	case opPutFH:
		d.Opaque(maxFHSize)
	case opGetFH:
		e.Opaque([]byte("root"))
	case opGetAttr:
		decodeBitmap(d)
		e.Uint32(0) // no attributes: an empty bitmap
		e.Opaque(nil)
	case opReadDir:
		cookie := d.Uint64()
		d.FixedOpaque(8)
		d.Uint32()
		d.Uint32()
		decodeBitmap(d)
		s.readDirs.Add(1)
		s.readDir(e, cookie)
	case opDestroySession:
		d.FixedOpaque(16)
	case opDestroyClientID:
		d.Uint64()
	default:
		return fmt.Errorf("fault server: operation %d not served", op)
	}
	return nil
}
