package nfs

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/rdmafs/rdmafs/nfsclient"
)

// Stat returns the attributes of the file name, following symbolic
// links.
func (c *Client) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	n, err := c.resolve(ctx, name, true)
	if err != nil {
		return nil, pathErr("stat", name, err)
	}
	return newFileInfo(name, n.attr), nil
}

// Lstat is Stat without following a symbolic link name ends in.
func (c *Client) Lstat(ctx context.Context, name string) (fs.FileInfo, error) {
	n, err := c.resolve(ctx, name, false)
	if err != nil {
		return nil, pathErr("lstat", name, err)
	}
	return newFileInfo(name, n.attr), nil
}

// ReadDir returns the entries of directory name sorted by name, with
// their attributes (READDIR asks for them, RFC 8881 s18.23).
func (c *Client) ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	n, err := c.resolve(ctx, name, true)
	if err != nil {
		return nil, pathErr("readdirent", name, err)
	}
	ents, err := c.readDir(ctx, n)
	if err != nil {
		return nil, pathErr("readdirent", name, err)
	}
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return ents, nil
}

// readDir reads all of directory n, in the server's order.
func (c *Client) readDir(ctx context.Context, n node) ([]fs.DirEntry, error) {
	if n.attr.Type != nfsclient.TypeDir {
		return nil, syscall.ENOTDIR
	}
	all, err := c.nfs.ReadDirAll(ctx, c.cred, n.fh)
	if err != nil {
		return nil, err
	}
	ents := make([]fs.DirEntry, 0, len(all))
	for _, e := range all {
		if e.Name == "." || e.Name == ".." {
			continue
		}
		ents = append(ents, dirEntry{&fileInfo{name: e.Name, attr: e.Attr}})
	}
	return ents, nil
}

// Mkdir makes directory name with permissions perm (before the server
// applies its umask, if any).
func (c *Client) Mkdir(ctx context.Context, name string, perm fs.FileMode) error {
	dir, base, err := c.resolveParent(ctx, name, syscall.EEXIST)
	if err == nil {
		mode := modeBits(perm)
		_, err = c.nfs.Mkdir(ctx, c.cred, dir.fh, base, &nfsclient.SetAttr{Mode: &mode})
	}
	return pathErr("mkdir", name, err)
}

// MkdirAll makes directory name and the parents it lacks, as
// os.MkdirAll; a directory that exists already is no error.
func (c *Client) MkdirAll(ctx context.Context, name string, perm fs.FileMode) error {
	comps := components(name)
	for i := range comps {
		p := strings.Join(comps[:i+1], "/")
		err := c.Mkdir(ctx, p, perm)
		if err == nil {
			continue
		}
		if !errors.Is(err, fs.ErrExist) {
			return err
		}
		fi, serr := c.Stat(ctx, p)
		if serr != nil {
			return serr
		}
		if !fi.IsDir() {
			return pathErr("mkdir", p, syscall.ENOTDIR)
		}
	}
	return nil
}

// Remove removes the file or empty directory name (REMOVE, RFC 8881
// s18.25, removes either).
func (c *Client) Remove(ctx context.Context, name string) error {
	dir, base, err := c.resolveParent(ctx, name, syscall.EBUSY)
	if err == nil {
		_, err = c.nfs.Remove(ctx, c.cred, dir.fh, base)
	}
	return pathErr("remove", name, err)
}

