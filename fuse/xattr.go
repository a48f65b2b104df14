package fuse

import (
	"context"
	"errors"
	"strings"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/nfsclient"
)

var (
	_ = (fs.NodeGetxattrer)((*node)(nil))
	_ = (fs.NodeSetxattrer)((*node)(nil))
	_ = (fs.NodeListxattrer)((*node)(nil))
	_ = (fs.NodeRemovexattrer)((*node)(nil))
)

// userPrefix is the one xattr namespace NFSv4.2 carries: RFC 8276 s5.2
// extended attributes are user data, without Linux's namespace prefix
// (Linux's client serves only its "user." handler with them).
const userPrefix = "user."

// Linux limits (include/uapi/linux/limits.h).
const (
	xattrSizeMax = 65536 // XATTR_SIZE_MAX: largest value
	xattrListMax = 65536 // XATTR_LIST_MAX: largest list
)

// xattrName returns the NFS name of a Linux xattr name: its part after
// "user.". Other namespaces (security, trusted, system) and names
// without one have no NFS counterpart: EOPNOTSUPP, as Linux's client
// answers (no xattr handler of its own takes them). "user." alone is
// EINVAL, as the VFS answers (xattr_resolve_name).
func xattrName(name string) (string, syscall.Errno) {
	rest, ok := strings.CutPrefix(name, userPrefix)
	if !ok {
		return "", syscall.EOPNOTSUPP
	}
	if rest == "" {
		return "", syscall.EINVAL
	}
	return rest, 0
}

// xattrErrno maps an error of an RFC 8276 operation as any other
// (nfsclient.Errno: NFS4ERR_NOXATTR is ENODATA, NFS4ERR_XATTR2BIG E2BIG,
// as Linux's nfs4_stat_to_errno). A server that answers NFS4ERR_NOTSUPP
// has no xattrs: the mount stops asking.
func (n *node) xattrErrno(op string, err error) syscall.Errno {
	var st nfsclient.Status
	if errors.As(err, &st) && st == nfsclient.ErrNotSupp {
		n.fsys.v42.noXattr.Store(true)
	}
	return n.errno(op, err)
}

// xattrOK reports whether the server may have xattrs at all.
func (v *v42State) xattrOK() bool { return v.ops != nil && !v.noXattr.Load() }

// Getxattr sends GETXATTR. dest empty asks for the value's size; a
// value larger than dest is ERANGE (getxattr(2)).
func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	name, errno := xattrName(attr)
	if errno != 0 {
		return 0, errno
	}
	v := &n.fsys.v42
	if !v.xattrOK() {
		return 0, syscall.EOPNOTSUPP
	}
	// The whole value, whatever dest holds: its size is asked for, or
	// ERANGE answered (a smaller maxSize would be the server's XATTR2BIG).
	val, err := v.ops.GetXattr(ctx, n.fsys.cred(ctx), n.handle(), name, xattrSizeMax)
	if n.fsys.tr.On(trace.FUSE) {
		n.fsys.trace("GETXATTR ino=%d name=%q size=%d len=%d err=%v", n.StableAttr().Ino, name, len(dest), len(val), err)
	}
	if err != nil {
		return 0, n.xattrErrno("GETXATTR", err)
	}
	if len(val) > xattrSizeMax {
		return 0, syscall.E2BIG
	}
	if len(dest) == 0 {
		return uint32(len(val)), 0
	}
	if len(val) > len(dest) {
		return uint32(len(val)), syscall.ERANGE
	}
	return uint32(copy(dest, val)), 0
}

