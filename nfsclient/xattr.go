package nfsclient

import (
	"context"
	"fmt"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// Extended attributes (RFC 8276). The protocol's names are those of the
// "user" namespace without the "user." prefix (RFC 8276 s5.3, as Linux's
// nfs4_xattr_user_handler strips it): callers add and strip the prefix,
// and refuse other namespaces (security., trusted., system.) with
// EOPNOTSUPP themselves. Errors map as Linux maps them: NFS4ERR_NOXATTR
// to ENODATA, NFS4ERR_XATTR2BIG to E2BIG, NFS4ERR_NOTSUPP to EOPNOTSUPP.

// XattrHow says what SetXattr may do (setxattr_option4, RFC 8276 s8.4.3).
type XattrHow uint32

// SetXattr modes: XattrCreate fails with NFS4ERR_EXIST (EEXIST) if the
// attribute exists, XattrReplace with NFS4ERR_NOXATTR (ENODATA) if it
// does not, as setxattr(2)'s XATTR_CREATE and XATTR_REPLACE.
const (
	XattrEither  XattrHow = setxattr4Either
	XattrCreate  XattrHow = setxattr4Create
	XattrReplace XattrHow = setxattr4Replace
)

// maxXattrSize bounds values and name lists asked for: Linux's
// XATTR_SIZE_MAX and XATTR_LIST_MAX.
const maxXattrSize = 64 << 10

// GetXattr returns the value of the extended attribute name of fh
// (GETXATTR, RFC 8276 s8.4.2). maxSize bounds the reply (0: 64 KiB); a
// larger value fails with NFS4ERR_XATTR2BIG (E2BIG) or NFS4ERR_TOOSMALL,
// depending on the server: the caller wanting the size asks with the
// largest.
func (c *Client) GetXattr(ctx context.Context, cred oncrpc.Credential, fh []byte, name string, maxSize int) ([]byte, error) {
	if err := c.need42("GETXATTR"); err != nil {
		return nil, err
	}
	if maxSize <= 0 || maxSize > maxXattrSize {
		maxSize = maxXattrSize
	}
	op := &getXattrOp{args: getxattr4args{name: name}}
	err := c.do(ctx, cred, func(cp *compound) {
		cp.putFH(fh)
		cp.add(op)
		cp.maxRep += maxSize
	})
	if err != nil {
		return nil, err
	}
	if len(op.res.value) > maxSize {
		return nil, &OpError{Op: "GETXATTR", Status: ErrXattr2Big}
	}
	if op.res.value == nil {
		op.res.value = []byte{}
	}
	return op.res.value, nil
}

// SetXattr sets the extended attribute name of fh to value (SETXATTR,
// RFC 8276 s8.4.3), as how allows.
func (c *Client) SetXattr(ctx context.Context, cred oncrpc.Credential, fh []byte, name string, value []byte, how XattrHow) error {
	if err := c.need42("SETXATTR"); err != nil {
		return err
	}
	if len(value) > maxXattrSize {
		return &OpError{Op: "SETXATTR", Status: ErrXattr2Big}
	}
	return c.do(ctx, cred, func(cp *compound) {
		cp.putFH(fh)
		cp.add(&setXattrOp{args: setxattr4args{option: uint32(how), key: name, value: value}})
	})
}

// ListXattrs returns the names of fh's extended attributes (LISTXATTRS,
// RFC 8276 s8.4.4), reading as many pages as the server needs.
func (c *Client) ListXattrs(ctx context.Context, cred oncrpc.Credential, fh []byte) ([]string, error) {
	if err := c.need42("LISTXATTRS"); err != nil {
		return nil, err
	}
	var names []string
	var cookie uint64
	for page := 0; ; page++ {
		op := &listXattrsOp{args: listxattrs4args{cookie: cookie, maxcount: maxXattrSize}}
		err := c.do(ctx, cred, func(cp *compound) {
			cp.putFH(fh)
			cp.add(op)
			cp.maxRep += maxXattrSize
		})
		if err != nil {
			return names, err
		}
		names = append(names, op.res.names...)
		if op.res.eof {
			return names, nil
		}
		if len(op.res.names) == 0 || page > 1024 {
			return names, fmt.Errorf("%w: LISTXATTRS returned no names and no EOF", ErrProtocol)
		}
		cookie = op.res.cookie
	}
}

// RemoveXattr removes the extended attribute name of fh (REMOVEXATTR,
// RFC 8276 s8.4.5); one that does not exist gives NFS4ERR_NOXATTR
// (ENODATA).
func (c *Client) RemoveXattr(ctx context.Context, cred oncrpc.Credential, fh []byte, name string) error {
	if err := c.need42("REMOVEXATTR"); err != nil {
		return err
	}
	return c.do(ctx, cred, func(cp *compound) {
		cp.putFH(fh)
		cp.add(&removeXattrOp{args: removexattr4args{name: name}})
	})
}
