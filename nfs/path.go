package nfs

import (
	"context"
	"io/fs"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/rdmafs/rdmafs/nfsclient"
)

// maxSymlinks bounds the symbolic links one path resolution follows
// (Linux's MAXSYMLINKS); more is ELOOP.
const maxSymlinks = 40

// node is a resolved file: its handle and, when attrOK, its attributes.
type node struct {
	fh     []byte
	attr   nfsclient.Attr
	attrOK bool
}

// components splits a path into its names, after cleaning it as a path
// from the export's root ("" and "." are the root; ".." stops there).
func components(name string) []string {
	p := path.Clean("/" + name)
	if p == "/" {
		return nil
	}
	return strings.Split(p[1:], "/")
}

// resolve looks name up one component at a time (LOOKUP, RFC 8881
// s18.15), following symbolic links on the way and, with follow, the
// last one too. A link's absolute target is taken from the export's
// root, which is as far up as this client sees.
func (c *Client) resolve(ctx context.Context, name string, follow bool) (node, error) {
	root := node{fh: c.nfs.RootFH()}
	stack := []node{root}
	todo := components(name)
	links := 0
	for len(todo) > 0 {
		comp := todo[0]
		todo = todo[1:]
		if comp == ".." {
			if len(stack) > 1 {
				stack = stack[:len(stack)-1]
			}
			continue
		}
		if comp == "." || comp == "" {
			continue
		}
		fh, attr, err := c.nfs.Lookup(ctx, c.cred, stack[len(stack)-1].fh, comp)
		if err != nil {
			return node{}, err
		}
		if attr.Type == nfsclient.TypeLnk && (len(todo) > 0 || follow) {
			if links++; links > maxSymlinks {
				return node{}, syscall.ELOOP
			}
			target, err := c.nfs.Readlink(ctx, c.cred, fh)
			if err != nil {
				return node{}, err
			}
			if strings.HasPrefix(target, "/") {
				stack = stack[:1]
			}
			todo = append(strings.Split(target, "/"), todo...)
			continue
		}
		stack = append(stack, node{fh: fh, attr: attr, attrOK: true})
	}
	n := stack[len(stack)-1]
	if !n.attrOK {
		attr, err := c.nfs.GetAttr(ctx, c.cred, n.fh)
		if err != nil {
			return node{}, err
		}
		n.attr, n.attrOK = attr, true
	}
	return n, nil
}

// resolveParent resolves the directory name is in and returns it with
// name's last component. The root has no parent: EEXIST for the
// operations that would make it, EBUSY for those that would remove it.
func (c *Client) resolveParent(ctx context.Context, name string, rootErr syscall.Errno) (node, string, error) {
	comps := components(name)
	if len(comps) == 0 {
		return node{}, "", rootErr
	}
	dir, err := c.resolve(ctx, strings.Join(comps[:len(comps)-1], "/"), true)
	if err != nil {
		return node{}, "", err
	}
	if dir.attr.Type != nfsclient.TypeDir {
		return node{}, "", syscall.ENOTDIR
	}
	return dir, comps[len(comps)-1], nil
}

// fileInfo is the fs.FileInfo of NFS attributes.
type fileInfo struct {
	name string
	attr nfsclient.Attr
}

func newFileInfo(name string, attr nfsclient.Attr) *fileInfo {
	base := path.Base("/" + name)
	if base == "/" {
		base = "."
	}
	return &fileInfo{name: base, attr: attr}
}

func (fi *fileInfo) Name() string       { return fi.name }
func (fi *fileInfo) Size() int64        { return int64(fi.attr.Size) }
func (fi *fileInfo) Mode() fs.FileMode  { return fileMode(fi.attr) }
func (fi *fileInfo) ModTime() time.Time { return fi.attr.Mtime }
func (fi *fileInfo) IsDir() bool        { return fi.attr.Type == nfsclient.TypeDir }

// Sys returns the *nfsclient.Attr the server sent: owner, group, change
// attribute, file ID, times.
func (fi *fileInfo) Sys() any { return &fi.attr }

// fileMode maps the NFS type and mode attributes (RFC 8881 s5.8.1.2,
// s6.2.4: mode bits as in POSIX) to an fs.FileMode.
func fileMode(a nfsclient.Attr) fs.FileMode {
	m := fs.FileMode(a.Mode & 0o777)
	if a.Mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if a.Mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if a.Mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	switch a.Type {
	case nfsclient.TypeDir, nfsclient.TypeAttrDir:
		m |= fs.ModeDir
	case nfsclient.TypeLnk:
		m |= fs.ModeSymlink
	case nfsclient.TypeBlk:
		m |= fs.ModeDevice
	case nfsclient.TypeChr:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case nfsclient.TypeSock:
		m |= fs.ModeSocket
	case nfsclient.TypeFifo:
		m |= fs.ModeNamedPipe
	}
	return m
}

// modeBits is the NFS mode attribute of perm (permission, setuid,
// setgid and sticky bits).
func modeBits(perm fs.FileMode) uint32 {
	m := uint32(perm.Perm())
	if perm&fs.ModeSetuid != 0 {
		m |= 0o4000
	}
	if perm&fs.ModeSetgid != 0 {
		m |= 0o2000
	}
	if perm&fs.ModeSticky != 0 {
		m |= 0o1000
	}
	return m
}

// dirEntry is an fs.DirEntry from a READDIR entry's attributes.
type dirEntry struct{ info *fileInfo }

func (d dirEntry) Name() string               { return d.info.name }
func (d dirEntry) IsDir() bool                { return d.info.IsDir() }
func (d dirEntry) Type() fs.FileMode          { return d.info.Mode().Type() }
func (d dirEntry) Info() (fs.FileInfo, error) { return d.info, nil }
func (d dirEntry) String() string             { return fs.FormatDirEntry(d) }
