package main

import (
	"log"
	"strings"
	"testing"

	"github.com/hanwen/go-fuse/v2/fs"
)

// TestFloorNoPassthrough checks that the floor's files cannot hand the
// kernel their backing file, while the plain loopback's can.
func TestFloorNoPassthrough(t *testing.T) {
	if _, ok := fs.FileHandle(&fs.LoopbackFile{}).(fs.FilePassthroughFder); !ok {
		t.Fatal("fs.LoopbackFile no longer implements FilePassthroughFder: floorFile is not needed")
	}
	fh := noPassthrough(&fs.LoopbackFile{})
	if _, ok := fh.(fs.FilePassthroughFder); ok {
		t.Error("floor file implements FilePassthroughFder")
	}
	for _, iface := range []struct {
		name string
		ok   bool
	}{
		{"reader", is[fs.FileReader](fh)},
		{"writer", is[fs.FileWriter](fh)},
		{"flusher", is[fs.FileFlusher](fh)},
		{"fsyncer", is[fs.FileFsyncer](fh)},
		{"releaser", is[fs.FileReleaser](fh)},
		{"getattrer", is[fs.FileGetattrer](fh)},
	} {
		if !iface.ok {
			t.Errorf("floor file lost the loopback's %s", iface.name)
		}
	}
}

func is[T any](v any) bool {
	_, ok := v.(T)
	return ok
}

func TestSpliceFilter(t *testing.T) {
	var b strings.Builder
	l := log.New(spliceFilter{&b}, "", 0)
	l.Println("trySplice:", "splice: want 1052688 bytes, max pipe size 1048576")
	l.Println("something else")
	if got := b.String(); got != "something else\n" {
		t.Errorf("filtered log = %q, want only the other line", got)
	}
}
