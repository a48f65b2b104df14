package main

import (
	"context"
	"fmt"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"
)

// The FUSE floor is go-fuse's loopback without FUSE passthrough. go-fuse
// hands the kernel the backing file of every loopback file it opens
// (FOPEN_PASSTHROUGH, Linux 6.9+, as root), and the kernel then reads and
// writes it without a FUSE request: no server work at all, which no NFS
// client can match. floorNode and floorFile keep every read and write a
// FUSE request served by this process.

// floorNode is a loopback node whose files are floorFiles.
type floorNode struct {
	*fs.LoopbackNode
}

var (
	_ fs.NodeOpener      = (*floorNode)(nil)
	_ fs.NodeCreater     = (*floorNode)(nil)
	_ fs.NodeWrapChilder = (*floorNode)(nil)
)

// newFloorRoot returns the root of a loopback of path made of floorNodes.
func newFloorRoot(path string) (fs.InodeEmbedder, error) {
	root, err := fs.NewLoopbackRoot(path)
	if err != nil {
		return nil, fmt.Errorf("loopback root %s: %w", path, err)
	}
	ln, ok := root.(*fs.LoopbackNode)
	if !ok {
		return nil, fmt.Errorf("loopback root %s: unexpected node type %T", path, root)
	}
	return &floorNode{ln}, nil
}

// WrapChild makes every node below the root a floorNode too.
func (n *floorNode) WrapChild(_ context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	if ln, ok := ops.(*fs.LoopbackNode); ok {
		return &floorNode{ln}
	}
	return ops
}

func (n *floorNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	return noPassthrough(fh), fuseFlags, errno
}

func (n *floorNode) Create(ctx context.Context, name string, flags, mode uint32, out *gofuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	inode, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	return inode, noPassthrough(fh), fuseFlags, errno
}

// floorFile is a loopback file that does not implement
// fs.FilePassthroughFder: its PassthroughFd field hides the embedded
// method of that name, so go-fuse serves its reads and writes itself.
type floorFile struct {
	*fs.LoopbackFile
	PassthroughFd struct{}
}

func noPassthrough(fh fs.FileHandle) fs.FileHandle {
	if lf, ok := fh.(*fs.LoopbackFile); ok {
		return &floorFile{LoopbackFile: lf}
	}
	return fh
}
