// Command benchmount measures rdmafs mounts with fio against a floor, in
// one run, and prints one table (make bench-mount).
//
// It starts nfs-ganesha on a directory in /dev/shm (-export tmpfs; -export
// disk puts it on this machine's disk, whose rate then shows), mounts it
// with rdmafs (proto=tcp) and serves the same directory through a go-fuse
// loopback file system in this process (the FUSE floor: no network, no
// NFS, passthrough off), and runs the same fio jobs on both: 1 MiB
// sequential write and read with O_DIRECT, 4 KiB random read with
// O_DIRECT, buffered sequential write and read of a large file, and cp(1)
// of a file of that size into the mount and back out (cp.go); a second
// table gives buffered over O_DIRECT on each mount. With
// -knfsd it also starts knfsd in the qemu guest and compares proto=tcp
// with proto=rdma against it, and with proto=tcp and proto=rdma through
// relay processes on this host that relay over TCP to the same knfsd
// (knfsd.go, relay.go; -relay=false leaves them out; -knfsd-net picks the
// guest's network; -ganesha=false skips the ganesha table; -jobs picks
// jobs by name). With -ganesha-relay it also mounts ganesha through the
// same two relays, tcp-relay and rdma-relay, and compares them: the
// client's RDMA stack against its TCP stack with no guest in the way. With -rpcs it instead counts the COMPOUNDs
// per entry that tar x, ls -l and rm -rf take, each on a fresh mount
// (the round trips the Linux client's OPEN+WRITE+CLOSE set the bar for).
//
//	go run ./test/benchmount -rdmafs bin/rdmafs [-knfsd] [-ganesha-relay] [-size 1024] [-rpcs] [-jobs '1M direct']
//
// Figures are MB/s as fio reports them; the ratio is rdmafs over the
// floor (or rdma over tcp). The CPU columns are the user+sys CPU seconds
// the serving process (the rdmafs daemon; this process for the loopback)
// spent per GiB fio moved, from its CPU clock before and after each job
// (cpu.go; nanoseconds). The machine is shared and noisy: each pair runs back to
// back and -rounds repeats them, reporting the median.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// job is one fio workload, or with cp set a cp(1) of a file into or out
// of the mount (cp.go).
type job struct {
	name string
	args []string
	read bool // report read bandwidth (else write)
	// cp, if set, copies a file of sizeMiB in or out with cp(1).
	cp      cpDir
	sizeMiB int
	// creates, if set, creates that many empty files (uring.go).
	creates int
}

func jobs(sizeMiB int) []job {
	size := fmt.Sprintf("--size=%dM", sizeMiB)
	return []job{
		{name: "seq write 1M direct", args: []string{"--rw=write", "--bs=1M", "--direct=1", size}},
		{name: "seq read 1M direct", args: []string{"--rw=read", "--bs=1M", "--direct=1", size}, read: true},
		{name: "rand read 4K direct", args: []string{"--rw=randread", "--bs=4k", "--direct=1", size, "--time_based", "--runtime=5"}, read: true},
		{name: "buffered write", args: []string{"--rw=write", "--bs=1M", size, "--end_fsync=1"}},
		{name: "buffered read", args: []string{"--rw=read", "--bs=1M", size, "--invalidate=1"}, read: true},
		{name: "cp in", cp: cpIn, sizeMiB: sizeMiB},
		{name: "cp out", cp: cpOut, sizeMiB: sizeMiB, read: true},
	}
}

// sample is one fio run: its bandwidth and the CPU time the serving
// process spent per GiB moved.
type sample struct {
	mbps       float64
	cpuPerGiB  float64 // seconds of user+sys CPU per GiB read or written
	bytesMoved int64
}

// side is one half of a comparison: the directory fio runs in and the
// process serving it, whose CPU time is charged to it (the rdmafs
// daemon; this process for the go-fuse loopback).
type side struct {
	dir string
	pid int
}