// setxattrHow maps setxattr(2)'s flags to SETXATTR's how (RFC 8276
// s8.3): XATTR_CREATE fails on an existing name (EEXIST), XATTR_REPLACE
// on a missing one (ENODATA); CREATE wins when both are given, as in
// Linux's nfs4_xattr_set_nfs4_user.
func setxattrHow(flags uint32) (nfsclient.XattrHow, syscall.Errno) {
	if flags&^uint32(unix.XATTR_CREATE|unix.XATTR_REPLACE) != 0 {
		return 0, syscall.EINVAL
	}
	switch {
	case flags&unix.XATTR_CREATE != 0:
		return nfsclient.XattrCreate, 0
	case flags&unix.XATTR_REPLACE != 0:
		return nfsclient.XattrReplace, 0
	}
	return nfsclient.XattrEither, 0
}

// Setxattr sends SETXATTR.
func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	ctx = uninterrupted(ctx)
	name, errno := xattrName(attr)
	if errno != 0 {
		return errno
	}
	how, errno := setxattrHow(flags)
	if errno != 0 {
		return errno
	}
	if len(data) > xattrSizeMax {
		return syscall.E2BIG
	}
	v := &n.fsys.v42
	if !v.xattrOK() {
		return syscall.EOPNOTSUPP
	}
	err := v.ops.SetXattr(ctx, n.fsys.cred(ctx), n.handle(), name, data, how)
	if n.fsys.tr.On(trace.FUSE) {
		n.fsys.trace("SETXATTR ino=%d name=%q len=%d how=%d err=%v", n.StableAttr().Ino, name, len(data), how, err)
	}
	// The ctime moved (or may have): the next stat asks the server.
	n.invalidateAttr()
	if err != nil {
		return n.xattrErrno("SETXATTR", err)
	}
	return 0
}

// Removexattr sends REMOVEXATTR; a missing name is ENODATA.
func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	ctx = uninterrupted(ctx)
	name, errno := xattrName(attr)
	if errno != 0 {
		return errno
	}
	v := &n.fsys.v42
	if !v.xattrOK() {
		return syscall.EOPNOTSUPP
	}
	err := v.ops.RemoveXattr(ctx, n.fsys.cred(ctx), n.handle(), name)
	if n.fsys.tr.On(trace.FUSE) {
		n.fsys.trace("REMOVEXATTR ino=%d name=%q err=%v", n.StableAttr().Ino, name, err)
	}
	n.invalidateAttr()
	if err != nil {
		return n.xattrErrno("REMOVEXATTR", err)
	}
	return 0
}

// Listxattr sends LISTXATTRS (all pages) and lists the names with
// "user." in front, each NUL-terminated (listxattr(2)). dest empty asks
// for the list's size; a list larger than dest is ERANGE, one larger than
// Linux lists at all E2BIG. A server without xattrs has an empty list,
// as under Linux's client.
func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	v := &n.fsys.v42
	if !v.xattrOK() {
		return 0, 0
	}
	names, err := v.ops.ListXattrs(ctx, n.fsys.cred(ctx), n.handle())
	if n.fsys.tr.On(trace.FUSE) {
		n.fsys.trace("LISTXATTRS ino=%d -> names=%d err=%v", n.StableAttr().Ino, len(names), err)
	}
	if err != nil {
		if notSupp(err) {
			v.noXattr.Store(true)
			return 0, 0
		}
		return 0, n.xattrErrno("LISTXATTRS", err)
	}
	list := appendXattrNames(nil, names)
	if len(list) > xattrListMax {
		return 0, syscall.E2BIG
	}
	if len(dest) == 0 {
		return uint32(len(list)), 0
	}
	if len(list) > len(dest) {
		return uint32(len(list)), syscall.ERANGE
	}
	return uint32(copy(dest, list)), 0
}

// appendXattrNames appends "user."+name+NUL for each name a server
// listed, leaving out names a Linux name cannot carry (empty, or with a
// NUL in them).
func appendXattrNames(list []byte, names []string) []byte {
	for _, nm := range names {
		if nm == "" || strings.IndexByte(nm, 0) >= 0 {
			continue
		}
		list = append(list, userPrefix...)
		list = append(list, nm...)
		list = append(list, 0)
	}
	return list
}
