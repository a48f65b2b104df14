package oncrpctest

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
	"github.com/rdmafs/rdmafs/oncrpc"
)

type echo struct{}

// HandleCall answers with the call's arguments as results.
func (echo) HandleCall(msg []byte) []byte {
	h, args, err := oncrpc.ParseCall(msg)
	if err != nil {
		return nil
	}
	var e xdr.Encoder
	oncrpc.AppendAcceptedReply(&e, h.XID, oncrpc.Success, 0, 0)
	return append(e.Bytes(), args...)
}

// TestServe: calls sent in fragments by the TCP transport come back whole,
// concurrently, each matched to its caller; Serve returns once its
// listener is closed and its connections have ended.
func TestServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- Serve(ln, echo{}) }()
	tr := oncrpc.NewTCPTransport(ln.Addr().String(), oncrpc.TCPOptions{MaxFragment: 1000})
	defer tr.Close()
	clnt := oncrpc.NewClient(tr, 0x20000001, 1, oncrpc.ClientOptions{Timeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			arg := bytes.Repeat([]byte{byte(i)}, 4000*(i+1))
			var e xdr.Encoder
			xid := clnt.StartCall(&e, 1, oncrpc.AuthNone)
			e.Opaque(arg)
			rep, err := clnt.Do(ctx, &oncrpc.Call{XID: xid, Head: e.Bytes()})
			if err == nil {
				d := xdr.NewDecoder(rep.Results)
				if got := d.Opaque(1 << 20); !bytes.Equal(got, arg) {
					err = errors.New("reply is not the call's argument")
				}
				rep.Release()
			}
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	ln.Close()
	tr.Close() // Serve waits for its connections to end
	if err := <-served; err != nil {
		t.Errorf("Serve after its listener closed: %v", err)
	}
}
