package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// uringJobs are jobs plus what issue 23 asks of the FUSE hop: 4 KiB
// random reads at queue depth 16 (libaio) and file creates.
func uringJobs(sizeMiB int) []job {
	size := fmt.Sprintf("--size=%dM", sizeMiB)
	return append(jobs(sizeMiB),
		job{name: "rand read 4K direct qd16", args: []string{"--rw=randread", "--bs=4k", "--direct=1", size,
			"--ioengine=libaio", "--iodepth=16", "--time_based", "--runtime=5"}, read: true},
		job{name: "creates (files/s; CPU s per 1000)", creates: 2000},
	)
}

// runCreates creates j.creates empty files in a new directory of s.dir
// and returns files per second in the MB/s column and the serving
// process's CPU seconds per 1000 files in the CPU column.
func runCreates(s side, j job) (sample, error) {
	dir, err := os.MkdirTemp(s.dir, "creates-")
	if err != nil {
		return sample{}, err
	}
	defer os.RemoveAll(dir)
	cpu0, err := cpuTime(s.pid)
	if err != nil {
		return sample{}, err
	}
	start := time.Now()
	for i := range j.creates {
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return sample{}, fmt.Errorf("creates in %s: %w", s.dir, err)
		}
		f.Close()
	}
	elapsed := time.Since(start)
	cpu1, err := cpuTime(s.pid)
	if err != nil {
		return sample{}, err
	}
	return sample{mbps: float64(j.creates) / elapsed.Seconds(), cpuPerGiB: (cpu1 - cpu0).Seconds() * 1000 / float64(j.creates)}, nil
}

// benchURing compares rdmafs on ganesha served over FUSE-over-io_uring
// (-o uring) with the same over /dev/fuse (nouring) and with the go-fuse
// loopback of the same directory (the floor, itself on /dev/fuse).
func benchURing(abs string, g *testpeer.Ganesha, exportOn string, size, rounds int, match *regexp.Regexp) error {
	opts := "port=" + port(g.Addr)
	vs, umount, err := mountVariants(abs, "127.0.0.1:"+g.Export, []mount{
		{name: "io_uring", sub: "bench-uring", opts: []string{opts, "uring"}},
		{name: "devfuse", sub: "bench-devfuse", opts: []string{opts, "nouring"}},
	})
	if err != nil {
		return err
	}
	defer umount()
	loopDir, umountLoop, err := mountLoopback(g.Dir)
	if err != nil {
		return err
	}
	defer umountLoop()
	vs = append(vs, variant{name: "loopback", side: side{loopDir, os.Getpid()}})
	rows, err := compareN(vs, selectJobs(uringJobs(size), match), rounds)
	if err != nil {
		return err
	}
	printTableN(os.Stdout, fmt.Sprintf("rdmafs over FUSE-over-io_uring vs over /dev/fuse vs the go-fuse loopback (proto=tcp, ganesha on this machine, export on %s), %d MiB, median of %d alternating rounds", exportOn, size, rounds),
		vs, []ratio{{0, 1}, {0, 2}, {1, 2}}, rows)
	return nil
}
