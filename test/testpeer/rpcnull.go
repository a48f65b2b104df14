package testpeer

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"time"
)

// NFS RPC program and version answered by NullCall.
const (
	nfsProgram = 100003
	nfsVersion = 4
)

// NullCall sends an ONC RPC NULL call (program 100003 version 4, procedure
// 0, AUTH_NONE) with record marking over a new TCP connection to addr and
// checks the reply: same XID, MSG_ACCEPTED, accept_stat SUCCESS. It is a
// cheap liveness check of an NFSv4 server.
func NullCall(ctx context.Context, addr string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("testpeer: NULL call to %s: %w", addr, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	} else {
		conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	xid := rand.Uint32()
	if err := writeNullCall(conn, xid); err != nil {
		return fmt.Errorf("testpeer: NULL call to %s: %w", addr, err)
	}
	if err := readNullReply(conn, xid); err != nil {
		return fmt.Errorf("testpeer: NULL call to %s: %w", addr, err)
	}
	return nil
}

// writeNullCall writes one record-marked RPC call message (RFC 5531).
func writeNullCall(w io.Writer, xid uint32) error {
	body := []uint32{
		xid,
		0, // msg_type CALL
		2, // rpcvers
		nfsProgram,
		nfsVersion,
		0,    // proc NULL
		0, 0, // cred AUTH_NONE, length 0
		0, 0, // verf AUTH_NONE, length 0
	}
	buf := make([]byte, 4+4*len(body))
	binary.BigEndian.PutUint32(buf, 0x80000000|uint32(4*len(body))) // last fragment
	for i, v := range body {
		binary.BigEndian.PutUint32(buf[4+4*i:], v)
	}
	_, err := w.Write(buf)
	return err
}

// readNullReply reads one record (all fragments) and checks it is a
// successful accepted reply to xid.
func readNullReply(r io.Reader, xid uint32) error {
	var rec []byte
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return fmt.Errorf("read record mark: %w", err)
		}
		mark := binary.BigEndian.Uint32(hdr[:])
		n := mark & 0x7fffffff
		if n > 1<<20 {
			return fmt.Errorf("reply fragment of %d bytes", n)
		}
		frag := make([]byte, n)
		if _, err := io.ReadFull(r, frag); err != nil {
			return fmt.Errorf("read reply: %w", err)
		}
		rec = append(rec, frag...)
		if mark&0x80000000 != 0 {
			break
		}
	}
	word := func(i int) uint32 { return binary.BigEndian.Uint32(rec[4*i:]) }
	if len(rec) < 4*6 {
		return fmt.Errorf("short reply (%d bytes)", len(rec))
	}
	if got := word(0); got != xid {
		return fmt.Errorf("reply xid %#x, want %#x", got, xid)
	}
	if word(1) != 1 {
		return fmt.Errorf("msg_type %d, want REPLY (1)", word(1))
	}
	if word(2) != 0 {
		return fmt.Errorf("reply_stat %d, want MSG_ACCEPTED (0)", word(2))
	}
	// verf: flavor, length, body (padded to 4 bytes)
	vlen := int(word(4))
	i := 5 + (vlen+3)/4
	if len(rec) < 4*(i+1) {
		return fmt.Errorf("short reply (%d bytes)", len(rec))
	}
	if st := word(i); st != 0 {
		return fmt.Errorf("accept_stat %d, want SUCCESS (0)", st)
	}
	return nil
}
