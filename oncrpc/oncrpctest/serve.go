// Package oncrpctest serves ONC RPC over TCP for tests and benchmarks:
// the TCP counterpart of an RPC-over-RDMA responder, in front of a
// handler whose behaviour the test controls.
package oncrpctest

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// maxRecord bounds a received record: a larger one ends its connection.
const maxRecord = 64 << 20

// lastFragment marks the last fragment of a record (RFC 5531 s11).
const lastFragment = 1 << 31

// Serve answers RPC calls arriving on ln with h, over TCP record marking
// (RFC 5531 s11), until ln is closed. Calls on one connection are served
// concurrently and each reply is written whole, as one fragment. Messages
// that are not calls are ignored.
func Serve(ln net.Listener, h oncrpc.CallHandler) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("oncrpctest: accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			serveConn(nc, h)
		}()
	}
}

func serveConn(nc net.Conn, h oncrpc.CallHandler) {
	defer nc.Close()
	br := bufio.NewReaderSize(nc, 64<<10)
	var writeMu sync.Mutex
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		msg, err := readRecord(br)
		if err != nil {
			return
		}
		if mt, ok := oncrpc.MessageType(msg); !ok || mt != oncrpc.MsgCall {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			reply := h.HandleCall(msg)
			if reply == nil {
				return
			}
			var mark [4]byte
			binary.BigEndian.PutUint32(mark[:], lastFragment|uint32(len(reply)))
			bufs := net.Buffers{mark[:], reply}
			writeMu.Lock()
			_, err := bufs.WriteTo(nc)
			writeMu.Unlock()
			if r, ok := h.(oncrpc.ReplyReleaser); ok {
				r.ReleaseReply(reply)
			}
			if err != nil {
				nc.Close()
			}
		}()
	}
}

// readRecord reads one record, joining its fragments.
func readRecord(r io.Reader) ([]byte, error) {
	var msg []byte
	var mark [4]byte
	for {
		if _, err := io.ReadFull(r, mark[:]); err != nil {
			return nil, err
		}
		w := binary.BigEndian.Uint32(mark[:])
		n := int(w &^ lastFragment)
		if len(msg)+n > maxRecord {
			return nil, fmt.Errorf("oncrpctest: record of more than %d bytes", maxRecord)
		}
		msg = append(msg, make([]byte, n)...)
		if _, err := io.ReadFull(r, msg[len(msg)-n:]); err != nil {
			return nil, err
		}
		if w&lastFragment != 0 {
			return msg, nil
		}
	}
}
