package oncrpc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"
)

// TestReadRecordGrowsWithData: a fragment header that claims 64 MiB
// followed by a few bytes and the end of the stream costs about what
// arrived, not what was claimed.
func TestReadRecordGrowsWithData(t *testing.T) {
	var in bytes.Buffer
	binary.Write(&in, binary.BigEndian, uint32(lastFragment|64<<20))
	binary.Write(&in, binary.BigEndian, [2]uint32{7, uint32(MsgReply)}) // a reply: kept whole
	in.Write(make([]byte, 92))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := readRecord(&in, 128<<20, 4096)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("readRecord of a short fragment: %v, want io.ErrUnexpectedEOF", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 2*fragmentChunk {
		t.Fatalf("a fragment that claimed 64 MiB and sent 100 bytes allocated %d bytes", got)
	}
}
