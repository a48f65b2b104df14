package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// withFusermountStderr runs mount, which may run fusermount3, and returns
// the lines fusermount3 wrote to stderr when mount fails.
//
// go-fuse runs fusermount3 (for a mount without root) with the process's
// own standard error and reports only its exit status ("fusermount exited
// with code 256"), so its reason ("fusermount3: failed to open /dev/fuse:
// Permission denied") would go to the terminal in the foreground and be
// lost in the background process, whose stderr is /dev/null. Here file
// descriptor 2 points at an anonymous in-memory file while mount runs;
// afterwards it is restored and what was captured is copied to the real
// stderr, except fusermount3's lines when the mount failed: those go
// into the one-line error instead.
func withFusermountStderr(mount func() error) (fusermountMsg string, err error) {
	mem, cerr := unix.MemfdCreate("rdmafs-stderr", unix.MFD_CLOEXEC)
	if cerr != nil {
		return "", mount() // no capture; the mount itself matters more
	}
	memf := os.NewFile(uintptr(mem), "rdmafs-stderr")
	defer memf.Close()
	saved, cerr := unix.FcntlInt(2, unix.F_DUPFD_CLOEXEC, 3)
	if cerr != nil {
		return "", mount()
	}
	if cerr := unix.Dup3(mem, 2, 0); cerr != nil {
		unix.Close(saved)
		return "", mount()
	}
	err = mount()
	// Restore stderr before anything else can be written there.
	unix.Dup3(saved, 2, 0)
	unix.Close(saved)

	if _, serr := memf.Seek(0, io.SeekStart); serr != nil {
		return "", err
	}
	b, _ := io.ReadAll(memf)
	var keep, fm []string
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line == "" {
			continue
		}
		if err != nil && strings.Contains(line, "fusermount") {
			// go-fuse runs it by its path: "/usr/bin/fusermount3: ..."
			line = strings.TrimSpace(line)
			if prog, rest, ok := strings.Cut(line, ": "); ok && strings.HasPrefix(prog, "/") {
				line = filepath.Base(prog) + ": " + rest
			}
			fm = append(fm, line)
			continue
		}
		keep = append(keep, line)
	}
	if len(keep) > 0 {
		fmt.Fprint(os.Stderr, strings.Join(keep, ""))
	}
	return strings.Join(fm, "; "), err
}