// fio runs one job in s.dir (on a file left there by the write jobs) and
// returns MB/s and the serving process's CPU seconds per GiB moved.
func fio(s side, j job) (sample, error) {
	if j.cp != 0 {
		return runCp(s, j)
	}
	if j.creates != 0 {
		return runCreates(s, j)
	}
	args := append([]string{"--name=bench", "--directory=" + s.dir, "--filename=benchfile", "--ioengine=psync",
		"--output-format=json", "--group_reporting"}, j.args...)
	cpu0, err := cpuTime(s.pid)
	if err != nil {
		return sample{}, err
	}
	out, err := exec.Command("fio", args...).Output()
	if err != nil {
		return sample{}, fmt.Errorf("fio %s in %s: %w", j.name, s.dir, err)
	}
	cpu1, err := cpuTime(s.pid)
	if err != nil {
		return sample{}, err
	}
	type dir struct {
		BwBytes float64 `json:"bw_bytes"`
		IOBytes int64   `json:"io_bytes"`
	}
	var res struct {
		Jobs []struct {
			Read  dir `json:"read"`
			Write dir `json:"write"`
		} `json:"jobs"`
	}
	i := strings.IndexByte(string(out), '{')
	if i < 0 {
		return sample{}, fmt.Errorf("fio %s: no JSON in output %q", j.name, out)
	}
	if err := json.Unmarshal(out[i:], &res); err != nil || len(res.Jobs) == 0 {
		return sample{}, fmt.Errorf("fio %s: output: %v", j.name, err)
	}
	d := res.Jobs[0].Write
	if j.read {
		d = res.Jobs[0].Read
	}
	smp := sample{mbps: d.BwBytes / 1e6, bytesMoved: d.IOBytes}
	if d.IOBytes > 0 {
		smp.cpuPerGiB = (cpu1 - cpu0).Seconds() / (float64(d.IOBytes) / (1 << 30))
	}
	return smp, nil
}

// servingPID returns the PID of the process serving the rdmafs mount on
// dir, from the first line of "rdmafs stats" ("pid: N").
func servingPID(bin, dir string) (int, error) {
	out, err := exec.Command(bin, "stats", dir).Output()
	if err != nil {
		return 0, fmt.Errorf("rdmafs stats %s: %w", dir, err)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "pid:")))
	if err != nil {
		return 0, fmt.Errorf("rdmafs stats %s: first line %q: not pid: N", dir, line)
	}
	return pid, nil
}

// mountRdmafs mounts source on a new directory and returns it and the
// unmount function.
func mountRdmafs(bin, source string, opts ...string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "benchmount-rdmafs-")
	if err != nil {
		return "", nil, err
	}
	out, err := exec.Command(bin, "mount", "-o", strings.Join(opts, ","), source, dir).CombinedOutput()
	if err != nil {
		return "", nil, fmt.Errorf("rdmafs mount %s: %v: %s", source, err, out)
	}
	return dir, func() {
		exec.Command(bin, "umount", dir).Run()
		os.Remove(dir)
	}, nil
}

// mountLoopback serves orig through go-fuse's loopback node tree, with
// rdmafs's FUSE I/O sizes and without FUSE passthrough (floor.go).
func mountLoopback(orig string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "benchmount-loopback-")
	if err != nil {
		return "", nil, err
	}
	root, err := newFloorRoot(orig)
	if err != nil {
		return "", nil, err
	}
	sec := time.Second
	srv, err := fs.Mount(dir, root, &fs.Options{AttrTimeout: &sec, EntryTimeout: &sec,
		MountOptions: gofuse.MountOptions{FsName: orig, Name: "loopback", MaxWrite: 1 << 20, MaxReadAhead: 1 << 20, DirectMount: true,
			Logger: log.New(spliceFilter{os.Stderr}, "", log.LstdFlags)}})
	if err != nil {
		return "", nil, fmt.Errorf("loopback mount: %w", err)
	}
	return dir, func() {
		srv.Unmount()
		os.Remove(dir)
	}, nil
}

