package main

import (
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// cpDir is the direction of a cp job.
type cpDir int

const (
	cpIn  cpDir = iota + 1 // a local file into the mount: buffered writes, COMMIT at close
	cpOut                  // that file out to a local one (localDir): buffered reads, read-ahead
)

// cpSource is the local file cp in copies, made once per size.
var cpSource = map[int]string{}

func localSource(sizeMiB int) (string, error) {
	if p, ok := cpSource[sizeMiB]; ok {
		return p, nil
	}
	f, err := os.CreateTemp(localDir(sizeMiB), "benchmount-cp-")
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for range sizeMiB {
		rand.Read(buf)
		if _, err := f.Write(buf); err != nil {
			os.Remove(f.Name())
			return "", fmt.Errorf("cp source: %w", err)
		}
	}
	cpSource[sizeMiB] = f.Name()
	return f.Name(), nil
}

// localDir is where the cp jobs keep their local files: /dev/shm when it
// is a tmpfs with room for the source and cp out's copy, so that the
// local end of a cp is memory, as fio's is. On a disk, cp out's time
// is mostly its own writes to that disk: traced with strace -T on this
// shared machine, cp out's write(2)s to ext4 took 0.14 to 1.2 s of
// 256 MiB, while no READ was in flight on the mount for up to 75% of
// the copy; copying to /dev/shm, the same mount read at 0.6-1.0x its
// O_DIRECT rate instead of 0.2-0.5x. Otherwise it is the default
// temporary directory.
func localDir(sizeMiB int) string {
	if shmRoom() < 3*uint64(sizeMiB)<<20 {
		return ""
	}
	return shm
}

const shm = "/dev/shm"

// shmRoom returns the bytes free in /dev/shm, or 0 if it is not a tmpfs.
func shmRoom() uint64 {
	var st unix.Statfs_t
	if err := unix.Statfs(shm, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		return 0
	}
	return st.Bavail * uint64(st.Bsize)
}

// exportDir returns a fresh directory in /dev/shm for ganesha to export
// (on is "tmpfs"), or "" for its default on this machine's disk (on is
// "disk"). On the disk the figures are partly the disk's: its write rate
// here falls to a quarter for about a second every gigabyte or so, with
// or without NFS in the way (the same 1 MiB writes and fsyncs by a local
// process: 2.1 GB/s, now and then 0.6), and fio's O_DIRECT write through
// ganesha falls from 1.3 GB/s to about 300 MB/s with it. The export and
// the cp jobs' local files (localDir) need about five times sizeMiB.
func exportDir(on string, sizeMiB int) (string, error) {
	switch on {
	case "disk":
		return "", nil
	case "tmpfs":
	default:
		return "", fmt.Errorf("-export %q: want tmpfs or disk", on)
	}
	if need := 5 * uint64(sizeMiB) << 20; shmRoom() < need {
		return "", fmt.Errorf("export on tmpfs: %s needs %d MiB free (or use -export disk, EXPORT=disk)", shm, need>>20)
	}
	dir, err := os.MkdirTemp(shm, "benchmount-export-")
	if err != nil {
		return "", fmt.Errorf("export on tmpfs: %w", err)
	}
	return dir, nil
}

// removeSources deletes the cp jobs' local files.
func removeSources() {
	for _, p := range cpSource {
		os.Remove(p)
	}
}

// runCp times cp(1) of a sizeMiB file into s.dir (wall time up to cp's
// exit, so the close and its COMMIT count) or out of it to a local file,
// after dropping the mount's cached pages of it. cp in makes the file
// afresh each round; cp out copies the last one made.
func runCp(s side, j job) (sample, error) {
	src, err := localSource(j.sizeMiB)
	if err != nil {
		return sample{}, err
	}
	remote := filepath.Join(s.dir, "cpfile")
	from, to := src, remote
	// The fio jobs, which run first, are done with their file: a
	// small export (knfsd's tmpfs) need not hold both.
	os.Remove(filepath.Join(s.dir, "benchfile"))
	if j.cp == cpIn {
		os.Remove(remote)
	} else {
		local := src + ".out"
		defer os.Remove(local)
		from, to = remote, local
		if err := dropCache(remote); err != nil {
			return sample{}, err
		}
	}
	cpu0, err := cpuTime(s.pid)
	if err != nil {
		return sample{}, err
	}
	start := time.Now()
	if out, err := exec.Command("cp", from, to).CombinedOutput(); err != nil {
		return sample{}, fmt.Errorf("cp %s %s: %v: %s", from, to, err, out)
	}
	took := time.Since(start)
	cpu1, err := cpuTime(s.pid)
	if err != nil {
		return sample{}, err
	}
	n := int64(j.sizeMiB) << 20
	return sample{mbps: float64(n) / took.Seconds() / 1e6, bytesMoved: n,
		cpuPerGiB: (cpu1 - cpu0).Seconds() / (float64(n) / (1 << 30))}, nil
}

// dropCache drops the kernel's cached pages of path, as fio's
// --invalidate does, so that cp out reads from the server.
func dropCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("drop cache: %w", err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("drop cache of %s: %w", path, err)
	}
	return nil
}
