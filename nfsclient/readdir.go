package nfsclient

import (
	"context"
	"fmt"
	"syscall"
	"unsafe"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// A directory's listing is read whole (readDirAll) and held in memory,
// so what a server can make it cost is bounded: in entries, and in bytes
// (an entry's struct and its strings). Both are far beyond any real
// directory (ext4's largest hold some tens of millions of names only with
// large_dir, and then no listing of them fits a FUSE daemon).
const (
	maxDirEntries = 16 << 20
	maxDirBytes   = 1 << 30
)

// ErrReadDirLoop is the error of a READDIR whose cookies repeat or do not
// advance: the listing would never end. It wraps syscall.ELOOP, what
// Linux's client returns for it ("readdir loop", fs/nfs/dir.c).
var ErrReadDirLoop = fmt.Errorf("nfs: readdir loop: %w", syscall.ELOOP)

// ErrDirTooLarge is the error of a directory whose listing exceeds
// maxDirEntries entries or maxDirBytes bytes. It wraps syscall.EFBIG.
var ErrDirTooLarge = fmt.Errorf("nfs: directory listing too large: %w", syscall.EFBIG)

type readDirFunc func(ctx context.Context, cred oncrpc.Credential, dir []byte, cookie uint64, verf [8]byte, maxBytes int) (ReadDirPage, error)

// readDirAll reads pages with page until the server says EOF. It fails
// with ErrReadDirLoop at a cookie it has seen or one the protocol
// reserves, and with ErrDirTooLarge beyond the listing's bounds.
func (c *Client) readDirAll(ctx context.Context, cred oncrpc.Credential, dir []byte, page readDirFunc) ([]DirEntry, error) {
	var all []DirEntry
	l := dirListing{maxEntries: maxDirEntries, maxBytes: maxDirBytes}
	var cookie uint64
	var verf [8]byte
	for {
		p, err := page(ctx, cred, dir, cookie, verf, 0)
		if err != nil {
			return all, err
		}
		if err := l.add(p); err != nil {
			return all, fmt.Errorf("READDIR after cookie %d: %w", cookie, err)
		}
		all = append(all, p.Entries...)
		if p.EOF {
			return all, nil
		}
		if len(p.Entries) == 0 {
			return all, fmt.Errorf("%w: READDIR returned no entries and no EOF", ErrProtocol)
		}
		cookie, verf = p.Entries[len(p.Entries)-1].Cookie, p.Verf
	}
}

// dirListing checks the pages of one directory listing as they come.
type dirListing struct {
	maxEntries, maxBytes int
	seen                 map[uint64]struct{} // the cookies of the entries so far
	entries              int
	bytes                int
}

// entryCost is what an entry costs held in memory.
func entryCost(e *DirEntry) int {
	return int(unsafe.Sizeof(*e)) + len(e.Name) + len(e.Attr.FileHandle) + len(e.Attr.Owner) + len(e.Attr.Group)
}

// add checks page p, the next of the listing.
func (l *dirListing) add(p ReadDirPage) error {
	if l.seen == nil {
		l.seen = make(map[uint64]struct{})
	}
	l.entries += len(p.Entries)
	if l.entries > l.maxEntries {
		return fmt.Errorf("%w: more than %d entries", ErrDirTooLarge, l.maxEntries)
	}
	for i := range p.Entries {
		e := &p.Entries[i]
		if l.bytes += entryCost(e); l.bytes > l.maxBytes {
			return fmt.Errorf("%w: more than %d bytes", ErrDirTooLarge, l.maxBytes)
		}
		// RFC 8881 s18.23.3: cookies 0, 1 and 2 are reserved (0 reads
		// from the start), so none is where a listing goes on; one is
		// harmless on the last entry, which is not read after.
		if e.Cookie <= 2 {
			if i == len(p.Entries)-1 && !p.EOF {
				return fmt.Errorf("%w: entry %q has the reserved cookie %d", ErrReadDirLoop, e.Name, e.Cookie)
			}
			continue
		}
		if _, ok := l.seen[e.Cookie]; ok {
			return fmt.Errorf("%w: entry %q repeats cookie %d", ErrReadDirLoop, e.Name, e.Cookie)
		}
		l.seen[e.Cookie] = struct{}{}
	}
	return nil
}
