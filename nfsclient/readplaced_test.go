package nfsclient

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// TestReadCountBeyondPlaced: when the READ data went by Write chunk
// (Reply.BulkPlaced), only the bytes the transport saw placed
// (Reply.BulkLen) are file data (RFC 8166 s3.4.6: the rest of the buffer
// holds whatever was there before). A READ whose count exceeds them,
// including a Write chunk returned unused (nothing placed) with a count
// above 0, is an I/O error, and a count within them is returned as is.
func TestReadCountBeyondPlaced(t *testing.T) {
	rpc := oncrpc.NewClient(nil, nfsProgram, nfsVersion, oncrpc.ClientOptions{})
	for _, tc := range []struct {
		placed, count int
		ok            bool
	}{
		{0, 0, true}, // an unused Write chunk for an empty READ
		{0, 1, false},
		{0, 4096, false},
		{100, 100, true},
		{100, 99, true},
		{100, 101, false},
		{4096, 4096, true},
		{4095, 4096, false},
	} {
		t.Run(fmt.Sprintf("placed %d count %d", tc.placed, tc.count), func(t *testing.T) {
			dest := make([]byte, 4096)
			for i := range dest {
				dest[i] = 0xee // stale bytes of an earlier use of the buffer
			}
			var cp compound
			readCompound(&cp, rpc, dest)
			// SEQUENCE, PUTFH, READ: eof false, the count; the data
			// itself was reduced out of the stream.
			rep := compoundReply(t, 0, "00000003"+seqOK+"00000016 00000000"+fmt.Sprintf("00000019 00000000 00000000 %08x", tc.count))
			rep.BulkPlaced, rep.BulkLen = true, tc.placed
			var r results
			if err := r.init(&cp, rep); err != nil {
				t.Fatal(err)
			}
			if _, _, _, err := r.decodeSequence(testSession); err != nil {
				t.Fatal(err)
			}
			if err := r.voidOp(opPutFH); err != nil {
				t.Fatal(err)
			}
			n, _, err := r.decodeRead()
			if tc.ok {
				if err != nil || n != tc.count {
					t.Fatalf("READ: %d bytes, %v; want %d", n, err, tc.count)
				}
				return
			}
			if !errors.Is(err, ErrProtocol) || Errno(err) != syscall.EIO {
				t.Fatalf("READ of %d bytes with %d placed: n=%d, %v (errno %v); want an I/O error", tc.count, tc.placed, n, err, Errno(err))
			}
		})
	}
}
