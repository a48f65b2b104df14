package nfsclient

import (
	"context"
	"fmt"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// This file holds what the FUSE layer (package fuse) needs beyond the
// operations in ops.go.

// plusAttrs are the attributes ReadDirPlus asks for per entry: what
// ReadDir asks for, and the file handle (RFC 8881 s5.8.1.9 filehandle
// attribute), so that a READDIRPLUS can hand the kernel complete entries
// without a LOOKUP or GETATTR per entry.
var plusAttrs = func() Bitmap {
	b := dirAttrs
	b[attrFileHandle/32] |= 1 << (attrFileHandle % 32)
	return b
}()

// ReadDirPlus reads one page of directory entries after cookie, like
// ReadDir, with each entry's file handle in Attr.FileHandle (absent when
// the server could not give it; Attr.RdattrErr then says why).
func (c *Client) ReadDirPlus(ctx context.Context, cred oncrpc.Credential, dir []byte, cookie uint64, verf [8]byte, maxBytes int) (ReadDirPage, error) {
	if maxBytes <= 0 {
		maxBytes = 64 << 10
	}
	maxBytes = min(maxBytes, c.rsize)
	var p ReadDirPage
	err := c.do(ctx, cred, putFHAnd(dir, func(cp *compound) {
		cp.readdir(cookie, verf, uint32(maxBytes), uint32(maxBytes), plusAttrs)
	}), func(r *results) (err error) {
		if err := r.voidOp(opPutFH); err != nil {
			return err
		}
		p.Entries, p.Verf, p.EOF, err = r.decodeReadDir(nil)
		return err
	})
	return p, err
}

// ReadDirPlusAll reads a whole directory with ReadDirPlus.
func (c *Client) ReadDirPlusAll(ctx context.Context, cred oncrpc.Credential, dir []byte) ([]DirEntry, error) {
	var all []DirEntry
	var cookie uint64
	var verf [8]byte
	for {
		p, err := c.ReadDirPlus(ctx, cred, dir, cookie, verf, 0)
		if err != nil {
			return all, err
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