// RemoveAll removes name and everything below it, as os.RemoveAll: a
// name that does not exist is no error.
func (c *Client) RemoveAll(ctx context.Context, name string) error {
	fi, err := c.Lstat(ctx, name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		ents, err := c.ReadDir(ctx, name)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := c.RemoveAll(ctx, strings.TrimSuffix(name, "/")+"/"+e.Name()); err != nil {
				return err
			}
		}
	}
	err = c.Remove(ctx, name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// Rename renames oldname to newname, replacing newname if it exists and
// may be replaced (RENAME, RFC 8881 s18.26).
func (c *Client) Rename(ctx context.Context, oldname, newname string) error {
	odir, obase, err := c.resolveParent(ctx, oldname, syscall.EBUSY)
	if err != nil {
		return linkErr("rename", oldname, newname, err)
	}
	ndir, nbase, err := c.resolveParent(ctx, newname, syscall.EBUSY)
	if err != nil {
		return linkErr("rename", oldname, newname, err)
	}
	_, _, err = c.nfs.Rename(ctx, c.cred, odir.fh, obase, ndir.fh, nbase)
	return linkErr("rename", oldname, newname, err)
}

// Symlink makes newname a symbolic link to oldname.
func (c *Client) Symlink(ctx context.Context, oldname, newname string) error {
	dir, base, err := c.resolveParent(ctx, newname, syscall.EEXIST)
	if err == nil {
		_, err = c.nfs.Symlink(ctx, c.cred, dir.fh, base, oldname, nil)
	}
	return linkErr("symlink", oldname, newname, err)
}

// Link makes newname a hard link to the file oldname.
func (c *Client) Link(ctx context.Context, oldname, newname string) error {
	src, err := c.resolve(ctx, oldname, false)
	if err != nil {
		return linkErr("link", oldname, newname, err)
	}
	dir, base, err := c.resolveParent(ctx, newname, syscall.EEXIST)
	if err == nil {
		_, _, err = c.nfs.Link(ctx, c.cred, src.fh, dir.fh, base)
	}
	return linkErr("link", oldname, newname, err)
}

// Readlink returns the target of the symbolic link name.
func (c *Client) Readlink(ctx context.Context, name string) (string, error) {
	n, err := c.resolve(ctx, name, false)
	if err != nil {
		return "", pathErr("readlink", name, err)
	}
	if n.attr.Type != nfsclient.TypeLnk {
		return "", pathErr("readlink", name, syscall.EINVAL)
	}
	target, err := c.nfs.Readlink(ctx, c.cred, n.fh)
	if err != nil {
		return "", pathErr("readlink", name, err)
	}
	return target, nil
}

// setAttr sends SETATTR (RFC 8881 s18.30) for the file name, following
// symbolic links, with the anonymous stateid.
func (c *Client) setAttr(ctx context.Context, op, name string, sa *nfsclient.SetAttr) error {
	n, err := c.resolve(ctx, name, true)
	if err == nil {
		_, err = c.nfs.SetAttr(ctx, c.cred, n.fh, nfsclient.StateID{}, sa)
	}
	return pathErr(op, name, err)
}

// Chmod sets the permission, setuid, setgid and sticky bits of name.
func (c *Client) Chmod(ctx context.Context, name string, mode fs.FileMode) error {
	m := modeBits(mode)
	return c.setAttr(ctx, "chmod", name, &nfsclient.SetAttr{Mode: &m})
}

// Chown sets the owner and group of name; -1 leaves one as it is.
func (c *Client) Chown(ctx context.Context, name string, uid, gid int) error {
	var sa nfsclient.SetAttr
	if uid >= 0 {
		u := uint32(uid)
		sa.UID = &u
	}
	if gid >= 0 {
		g := uint32(gid)
		sa.GID = &g
	}
	if sa.Empty() {
		return nil
	}
	return c.setAttr(ctx, "chown", name, &sa)
}

// Chtimes sets the access and modification times of name; a zero
// time.Time leaves that one as it is (as os.Chtimes).
func (c *Client) Chtimes(ctx context.Context, name string, atime, mtime time.Time) error {
	var sa nfsclient.SetAttr
	if !atime.IsZero() {
		sa.Atime = &atime
	}
	if !mtime.IsZero() {
		sa.Mtime = &mtime
	}
	if sa.Empty() {
		return nil
	}
	return c.setAttr(ctx, "chtimes", name, &sa)
}

// Truncate sets the size of the file name.
func (c *Client) Truncate(ctx context.Context, name string, size int64) error {
	if size < 0 {
		return pathErr("truncate", name, syscall.EINVAL)
	}
	s := uint64(size)
	return c.setAttr(ctx, "truncate", name, &nfsclient.SetAttr{Size: &s})
}

// ReadFile returns the contents of the file name.
func (c *Client) ReadFile(ctx context.Context, name string) ([]byte, error) {
	f, err := c.OpenFile(ctx, name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	data, err := f.readAll(ctx)
	if cerr := f.CloseContext(ctx); err == nil {
		err = cerr
	}
	return data, err
}

// WriteFile writes data to the file name, creating it with perm if it
// does not exist and truncating it if it does, and makes it stable on
// the server.
func (c *Client) WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	f, err := c.OpenFile(ctx, name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	_, err = f.WriteAtContext(ctx, data, 0)
	if cerr := f.CloseContext(ctx); err == nil {
		err = cerr
	}
	return err
}
