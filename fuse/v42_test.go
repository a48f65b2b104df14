package fuse

import (
	"bytes"
	"math"
	"reflect"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/nfsclient"
)

func TestFallocPlan(t *testing.T) {
	const size = 10000
	alloc := func(off, n uint64) fallocStep { return fallocStep{off: off, length: n} }
	dealloc := func(off, n uint64) fallocStep { return fallocStep{dealloc: true, off: off, length: n} }
	for _, tc := range []struct {
		name      string
		mode      uint32
		off, n    uint64
		want      []fallocStep
		errno     syscall.Errno
		needsSize bool
	}{
		{name: "allocate", mode: 0, off: 4096, n: 20000, want: []fallocStep{alloc(4096, 20000)}},
		{name: "keep size inside", mode: unix.FALLOC_FL_KEEP_SIZE, off: 0, n: 4096, want: []fallocStep{alloc(0, 4096)}, needsSize: true},
		{name: "keep size across the end", mode: unix.FALLOC_FL_KEEP_SIZE, off: 8192, n: 8192, want: []fallocStep{alloc(8192, size-8192)}, needsSize: true},
		{name: "keep size past the end", mode: unix.FALLOC_FL_KEEP_SIZE, off: size, n: 8192, want: nil, needsSize: true},
		{name: "punch", mode: unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE, off: 4096, n: 1 << 40, want: []fallocStep{dealloc(4096, 1<<40)}},
		{name: "zero", mode: unix.FALLOC_FL_ZERO_RANGE, off: 8192, n: 8192, want: []fallocStep{dealloc(8192, 8192), alloc(8192, 8192)}},
		{name: "zero keep size", mode: unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE, off: 8192, n: 8192, want: []fallocStep{dealloc(8192, 8192), alloc(8192, size-8192)}, needsSize: true},
		{name: "zero keep size past the end", mode: unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE, off: size + 1, n: 10, want: []fallocStep{dealloc(size+1, 10)}, needsSize: true},
		{name: "punch without keep size", mode: unix.FALLOC_FL_PUNCH_HOLE, off: 0, n: 1, errno: syscall.EOPNOTSUPP},
		{name: "collapse", mode: unix.FALLOC_FL_COLLAPSE_RANGE, off: 0, n: 4096, errno: syscall.EOPNOTSUPP},
		{name: "insert", mode: unix.FALLOC_FL_INSERT_RANGE, off: 0, n: 4096, errno: syscall.EOPNOTSUPP},
		{name: "unshare", mode: unix.FALLOC_FL_UNSHARE_RANGE, off: 0, n: 4096, errno: syscall.EOPNOTSUPP},
		{name: "zero length", mode: 0, off: 0, n: 0, errno: syscall.EINVAL},
		{name: "past the largest offset", mode: 0, off: math.MaxInt64 - 10, n: 11, errno: syscall.EFBIG},
		{name: "offset overflow", mode: 0, off: math.MaxUint64 - 1, n: 4, errno: syscall.EFBIG},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, errno := fallocPlan(tc.mode, tc.off, tc.n, size)
			if errno != tc.errno || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("fallocPlan(%#x, %d, %d, %d) = %v, %v; want %v, %v", tc.mode, tc.off, tc.n, size, got, errno, tc.want, tc.errno)
			}
			if tc.errno == 0 && fallocNeedsSize(tc.mode) != tc.needsSize {
				t.Errorf("fallocNeedsSize(%#x) = %v", tc.mode, !tc.needsSize)
			}
		})
	}
}

func TestXattrName(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		errno    syscall.Errno
	}{
		{in: "user.foo", want: "foo"},
		{in: "user.a.b", want: "a.b"},
		{in: "user.", errno: syscall.EINVAL},
		{in: "security.selinux", errno: syscall.EOPNOTSUPP},
		{in: "security.capability", errno: syscall.EOPNOTSUPP},
		{in: "trusted.overlay.opaque", errno: syscall.EOPNOTSUPP},
		{in: "system.posix_acl_access", errno: syscall.EOPNOTSUPP},
		{in: "foo", errno: syscall.EOPNOTSUPP},
		{in: "User.foo", errno: syscall.EOPNOTSUPP},
	} {
		got, errno := xattrName(tc.in)
		if got != tc.want || errno != tc.errno {
			t.Errorf("xattrName(%q) = %q, %v; want %q, %v", tc.in, got, errno, tc.want, tc.errno)
		}
	}
}

func TestSetxattrHow(t *testing.T) {
	for _, tc := range []struct {
		flags uint32
		want  nfsclient.XattrHow
		errno syscall.Errno
	}{
		{0, nfsclient.XattrEither, 0},
		{unix.XATTR_CREATE, nfsclient.XattrCreate, 0},
		{unix.XATTR_REPLACE, nfsclient.XattrReplace, 0},
		{unix.XATTR_CREATE | unix.XATTR_REPLACE, nfsclient.XattrCreate, 0},
		{4, 0, syscall.EINVAL},
	} {
		got, errno := setxattrHow(tc.flags)
		if got != tc.want || errno != tc.errno {
			t.Errorf("setxattrHow(%d) = %d, %v; want %d, %v", tc.flags, got, errno, tc.want, tc.errno)
		}
	}
}

func TestAppendXattrNames(t *testing.T) {
	got := appendXattrNames([]byte("user.a\x00"), []string{"b", "", "c\x00d", "e.f"})
	if want := []byte("user.a\x00user.b\x00user.e.f\x00"); !bytes.Equal(got, want) {
		t.Errorf("appendXattrNames = %q, want %q", got, want)
	}
}
