package nfsclient

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// readDirPage encodes READDIR4resok: entries named after their cookies.
func readDirPage(e *xdr.Encoder, eof bool, cookies ...uint64) {
	e.FixedOpaque(make([]byte, 8)) // cookieverf
	for _, c := range cookies {
		e.Bool(true)
		e.Uint64(c)
		e.String(fmt.Sprintf("f%d", c))
		e.Uint32(0) // fattr4: no attributes
		e.Opaque(nil)
	}
	e.Bool(false)
	e.Bool(eof)
}

// TestReadDirLoop: a server that answers every READDIR with the same
// entry and cookie and eof=false (which kept ls looping through 441,000
// pages and 249 MiB in 3 s) ends the listing with an error that is ELOOP
// for the caller, after the second page; so does one whose cookie goes
// back to one seen, and one that goes on from a reserved cookie.
func TestReadDirLoop(t *testing.T) {
	for _, tc := range []struct {
		name  string
		page  func(e *xdr.Encoder, cookie uint64)
		pages int64
	}{
		{"same entry", func(e *xdr.Encoder, _ uint64) { readDirPage(e, false, 5) }, 2},
		{"cookie back", func(e *xdr.Encoder, cookie uint64) {
			next := map[uint64][]uint64{0: {3, 4}, 4: {5, 6}, 6: {7, 3}}
			readDirPage(e, false, next[cookie]...)
		}, 3},
		{"reserved cookie", func(e *xdr.Encoder, _ uint64) { readDirPage(e, false, 7, 0) }, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &faultServer{readDir: tc.page}
			c := dialFaultServer(t, s)
			runtime.GC()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for _, f := range []func() ([]DirEntry, error){
				func() ([]DirEntry, error) { return c.ReadDirAll(ctx, rootCred, c.RootFH()) },
				func() ([]DirEntry, error) { return c.ReadDirPlusAll(ctx, rootCred, c.RootFH()) },
			} {
				s.readDirs.Store(0)
				_, err := f()
				if !errors.Is(err, ErrReadDirLoop) || Errno(err) != syscall.ELOOP {
					t.Fatalf("listing: %v (errno %v), want ErrReadDirLoop, ELOOP", err, Errno(err))
				}
				if n := s.readDirs.Load(); n != tc.pages {
					t.Errorf("%d READDIRs, want %d", n, tc.pages)
				}
			}
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 4<<20 {
				t.Errorf("allocated %d bytes for a looping listing", grew)
			}
		})
	}
}

// TestReadDirEOFCookieZero: a reserved cookie on the last entry of the
// listing is harmless: nothing is read after it.
func TestReadDirEOFCookieZero(t *testing.T) {
	s := &faultServer{readDir: func(e *xdr.Encoder, _ uint64) { readDirPage(e, true, 3, 0) }}
	c := dialFaultServer(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ents, err := c.ReadDirAll(ctx, rootCred, c.RootFH())
	if err != nil || len(ents) != 2 {
		t.Fatalf("listing: %d entries, %v; want 2", len(ents), err)
	}
}

// TestReadDirBeyondMaxcount: a READDIR reply larger than the maxcount
// asked for (RFC 8881 s18.23.3) is a protocol error, found before its
// entries are all decoded.
func TestReadDirBeyondMaxcount(t *testing.T) {
	s := &faultServer{readDir: func(e *xdr.Encoder, _ uint64) {
		cookies := make([]uint64, 40_000) // about 1 MB of entries
		for i := range cookies {
			cookies[i] = uint64(i + 3)
		}
		readDirPage(e, true, cookies...)
	}}
	c := dialFaultServer(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ents, err := c.ReadDir(ctx, rootCred, c.RootFH(), 0, [8]byte{}, 4096)
	if !errors.Is(err, ErrProtocol) {
		t.Fatalf("READDIR of maxcount 4096 got %d entries, %v; want ErrProtocol", len(ents.Entries), err)
	}
}

// TestDirListingBounds: a listing beyond its bound in entries or in
// bytes ends with ErrDirTooLarge (EFBIG for the caller).
func TestDirListingBounds(t *testing.T) {
	page := func(first, n int) ReadDirPage {
		var p ReadDirPage
		for i := range n {
			p.Entries = append(p.Entries, DirEntry{Cookie: uint64(first + i), Name: fmt.Sprintf("name%d", first+i)})
		}
		return p
	}
	for _, tc := range []struct {
		name string
		l    dirListing
	}{
		{"entries", dirListing{maxEntries: 150, maxBytes: 1 << 30}},
		{"bytes", dirListing{maxEntries: 1 << 20, maxBytes: 150 * entryCost(&DirEntry{Name: "name100"})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.l.add(page(3, 100)); err != nil {
				t.Fatalf("first 100 entries: %v", err)
			}
			err := tc.l.add(page(103, 100))
			if !errors.Is(err, ErrDirTooLarge) || Errno(err) != syscall.EFBIG {
				t.Fatalf("200 entries: %v, want ErrDirTooLarge (EFBIG)", err)
			}
		})
	}
}
