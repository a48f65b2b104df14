package fuse

import (
	"context"
	"fmt"
	"syscall"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/rdmafs/rdmafs/internal/trace"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// Silly rename, as the Linux client does it (fs/nfs/unlink.c): an
// object this mount has open that an unlink or a rename would take the
// last name of is renamed to ".nfs<fileid><counter>" in its directory
// instead, and that name is removed at its last close. NFSv4.1 open
// state keeps a removed file alive on servers that say so
// (OPEN4_RESULT_PRESERVE_UNLINKED, RFC 8881 s18.16.4); on others, and
// for directories, which have no open state, a GETATTR or READ after the
// removal would fail with NFS4ERR_STALE.

// sillyEntry is where an open object was renamed out of the way.
type sillyEntry struct {
	dir  *node
	name string
	cred oncrpc.Credential // the remover's, as Linux keeps it for the REMOVE
}

// openUnlinkable reports whether the object with inode number ino is
// open through this mount in a way its removal would break: a
// directory handle, or an open file whose OPEN did not say the server
// preserves it unlinked.
func (f *FS) openUnlinkable(ino uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.openUnlinkableLocked(ino)
}

// openUnlinkableLocked is openUnlinkable; caller holds f.mu. An OPEN
// under way counts as open, as the Linux client counts an open in
// progress (its open context is on the inode before the OPEN is sent):
// a REMOVE that reached the server just after it would leave its
// stateid to a removed file (ganesha then answers LOCK with
// NFS4ERR_BAD_STATEID).
func (f *FS) openUnlinkableLocked(ino uint64) bool {
	if f.openDirs[ino] > 0 || f.opening[ino] > 0 {
		return true
	}
	for h := range f.files {
		if h.n.StableAttr().Ino == ino && !h.of.PreserveUnlinked() {
			return true
		}
	}
	return false
}

// openAnyLocked reports whether ino is still open (file or directory).
// Caller holds f.mu.
func (f *FS) openAnyLocked(ino uint64) bool {
	if f.openDirs[ino] > 0 || f.opening[ino] > 0 {
		return true
	}
	for h := range f.files {
		if h.n.StableAttr().Ino == ino {
			return true
		}
	}
	return false
}

// beginOpen counts an OPEN of ino under way, once no REMOVE of a name
// of it is: the OPEN then either counts for silly rename or comes after
// the REMOVE (and finds the file gone: NFS4ERR_STALE, ESTALE, on which
// the kernel walks the path again, fs/namei.c do_filp_open). endOpen
// ends it; after a failed OPEN it removes the names silly-renamed
// meanwhile (lastClose), which no close will.
func (f *FS) beginOpen(ino uint64) {
	f.mu.Lock()
	for f.removing[ino] > 0 {
		f.removeDone.Wait()
	}
	f.opening[ino]++
	f.mu.Unlock()
}

func (f *FS) endOpen(ctx context.Context, ino uint64, opened bool) {
	f.mu.Lock()
	if f.opening[ino]--; f.opening[ino] <= 0 {
		delete(f.opening, ino)
	}
	f.mu.Unlock()
	if !opened {
		f.lastClose(ctx, ino)
	}
}

// beginRemove reports whether ino is open (or being opened) in a way its
// removal would break; if not, it counts a REMOVE of it under way until
// endRemove, holding new OPENs of it back.
func (f *FS) beginRemove(ino uint64) (open bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.openUnlinkableLocked(ino) {
		return true
	}
	f.removing[ino]++
	return false
}

func (f *FS) endRemove(ino uint64) {
	f.mu.Lock()
	if f.removing[ino]--; f.removing[ino] <= 0 {
		delete(f.removing, ino)
	}
	f.removeDone.Broadcast()
	f.mu.Unlock()
}

// sillyRename renames dir/name, the object target that this mount has
// open, to a fresh ".nfs" name in dir, and records it for removal at
// the last close. It reports whether it renamed (false: the object is
// not open, or the server keeps it anyway).
func (f *FS) sillyRename(ctx context.Context, dir *node, name string, target *node) (bool, syscall.Errno) {
	ino := target.StableAttr().Ino
	if !f.openUnlinkable(ino) {
		return false, 0
	}
	cred := f.cred(ctx)
	if target.StableAttr().Mode == syscall.S_IFDIR {
		// Only an empty directory can be renamed over: a full one is
		// left in place for the RENAME to refuse (NFS4ERR_EXIST or
		// NFS4ERR_NOTEMPTY, RFC 8881 s18.26.4).
		p, err := f.c.ReadDir(ctx, cred, target.handle(), 0, [8]byte{}, 1024)
		if err != nil || len(p.Entries) > 0 {
			return false, 0
		}
	}
	for range 8 {
		silly := fmt.Sprintf(".nfs%016x%08x", ino, f.sillyCount.Add(1))
		// RFC 8881 s18.26.4: RENAME onto an existing name replaces it;
		// a LOOKUP first keeps a stray name of that form (another
		// client's) from being replaced.
		if _, _, err := f.c.Lookup(ctx, cred, dir.handle(), silly); err == nil {
			continue
		} else if e := nfsclient.Errno(err); e != syscall.ENOENT {
			return false, dir.errno("LOOKUP", err)
		}
		ch := dir.beginChange()
		src, _, err := f.c.Rename(ctx, cred, dir.handle(), name, dir.handle(), silly)
		if err == nil {
			dir.dirChanged(&src, ch)
		}
		dir.endChange()
		if err != nil {
			return false, dir.errno("RENAME (silly)", err)
		}
		f.mu.Lock()
		f.silly[ino] = append(f.silly[ino], sillyEntry{dir: dir, name: silly, cred: cred})
		f.sillyNames.Add(1)
		f.mu.Unlock()
		target.invalidateAttr()
		if f.tr.On(trace.FUSE) {
			f.trace("SILLYRENAME dir=%d %q -> %q ino=%d", dir.StableAttr().Ino, name, silly, ino)
		}
		return true, 0
	}
	return false, syscall.EBUSY
}

// lastClose removes the silly-renamed names of ino once nothing of this
// mount has it open any more. Called after a file's CLOSE and a
// directory's release, and after a silly rename: the kernel sends
// RELEASE without waiting for it, so an unlink that follows close(2)
// can be served first, see the file still open and rename it while its
// last close finds no name yet to remove.
func (f *FS) lastClose(ctx context.Context, ino uint64) {
	f.mu.Lock()
	ents := f.silly[ino]
	if len(ents) == 0 || f.openAnyLocked(ino) {
		f.mu.Unlock()
		return
	}
	delete(f.silly, ino)
	f.sillyNames.Add(-int64(len(ents)))
	f.mu.Unlock()
	for _, e := range ents {
		ch := e.dir.beginChange()
		dc, err := f.c.Remove(ctx, e.cred, e.dir.handle(), e.name)
		if err == nil {
			e.dir.dirChanged(&dc, ch)
		}
		e.dir.endChange()
		if f.tr.On(trace.FUSE) {
			f.trace("SILLYREMOVE dir=%d %q ino=%d err=%v", e.dir.StableAttr().Ino, e.name, ino, err)
		}
	}
}

// dirOpened and dirReleased count the open directory handles of ino.
func (f *FS) dirOpened(ino uint64) {
	f.mu.Lock()
	f.openDirs[ino]++
	f.mu.Unlock()
}

func (f *FS) dirReleased(ctx context.Context, ino uint64) {
	f.mu.Lock()
	if f.openDirs[ino]--; f.openDirs[ino] <= 0 {
		delete(f.openDirs, ino)
	}
	f.mu.Unlock()
	f.lastClose(ctx, ino)
}

// hideSillyLinks leaves the ".nfs" names out of the link count of an
// object renamed out of the way: to the application it was removed, and
// fstat on its descriptor shows no link for it, as on a local file
// system (the Linux client shows the ".nfs" link, which xfstests'
// generic/035 and posixtest's NlinkZero and FstatDeleted count as a
// failure). A directory, which has no other link, shows none.
func (f *FS) hideSillyLinks(out *gofuse.Attr) {
	if f.sillyNames.Load() == 0 {
		return
	}
	f.mu.Lock()
	k := uint32(len(f.silly[out.Ino]))
	f.mu.Unlock()
	switch {
	case k == 0:
	case out.Mode&syscall.S_IFMT == syscall.S_IFDIR || out.Nlink < k:
		out.Nlink = 0
	default:
		out.Nlink -= k
	}
}

// unSillyRename undoes sillyRename of dir/name when the RENAME it made
// room for failed: the name is renamed back and forgotten.
func (f *FS) unSillyRename(ctx context.Context, dir *node, name string, target *node) {
	ino := target.StableAttr().Ino
	f.mu.Lock()
	ents := f.silly[ino]
	if len(ents) == 0 || ents[len(ents)-1].dir != dir {
		f.mu.Unlock()
		return
	}
	e := ents[len(ents)-1]
	if len(ents) == 1 {
		delete(f.silly, ino)
	} else {
		f.silly[ino] = ents[:len(ents)-1]
	}
	f.sillyNames.Add(-1)
	f.mu.Unlock()
	ch := dir.beginChange()
	src, _, err := f.c.Rename(ctx, e.cred, dir.handle(), e.name, dir.handle(), name)
	if err == nil {
		dir.dirChanged(&src, ch)
	}
	dir.endChange()
	target.invalidateAttr()
	if f.tr.On(trace.FUSE) {
		f.trace("SILLYRENAME undone dir=%d %q -> %q ino=%d err=%v", dir.StableAttr().Ino, e.name, name, ino, err)
	}
}
