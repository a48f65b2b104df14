package fuse

import (
	"context"
	"syscall"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// Name and path limits. FUSE lets names of up to 1024 bytes through
// (FUSE_NAME_MAX); the server's limit is its FATTR4_MAXNAME, which the
// Linux client caps at NFS4_MAXNAMLEN (255, fs/nfs/nfs4client.c) because
// servers over-report: nfs-ganesha says 1024 and its VFS backend refuses
// names over 255.
const (
	nfs4MaxNameLen = 255
	pathMax        = 4096 // PATH_MAX, with the terminating NUL
)

// loadNameMax fetches FATTR4_MAXNAME (RFC 8881 s5.8.2.21) of the export
// once, at mount.
func (f *FS) loadNameMax(ctx context.Context, cred oncrpc.Credential) {
	f.nameMax = nfs4MaxNameLen
	a, err := f.c.StatFS(ctx, cred, f.c.RootFH())
	if err == nil && a.MaxName > 0 && a.MaxName < nfs4MaxNameLen {
		f.nameMax = int(a.MaxName)
	}
}

// checkName refuses a name longer than the server takes, without a round
// trip (ENAMETOOLONG, as a local file system says).
func (f *FS) checkName(names ...string) syscall.Errno {
	for _, name := range names {
		if len(name) > f.nameMax {
			return syscall.ENAMETOOLONG
		}
	}
	return 0
}

// checkPath refuses a symlink target longer than PATH_MAX.
func checkPath(p string) syscall.Errno {
	if len(p) >= pathMax {
		return syscall.ENAMETOOLONG
	}
	return 0
}
