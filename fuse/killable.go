package fuse

import gofuse "github.com/hanwen/go-fuse/v2/fuse"

// The methods of killable give each request the cancel channel of
// interruptWatch (interrupt.go). Not here, so with the kernel's channel:
// SetLkw, a blocking lock wait, which a signal ends; Release, which the
// kernel sends in the background and never interrupts; and the methods
// without a channel.

func (k killable) Lookup(cancel <-chan struct{}, header *gofuse.InHeader, name string, out *gofuse.EntryOut) gofuse.Status {
	c, done := k.w.watch(cancel, header.Pid)
	defer done()
	return k.RawFileSystem.Lookup(c, header, name, out)
}

func (k killable) GetAttr(cancel <-chan struct{}, input *gofuse.GetAttrIn, out *gofuse.AttrOut) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.GetAttr(c, input, out)
}

func (k killable) SetAttr(cancel <-chan struct{}, input *gofuse.SetAttrIn, out *gofuse.AttrOut) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.SetAttr(c, input, out)
}

func (k killable) Mknod(cancel <-chan struct{}, input *gofuse.MknodIn, name string, out *gofuse.EntryOut) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.Mknod(c, input, name, out)
}

func (k killable) Mkdir(cancel <-chan struct{}, input *gofuse.MkdirIn, name string, out *gofuse.EntryOut) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.Mkdir(c, input, name, out)
}

func (k killable) Unlink(cancel <-chan struct{}, header *gofuse.InHeader, name string) gofuse.Status {
	c, done := k.w.watch(cancel, header.Pid)
	defer done()
	return k.RawFileSystem.Unlink(c, header, name)
}

func (k killable) Rmdir(cancel <-chan struct{}, header *gofuse.InHeader, name string) gofuse.Status {
	c, done := k.w.watch(cancel, header.Pid)
	defer done()
	return k.RawFileSystem.Rmdir(c, header, name)
}

func (k killable) Rename(cancel <-chan struct{}, input *gofuse.RenameIn, oldName string, newName string) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.Rename(c, input, oldName, newName)
}

func (k killable) Link(cancel <-chan struct{}, input *gofuse.LinkIn, filename string, out *gofuse.EntryOut) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.Link(c, input, filename, out)
}

func (k killable) Symlink(cancel <-chan struct{}, header *gofuse.InHeader, pointedTo string, linkName string, out *gofuse.EntryOut) gofuse.Status {
	c, done := k.w.watch(cancel, header.Pid)
	defer done()
	return k.RawFileSystem.Symlink(c, header, pointedTo, linkName, out)
}

func (k killable) Readlink(cancel <-chan struct{}, header *gofuse.InHeader) ([]byte, gofuse.Status) {
	c, done := k.w.watch(cancel, header.Pid)
	defer done()
	return k.RawFileSystem.Readlink(c, header)
}

func (k killable) Access(cancel <-chan struct{}, input *gofuse.AccessIn) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.Access(c, input)
}

func (k killable) GetXAttr(cancel <-chan struct{}, header *gofuse.InHeader, attr string, dest []byte) (uint32, gofuse.Status) {
	c, done := k.w.watch(cancel, header.Pid)
	defer done()
	return k.RawFileSystem.GetXAttr(c, header, attr, dest)
}

func (k killable) ListXAttr(cancel <-chan struct{}, header *gofuse.InHeader, dest []byte) (uint32, gofuse.Status) {
	c, done := k.w.watch(cancel, header.Pid)
	defer done()
	return k.RawFileSystem.ListXAttr(c, header, dest)
}

func (k killable) SetXAttr(cancel <-chan struct{}, input *gofuse.SetXAttrIn, attr string, data []byte) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.SetXAttr(c, input, attr, data)
}

func (k killable) RemoveXAttr(cancel <-chan struct{}, header *gofuse.InHeader, attr string) gofuse.Status {
	c, done := k.w.watch(cancel, header.Pid)
	defer done()
	return k.RawFileSystem.RemoveXAttr(c, header, attr)
}

func (k killable) Create(cancel <-chan struct{}, input *gofuse.CreateIn, name string, out *gofuse.CreateOut) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.Create(c, input, name, out)
}

func (k killable) Tmpfile(cancel <-chan struct{}, input *gofuse.CreateIn, out *gofuse.CreateOut) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.Tmpfile(c, input, out)
}

func (k killable) Open(cancel <-chan struct{}, input *gofuse.OpenIn, out *gofuse.OpenOut) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.Open(c, input, out)
}

func (k killable) Read(cancel <-chan struct{}, input *gofuse.ReadIn, buf []byte) (gofuse.ReadResult, gofuse.Status) {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.Read(c, input, buf)
}

func (k killable) Lseek(cancel <-chan struct{}, input *gofuse.LseekIn, out *gofuse.LseekOut) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.Lseek(c, input, out)
}

func (k killable) GetLk(cancel <-chan struct{}, input *gofuse.LkIn, out *gofuse.LkOut) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.GetLk(c, input, out)
}

func (k killable) SetLk(cancel <-chan struct{}, input *gofuse.LkIn) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.SetLk(c, input)
}

func (k killable) Write(cancel <-chan struct{}, input *gofuse.WriteIn, data []byte) (uint32, gofuse.Status) {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.Write(c, input, data)
}

func (k killable) Writev(cancel <-chan struct{}, input *gofuse.WriteIn, data [][]byte) (uint32, gofuse.Status) {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.Writev(c, input, data)
}

func (k killable) CopyFileRange(cancel <-chan struct{}, input *gofuse.CopyFileRangeIn) (uint32, gofuse.Status) {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.CopyFileRange(c, input)
}

func (k killable) Ioctl(cancel <-chan struct{}, input *gofuse.IoctlIn, inbuf []byte, output *gofuse.IoctlOut, outbuf []byte) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.Ioctl(c, input, inbuf, output, outbuf)
}

func (k killable) Flush(cancel <-chan struct{}, input *gofuse.FlushIn) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.Flush(c, input)
}

func (k killable) Fsync(cancel <-chan struct{}, input *gofuse.FsyncIn) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.Fsync(c, input)
}

func (k killable) Fallocate(cancel <-chan struct{}, input *gofuse.FallocateIn) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.Fallocate(c, input)
}

func (k killable) OpenDir(cancel <-chan struct{}, input *gofuse.OpenIn, out *gofuse.OpenOut) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.OpenDir(c, input, out)
}

func (k killable) ReadDir(cancel <-chan struct{}, input *gofuse.ReadIn, out *gofuse.DirEntryList) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.ReadDir(c, input, out)
}

func (k killable) ReadDirPlus(cancel <-chan struct{}, input *gofuse.ReadIn, out *gofuse.DirEntryList) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.ReadDirPlus(c, input, out)
}

func (k killable) FsyncDir(cancel <-chan struct{}, input *gofuse.FsyncIn) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.FsyncDir(c, input)
}

func (k killable) StatFs(cancel <-chan struct{}, input *gofuse.InHeader, out *gofuse.StatfsOut) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.StatFs(c, input, out)
}

func (k killable) Statx(cancel <-chan struct{}, input *gofuse.StatxIn, out *gofuse.StatxOut) gofuse.Status {
	c, done := k.w.watch(cancel, input.Pid)
	defer done()
	return k.RawFileSystem.Statx(c, input, out)
}
