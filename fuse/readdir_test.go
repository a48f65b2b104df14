package fuse_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/test/testpeer"
)

// ganeshaPeer runs f on nfs-ganesha over TCP: the behaviour under test
// is the client's, and ganesha starts in a second.
func ganeshaPeer(t *testing.T, f func(t *testing.T, p peer)) {
	t.Run("ganesha", func(t *testing.T) {
		g := testpeer.RequireGanesha(t)
		f(t, peer{name: "ganesha", addr: g.Addr, export: g.Export, limitsOf: "ganesha"})
	})
}

// dirent64 reads one entry with getdents64 into a buffer that holds
// only one, as xfstests' t_readdir_3 does, and returns its name and
// d_off.
func dirent64(t *testing.T, fd int) (string, int64) {
	t.Helper()
	buf := make([]byte, 19+256)
	n, err := unix.Getdents(fd, buf)
	if err != nil || n == 0 {
		t.Fatalf("getdents64: %d bytes, %v", n, err)
	}
	off := int64(uint64(buf[8]) | uint64(buf[9])<<8 | uint64(buf[10])<<16 | uint64(buf[11])<<24 |
		uint64(buf[12])<<32 | uint64(buf[13])<<40 | uint64(buf[14])<<48 | uint64(buf[15])<<56)
	reclen := int(buf[16]) | int(buf[17])<<8
	name := buf[19:reclen]
	for i, b := range name {
		if b == 0 {
			name = name[:i]
			break
		}
	}
	return string(name), off
}

// TestReaddirSeekRPCs is xfstests generic/676 (t_readdir_3) with its
// RPCs counted: read a directory one entry per getdents64, telling and
// seeking to each entry's d_off, then seek to random entries and read
// them again. The kernel re-reads a batch for every seek into it and
// go-fuse answers those from its copy of the batch: the entries'
// attributes must come from the READDIR already made, as the Linux
// client serves seeks from its cached READDIR pages. The COMPOUNDs must
// grow with the number of entries over the page size (a READDIR per
// page), not with its square (a LOOKUP per entry per re-read batch,
// 1.1 million for 1750 entries before).
func TestReaddirSeekRPCs(t *testing.T) {
	ganeshaPeer(t, func(t *testing.T, p peer) {
		mnt, _ := mountPeer(t, p, fuse.Options{})
		d := freshDir(t, mnt)
		const files = 2000
		want := map[string]bool{}
		for i := range files {
			name := fmt.Sprintf("entry-%d-%s", i, "abcdefghijklmnopqrstuvwxyz"[:rand.IntN(26)])
			f, err := os.Create(filepath.Join(d, name))
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
			want[name] = true
		}
		// A cold directory, as the test's second open finds it.
		mnt2, m2 := mountPeer(t, p, fuse.Options{})
		fd, err := unix.Open(filepath.Join(mnt2, filepath.Base(d)), unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		before := countOps(m2)
		type ent struct {
			pos  int64
			name string
		}
		var ents []ent
		for len(ents) < files+2 {
			pos, err := unix.Seek(fd, 0, 1)
			if err != nil {
				t.Fatal(err)
			}
			name, off := dirent64(t, fd)
			if _, err := unix.Seek(fd, off, 0); err != nil {
				t.Fatal(err)
			}
			ents = append(ents, ent{pos, name})
		}
		seen := map[string]bool{}
		for _, e := range ents {
			seen[e.name] = true
		}
		for name := range want {
			if !seen[name] {
				t.Fatalf("%s not listed", name)
			}
		}
		for range files {
			e := ents[rand.IntN(len(ents))]
			if _, err := unix.Seek(fd, e.pos, 0); err != nil {
				t.Fatal(err)
			}
			if name, _ := dirent64(t, fd); name != e.name {
				t.Fatalf("seek to %d read %q, want %q", e.pos, name, e.name)
			}
		}
		got := countOps(m2).since(before)
		// A READDIR page holds a few hundred entries (64 KiB of names,
		// attributes and handles): files/20 READDIRs leave room for
		// small pages and a rewind; no LOOKUP or GETATTR per entry.
		if got["READDIR"] == 0 || got["READDIR"] > files/20 || got["LOOKUP"]+got["GETATTR"] > 10 {
			t.Errorf("%d entries read with seeks: %v, want READDIRs (at most %d) and no LOOKUP or GETATTR per entry", files, got, files/20)
		}
		t.Logf("%d entries read with seeks: %v", files, got)
	})
}
