package fuse

import (
	"syscall"
	"testing"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/rdmafs/rdmafs/nfsclient"
)

func TestLockRanges(t *testing.T) {
	tests := []struct {
		start, end  uint64 // the kernel's inclusive range
		off, length uint64 // LOCK's offset4 and length4
	}{
		{0, offsetMax, 0, nfsclient.LengthToEOF},
		{0, 100, 0, 101},
		{40, 60, 40, 21},
		{61, offsetMax, 61, nfsclient.LengthToEOF},
		{offsetMax - 1, offsetMax - 1, offsetMax - 1, 1},
	}
	for _, tt := range tests {
		off, length := nfsRange(&gofuse.FileLock{Start: tt.start, End: tt.end})
		if off != tt.off || length != tt.length {
			t.Errorf("nfsRange [%d,%d] = %d,+%d, want %d,+%d", tt.start, tt.end, off, length, tt.off, tt.length)
		}
		start, end := fuseRange(tt.off, tt.length)
		if start != tt.start || end != tt.end {
			t.Errorf("fuseRange %d,+%d = [%d,%d], want [%d,%d]", tt.off, tt.length, start, end, tt.start, tt.end)
		}
	}
	// A server's range past what the kernel can take is clamped, never
	// beyond OFFSET_MAX (the kernel answers EIO to that).
	for _, r := range [][2]uint64{{1 << 63, 10}, {offsetMax, 5}, {10, 1 << 63}, {^uint64(0), 1}} {
		start, end := fuseRange(r[0], r[1])
		if start > offsetMax || end > offsetMax || end < start {
			t.Errorf("fuseRange %d,+%d = [%d,%d]", r[0], r[1], start, end)
		}
	}
}

func TestPrivBits(t *testing.T) {
	for _, tt := range []struct {
		mode, bits uint32
		may        bool
	}{
		{0o6777, syscall.S_ISUID | syscall.S_ISGID, true},
		{0o4755, syscall.S_ISUID, true},
		{0o2666, 0, true}, // set-group-ID without group execute: the server decides
		{0o2770, syscall.S_ISGID, true},
		{0o0777, 0, false},
	} {
		if got := privBits(tt.mode); got != tt.bits {
			t.Errorf("privBits(%o) = %o, want %o", tt.mode, got, tt.bits)
		}
		if got := mayKill(tt.mode); got != tt.may {
			t.Errorf("mayKill(%o) = %v, want %v", tt.mode, got, tt.may)
		}
	}
}
