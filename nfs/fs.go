package nfs

import (
	"errors"
	"io/fs"
	"os"
	"path"
)

// FS is the io/fs view of the export, or of a directory in it (Sub). Its
// calls have no context: the Client's Options.CallTimeout bounds each.
// Names are io/fs names (fs.ValidPath); anything else is fs.ErrInvalid.
// Symbolic links are followed, their absolute targets from the export's
// root, which is as far up as the client sees.
type FS struct {
	c   *Client
	dir string // below the export's root; "" for the root
}

// The io/fs interfaces FS implements.
var (
	_ fs.ReadDirFS  = (*FS)(nil)
	_ fs.StatFS     = (*FS)(nil)
	_ fs.ReadFileFS = (*FS)(nil)
	_ fs.SubFS      = (*FS)(nil)
	_ fs.ReadLinkFS = (*FS)(nil)
)

// FS returns the io/fs view of the export.
func (c *Client) FS() *FS { return &FS{c: c} }

// full is name below the export's root, or fs.ErrInvalid.
func (fsys *FS) full(op, name string) (string, error) {
	if !fs.ValidPath(name) {
		return "", &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return path.Join(fsys.dir, name), nil
}

// relErr gives the errors of a Client call the io/fs name.
func relErr(err error, name string) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return &fs.PathError{Op: pe.Op, Path: name, Err: pe.Err}
	}
	return err
}

// Open opens name for reading: an fs.File that is a *File (with ReadAt,
// Seek, and ReadDir for a directory).
func (fsys *FS) Open(name string) (fs.File, error) {
	full, err := fsys.full("open", name)
	if err != nil {
		return nil, err
	}
	ctx, cancel := fsys.c.defaultCtx()
	defer cancel()
	f, err := fsys.c.OpenFile(ctx, full, os.O_RDONLY, 0)
	if err != nil {
		return nil, relErr(err, name)
	}
	return f, nil
}

// ReadDir returns the entries of directory name, sorted by name.
func (fsys *FS) ReadDir(name string) ([]fs.DirEntry, error) {
	full, err := fsys.full("readdir", name)
	if err != nil {
		return nil, err
	}
	ctx, cancel := fsys.c.defaultCtx()
	defer cancel()
	ents, err := fsys.c.ReadDir(ctx, full)
	return ents, relErr(err, name)
}

// Stat returns the attributes of name, following symbolic links.
func (fsys *FS) Stat(name string) (fs.FileInfo, error) {
	full, err := fsys.full("stat", name)
	if err != nil {
		return nil, err
	}
	ctx, cancel := fsys.c.defaultCtx()
	defer cancel()
	fi, err := fsys.c.Stat(ctx, full)
	return fi, relErr(err, name)
}

// Lstat returns the attributes of name, not following a symbolic link.
func (fsys *FS) Lstat(name string) (fs.FileInfo, error) {
	full, err := fsys.full("lstat", name)
	if err != nil {
		return nil, err
	}
	ctx, cancel := fsys.c.defaultCtx()
	defer cancel()
	fi, err := fsys.c.Lstat(ctx, full)
	return fi, relErr(err, name)
}

// ReadLink returns the target of the symbolic link name.
func (fsys *FS) ReadLink(name string) (string, error) {
	full, err := fsys.full("readlink", name)
	if err != nil {
		return "", err
	}
	ctx, cancel := fsys.c.defaultCtx()
	defer cancel()
	target, err := fsys.c.Readlink(ctx, full)
	return target, relErr(err, name)
}

// ReadFile returns the contents of the file name.
func (fsys *FS) ReadFile(name string) ([]byte, error) {
	full, err := fsys.full("readfile", name)
	if err != nil {
		return nil, err
	}
	ctx, cancel := fsys.c.defaultCtx()
	defer cancel()
	data, err := fsys.c.ReadFile(ctx, full)
	return data, relErr(err, name)
}

// Sub returns the view of directory dir.
func (fsys *FS) Sub(dir string) (fs.FS, error) {
	full, err := fsys.full("sub", dir)
	if err != nil {
		return nil, err
	}
	return &FS{c: fsys.c, dir: full}, nil
}
