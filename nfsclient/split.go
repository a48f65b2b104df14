package nfsclient

import (
	"context"
	"sync"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// Splitting a read into READs: the mount (package fuse) and the library
// (package nfs) both read a range larger than the session's rsize, and
// both do it here, so that short replies are handled one way.

// ReadPiece reads one piece of a range: up to dest.Len() bytes at off
// into dest, reporting end of file as READ does (RFC 8881 s18.22.4).
// Client.Read with its credential, filehandle and stateid bound is one.
type ReadPiece func(ctx context.Context, off uint64, dest oncrpc.View) (n int, eof bool, err error)

// ReadRange fills dest with the bytes of the file at off, read by read
// in pieces of at most size bytes (the session's rsize), up to inFlight
// of them at once (at most one: one after the other). It returns how many
// bytes it read from off without a gap: fewer than dest.Len() with a nil
// error means the file ends there.
//
// A READ may return fewer bytes than asked without being at the end of
// the file (RFC 8881 s18.22.4: after a "short read" "the client should
// send another READ to get the remaining data"). The rest of the range
// is then read in order after the short piece, and what pieces beyond it
// brought is not used. The first
// error ends the read, with the bytes before it.
func ReadRange(ctx context.Context, read ReadPiece, dest oncrpc.View, off uint64, size, inFlight int) (int, error) {
	if size <= 0 {
		size = dest.Len()
	}
	if inFlight <= 1 || dest.Len() <= size {
		return readInOrder(ctx, read, dest, off, size)
	}
	pieces := readConcurrently(ctx, read, dest, off, size, inFlight)
	total := 0
	for i, p := range pieces {
		if p.err != nil {
			return total, p.err
		}
		total += p.n
		if p.eof || p.n == 0 {
			return total, nil
		}
		if want := min(dest.Len(), (i+1)*size) - i*size; p.n < want {
			n, err := readInOrder(ctx, read, dest.Slice(total, dest.Len()), off+uint64(total), size)
			return total + n, err
		}
	}
	if total < dest.Len() {
		// Not every piece was sent: the context ended first.
		return total, ctx.Err()
	}
	return total, nil
}

// readInOrder fills dest with pieces read one after the other.
func readInOrder(ctx context.Context, read ReadPiece, dest oncrpc.View, off uint64, size int) (int, error) {
	total := 0
	for total < dest.Len() {
		n, eof, err := read(ctx, off+uint64(total), dest.Slice(total, min(dest.Len(), total+size)))
		if err != nil {
			return total, err
		}
		total += n
		if eof || n == 0 {
			break
		}
	}
	return total, nil
}

// piece is what one READ of readConcurrently brought.
type piece struct {
	n   int
	eof bool
	err error
}

// readConcurrently reads dest in pieces of size bytes, up to inFlight at
// once, in order of offset. It sends no piece after one that ended the
// range (an error, end of file, a short reply) and returns the pieces it
// sent, in order; every one of them has completed.
func readConcurrently(ctx context.Context, read ReadPiece, dest oncrpc.View, off uint64, size, inFlight int) []piece {
	count := (dest.Len() + size - 1) / size
	pieces := make([]piece, count)
	slots := make(chan struct{}, inFlight)
	var mu sync.Mutex
	last := count // the first piece that ended the range
	var wg sync.WaitGroup
	sent := 0
send:
	for ; sent < count; sent++ {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			break send
		}
		mu.Lock()
		ended := last < sent
		mu.Unlock()
		if ended {
			<-slots
			break
		}
		i := sent
		wg.Go(func() {
			defer func() { <-slots }()
			lo := i * size
			hi := min(dest.Len(), lo+size)
			n, eof, err := read(ctx, off+uint64(lo), dest.Slice(lo, hi))
			pieces[i] = piece{n, eof, err}
			if err != nil || eof || n < hi-lo {
				mu.Lock()
				last = min(last, i)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return pieces[:sent]
}