// spliceFilter drops go-fuse's "trySplice:" lines, one per 1 MiB read
// where fs.pipe-max-size is 1 MiB (the default): the reply, header
// included, does not fit in a pipe and go-fuse copies it instead.
type spliceFilter struct{ w io.Writer }

func (f spliceFilter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("trySplice:")) {
		return len(p), nil
	}
	return f.w.Write(p)
}

type row struct {
	job  string
	a, b []sample
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// selectJobs returns the jobs whose name match matches (all with a nil
// match).
func selectJobs(js []job, match *regexp.Regexp) []job {
	if match == nil {
		return js
	}
	var out []job
	for _, j := range js {
		if match.MatchString(j.name) {
			out = append(out, j)
		}
	}
	return out
}

// compare runs every job on a and b, alternating, rounds times. Each
// round runs all the jobs in order, so a buffered job and the O_DIRECT job
// printBuffered divides it by are taken minutes apart at most, not a
// whole job's rounds apart: on a shared machine the load moves that much.
func compare(a, b side, js []job, rounds int) ([]row, error) {
	rows := make([]row, len(js))
	for i, j := range js {
		rows[i].job = j.name
	}
	for range rounds {
		for i, j := range js {
			sa, err := fio(a, j)
			if err != nil {
				return nil, err
			}
			sb, err := fio(b, j)
			if err != nil {
				return nil, err
			}
			rows[i].a, rows[i].b = append(rows[i].a, sa), append(rows[i].b, sb)
		}
	}
	return rows, nil
}

// medians returns the medians of f over a and b and of the per-round
// ratios f(a)/f(b).
func medians(a, b []sample, f func(sample) float64) (ma, mb, ratio float64) {
	var va, vb []float64
	for i := range a {
		va, vb = append(va, f(a[i])), append(vb, f(b[i]))
	}
	return median(va), median(vb), medianRatio(va, vb)
}

// printBuffered prints, for each side, buffered I/O over 1 MiB O_DIRECT
// on the same mount: the median of the per-round ratios. The two sides
// of a ratio are not alike in everything: fio's direct jobs end before
// the close, so the COMMIT there is not in their time, while buffered
// write (end_fsync) and cp in wait for the data to be on disk; cp out
// also writes what it reads to a local file, in the same thread.
func printBuffered(nameA, nameB string, rows []row) {
	if !hasBufferedPairs(rows) {
		return
	}
	byName := map[string]row{}
	for _, r := range rows {
		byName[r.job] = r
	}
	fmt.Printf("\nbuffered over O_DIRECT on the same mount (median of per-round ratios)\n| job | over | %s | %s |\n|---|---|---|---|\n", nameA, nameB)
	for _, p := range bufferedPairs {
		b, d := byName[p[0]], byName[p[1]]
		_, _, ra := medians(b.a, d.a, func(s sample) float64 { return s.mbps })
		_, _, rb := medians(b.b, d.b, func(s sample) float64 { return s.mbps })
		fmt.Printf("| %s | %s | %.2f | %.2f |\n", p[0], p[1], ra, rb)
	}
}

// bufferedPairs are the jobs printBuffered divides, each over the
// O_DIRECT job of the same direction.
var bufferedPairs = [][2]string{{"buffered write", "seq write 1M direct"}, {"cp in", "seq write 1M direct"},
	{"buffered read", "seq read 1M direct"}, {"cp out", "seq read 1M direct"}}

// hasBufferedPairs reports whether rows hold every job of bufferedPairs
// (-jobs may leave some out).
func hasBufferedPairs(rows []row) bool {
	have := map[string]bool{}
	for _, r := range rows {
		have[r.job] = true
	}
	for _, p := range bufferedPairs {
		if !have[p[0]] || !have[p[1]] {
			return false
		}
	}
	return true
}

func printTable(title, nameA, nameB string, rows []row) {
	fmt.Printf("\n%s\n", title)
	fmt.Printf("| job | %[1]s MB/s | %[2]s MB/s | %[1]s/%[2]s | %[1]s CPU s/GiB | %[2]s CPU s/GiB | CPU %[1]s/%[2]s |\n|---|---|---|---|---|---|---|\n", nameA, nameB)
	for _, r := range rows {
		ma, mb, ratio := medians(r.a, r.b, func(s sample) float64 { return s.mbps })
		ca, cb, cratio := medians(r.a, r.b, func(s sample) float64 { return s.cpuPerGiB })
		fmt.Printf("| %s | %.0f | %.0f | %.2f | %.2f | %.2f | %.2f |\n", r.job, ma, mb, ratio, ca, cb, cratio)
	}
}

func main() {
	if os.Getenv(relayEnv) != "" {
		// A relay process of this one (relay.go).
		if err := runRelayChild(os.Stdin, os.Stdout); err != nil {
			log.Fatalf("benchmount relay: %v", err)
		}
		return
	}
	bin := flag.String("rdmafs", "bin/rdmafs", "the rdmafs binary")
	knfsd := flag.Bool("knfsd", false, "also compare proto=tcp with proto=rdma against knfsd in the qemu guest")
	size := flag.Int("size", 1024, "file size in MiB (ganesha); knfsd's tmpfs export takes at most 128")
	rounds := flag.Int("rounds", 1, "repetitions of each pair (the median is printed)")
	ganesha := flag.Bool("ganesha", true, "measure rdmafs on ganesha against the go-fuse loopback (false: only -knfsd)")
	knfsdNet := flag.String("knfsd-net", "user", "the knfsd guest's network, test/kpeer KPEER_NET: user (qemu slirp, 1500-byte frames) or passt (65520-byte frames)")
	rpcs := flag.Bool("rpcs", false, "instead of fio: count the COMPOUNDs per entry of tar x, ls -l and rm -rf against ganesha")
	relay := flag.Bool("relay", true, "with -knfsd, also mount proto=tcp and proto=rdma through relay processes on this host relaying over TCP to knfsd")
	ganeshaRelay := flag.Bool("ganesha-relay", false, "also mount ganesha through the two relays (tcp-relay, rdma-relay) and compare them")
	exportOn := flag.String("export", "tmpfs", "where ganesha's export lives: tmpfs (/dev/shm, so that the disk is not measured) or disk (ganesha's run directory)")
	uring := flag.Bool("uring", false, "instead of rdmafs against the loopback: rdmafs over FUSE-over-io_uring against rdmafs over /dev/fuse and the loopback (ganesha)")
	nconnect := flag.Bool("nconnect", false, "instead: compare nconnect=1, 2 and 4 with 4 parallel fio jobs against ganesha, over tcp and through an rdma relay (nconnect.go)")
	jobsRE := flag.String("jobs", "", "run only the jobs whose name matches this regexp (e.g. '1M direct')")
	flag.StringVar(&perfDir, "perf", "", "with -knfsd or -ganesha-relay, perf record and perf stat each rdmafs process (and the relay) during each job into this directory")
	flag.BoolVar(&perfRecord, "perf-record", true, "with -perf, perf record as well as perf stat (false: only count, which slows the jobs less)")
	flag.Parse()
	log.SetFlags(0)
	if _, err := exec.LookPath("fio"); err != nil {
		log.Fatal("benchmount: fio not found (apt-get install fio, or make deps)")
	}
	abs, err := filepath.Abs(*bin)
	if err != nil {
		log.Fatal(err)
	}
	var match *regexp.Regexp
	if *jobsRE != "" {
		if match, err = regexp.Compile(*jobsRE); err != nil {
			log.Fatalf("benchmount: -jobs: %v", err)
		}
	}
	defer testpeer.StopAll()
	defer removeSources()

	if *nconnect {
		if err := benchNconnect(abs, *exportOn, *size, *rounds); err != nil {
			log.Fatalf("benchmount: %v", err)
		}
		return
	}

	if *ganesha || *rpcs || *ganeshaRelay {
		if err := benchGanesha(abs, *exportOn, *size, *rounds, *ganesha, *ganeshaRelay && !*rpcs, *rpcs, *uring, match); err != nil {
			log.Fatalf("benchmount: %v", err)
		}
	}
	if !*knfsd || *rpcs {
		return
	}
	if err := benchKnfsd(abs, *knfsdNet, *size, *rounds, *relay, match); err != nil {
		log.Fatalf("benchmount: %v", err)
	}
}

// benchGanesha compares rdmafs on ganesha with the go-fuse loopback of
// the same directory (with floor) and rdma-relay with tcp-relay in front
// of it (with relay), or with rpcs counts COMPOUNDs per entry, or with
// uring compares FUSE-over-io_uring with /dev/fuse (uring.go).
func benchGanesha(abs, exportOn string, size, rounds int, floor, relay, rpcs, uring bool, match *regexp.Regexp) error {
	g, stop, err := startGanesha(exportOn, size)
	if err != nil {
		return err
	}
	defer stop()
	if rpcs {
		steps, err := measureRPCs(abs, "127.0.0.1:"+g.Export, g.Dir, "port="+port(g.Addr))
		if err != nil {
			return err
		}
		printRPCs("COMPOUNDs per entry through rdmafs (proto=tcp, ganesha on this machine, export on "+exportOn+"), each workload on a fresh mount", steps)
		return nil
	}
	if uring {
		return benchURing(abs, g, exportOn, size, rounds, match)
	}
	if floor {
		if err := benchFloor(abs, g, exportOn, size, rounds, match); err != nil {
			return err
		}
	}
	if relay {
		return benchGaneshaRelay(abs, g.Addr, "127.0.0.1:"+g.Export, exportOn, size, rounds, match)
	}
	return nil
}

// startGanesha starts ganesha on an export directory with room for
// files of sizeMiB (exportDir) and returns it and what stops it and
// removes the directory.
func startGanesha(exportOn string, sizeMiB int) (*testpeer.Ganesha, func(), error) {
	dir, err := exportDir(exportOn, sizeMiB)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g, err := testpeer.StartGaneshaWith(ctx, testpeer.GaneshaOptions{ExportDir: dir})
	if err != nil {
		if dir != "" {
			os.RemoveAll(dir)
		}
		return nil, nil, fmt.Errorf("start ganesha: %w", err)
	}
	return g, func() {
		g.Stop()
		if dir != "" {
			os.RemoveAll(dir)
		}
	}, nil
}

// benchFloor compares rdmafs on ganesha with the go-fuse loopback of the
// same directory.
func benchFloor(abs string, g *testpeer.Ganesha, exportOn string, size, rounds int, match *regexp.Regexp) error {
	nfsDir, umountNFS, err := mountRdmafs(abs, "127.0.0.1:"+g.Export, "port="+port(g.Addr))
	if err != nil {
		return err
	}
	defer umountNFS()
	loopDir, umountLoop, err := mountLoopback(g.Dir)
	if err != nil {
		return err
	}
	defer umountLoop()
	nfsPID, err := servingPID(abs, nfsDir)
	if err != nil {
		return err
	}
	rows, err := compare(side{nfsDir, nfsPID}, side{loopDir, os.Getpid()}, selectJobs(jobs(size), match), rounds)
	if err != nil {
		return err
	}
	printTable(fmt.Sprintf("rdmafs (proto=tcp, ganesha on this machine, export on %s) vs go-fuse loopback of the same directory, %d MiB, median of %d", exportOn, size, rounds),
		"rdmafs", "loopback", rows)
	printBuffered("rdmafs", "loopback", rows)
	return nil
}
