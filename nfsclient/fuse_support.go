package nfsclient

import (
	"context"

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
// the server could not give it; Attr.RdattrErr then says why). maxBytes
// 0 means 64 KiB.
func (c *Client) ReadDirPlus(ctx context.Context, cred oncrpc.Credential, dir []byte, cookie uint64, verf [8]byte, maxBytes int) (ReadDirPage, error) {
	return c.readDir(ctx, cred, dir, cookie, verf, maxBytes, 64<<10, plusAttrs)
}

// ReadDirPlusAll reads a whole directory with ReadDirPlus.
func (c *Client) ReadDirPlusAll(ctx context.Context, cred oncrpc.Credential, dir []byte) ([]DirEntry, error) {
	return c.readDirAll(ctx, cred, dir, c.ReadDirPlus)
}
