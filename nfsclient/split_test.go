package nfsclient

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// pieceFile is a file in memory read through ReadRange, with the faults
// a real server seldom shows on demand: short replies and errors at
// chosen offsets.
type pieceFile struct {
	data      []byte
	shortAt   map[uint64]int   // a READ at this offset returns this many bytes, not at EOF
	failAt    map[uint64]error // a READ at this offset fails
	mu        sync.Mutex
	calls     []uint64
	inFlight  atomic.Int32
	maxFlight atomic.Int32
}

func (f *pieceFile) read(ctx context.Context, off uint64, dest oncrpc.View) (int, bool, error) {
	n := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for {
		m := f.maxFlight.Load()
		if n <= m || f.maxFlight.CompareAndSwap(m, n) {
			break
		}
	}
	f.mu.Lock()
	f.calls = append(f.calls, off)
	f.mu.Unlock()
	time.Sleep(time.Millisecond) // long enough for the others to be sent
	if err := ctx.Err(); err != nil {
		return 0, false, err
	}
	if err := f.failAt[off]; err != nil {
		return 0, false, err
	}
	if off >= uint64(len(f.data)) {
		return 0, true, nil
	}
	want := dest.Len()
	if k, ok := f.shortAt[off]; ok {
		want = min(want, k)
	}
	k := copy(dest.Bytes()[:want], f.data[off:])
	return k, off+uint64(k) >= uint64(len(f.data)), nil
}

func TestReadRange(t *testing.T) {
	data := make([]byte, 100_000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	errBoom := errors.New("boom")
	const size = 4096
	for _, tc := range []struct {
		name     string
		fileLen  int
		rangeLen int
		inFlight int
		shortAt  map[uint64]int
		failAt   map[uint64]error
		wantN    int
		wantErr  error
	}{
		{name: "whole range, concurrently", fileLen: 100_000, rangeLen: 64 * 1024, inFlight: 4, wantN: 64 * 1024},
		{name: "in order", fileLen: 100_000, rangeLen: 64 * 1024, inFlight: 1, wantN: 64 * 1024},
		{name: "one piece", fileLen: 100_000, rangeLen: 1000, inFlight: 8, wantN: 1000},
		{name: "the file ends inside", fileLen: 10_000, rangeLen: 64 * 1024, inFlight: 4, wantN: 10_000},
		{name: "the file ends at a piece", fileLen: 3 * size, rangeLen: 64 * 1024, inFlight: 4, wantN: 3 * size},
		{name: "a short reply, not at EOF", fileLen: 100_000, rangeLen: 64 * 1024, inFlight: 4,
			shortAt: map[uint64]int{2 * size: 100}, wantN: 64 * 1024},
		{name: "short replies in order", fileLen: 100_000, rangeLen: 5 * size, inFlight: 1,
			shortAt: map[uint64]int{0: 1, 1: 4000}, wantN: 5 * size},
		{name: "an error ends it", fileLen: 100_000, rangeLen: 64 * 1024, inFlight: 4,
			failAt: map[uint64]error{3 * size: errBoom}, wantN: 3 * size, wantErr: errBoom},
		{name: "an error at the start", fileLen: 100_000, rangeLen: 64 * 1024, inFlight: 4,
			failAt: map[uint64]error{0: errBoom}, wantN: 0, wantErr: errBoom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &pieceFile{data: data[:tc.fileLen], shortAt: tc.shortAt, failAt: tc.failAt}
			dest := make([]byte, tc.rangeLen)
			n, err := ReadRange(context.Background(), f.read, oncrpc.Plain(dest), 0, size, tc.inFlight)
			if n != tc.wantN || !errors.Is(err, tc.wantErr) {
				t.Fatalf("ReadRange = %d, %v; want %d, %v", n, err, tc.wantN, tc.wantErr)
			}
			if !bytes.Equal(dest[:n], data[:n]) {
				t.Fatalf("the %d bytes read differ from the file's", n)
			}
			if got, limit := int(f.maxFlight.Load()), max(tc.inFlight, 1); got > limit {
				t.Errorf("%d READs in flight at once, want at most %d", got, limit)
			}
			if tc.inFlight > 1 && tc.rangeLen >= 4*size && tc.failAt == nil && f.maxFlight.Load() < 2 {
				t.Errorf("the READs went one after the other (inFlight %d)", tc.inFlight)
			}
		})
	}
}

// TestReadRangeStopsSending checks that no READ is sent past the one
// that ended the range: with one slot beyond the failing piece, at most
// inFlight pieces after it can have been sent before its reply came.
func TestReadRangeStopsSending(t *testing.T) {
	const size, inFlight = 512, 2
	f := &pieceFile{data: make([]byte, 1<<20), failAt: map[uint64]error{size: errors.New("boom")}}
	n, err := ReadRange(context.Background(), f.read, oncrpc.Plain(make([]byte, 1<<20)), 0, size, inFlight)
	if n != size || err == nil {
		t.Fatalf("ReadRange = %d, %v; want %d and the error", n, err, size)
	}
	if len(f.calls) > 1+inFlight+1 {
		t.Errorf("%d READs sent for a range whose second piece failed", len(f.calls))
	}
}

func TestReadRangeCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	f := &pieceFile{data: make([]byte, 1<<20)}
	read := func(ctx context.Context, off uint64, dest oncrpc.View) (int, bool, error) {
		if off == 4096 {
			cancel()
		}
		return f.read(ctx, off, dest)
	}
	n, err := ReadRange(ctx, read, oncrpc.Plain(make([]byte, 1<<20)), 0, 4096, 2)
	if !errors.Is(err, context.Canceled) || n >= 1<<20 {
		t.Fatalf("ReadRange after cancel = %d, %v; want a partial read and context.Canceled", n, err)
	}
}
