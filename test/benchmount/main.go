// Command benchmount measures rdmafs mounts with fio against a floor, in
// one run, and prints one table (make bench-mount).
//
// It starts nfs-ganesha on a directory of this machine's disk, mounts it
// with rdmafs (proto=tcp) and serves the same directory through a go-fuse
// loopback file system in this process (the FUSE floor: no network, no
// NFS, passthrough off), and runs the same fio jobs on both: 1 MiB
// sequential write and read with O_DIRECT, 4 KiB random read with
// O_DIRECT, and buffered sequential write and read of a large file. With
// -knfsd it also starts knfsd in the qemu guest and compares proto=tcp
// with proto=rdma against it. With -rpcs it instead counts the COMPOUNDs
// per entry that tar x, ls -l and rm -rf take, each on a fresh mount
// (the round trips the Linux client's OPEN+WRITE+CLOSE set the bar for).
//
//	go run ./test/benchmount -rdmafs bin/rdmafs [-knfsd] [-size 1024] [-rpcs]
//
// Figures are MB/s as fio reports them; the ratio is rdmafs over the
// floor (or rdma over tcp). The machine is shared and noisy: each pair
// runs back to back and -rounds repeats them, reporting the median.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	gofuse "github.com/hanwen/go-fuse/v2/fuse"

	"github.com/rdmafs/rdmafs/internal/testpeer"
)

// job is one fio workload.
type job struct {
	name string
	args []string
	read bool // report read bandwidth (else write)
}

func jobs(sizeMiB int) []job {
	size := fmt.Sprintf("--size=%dM", sizeMiB)
	return []job{
		{"seq write 1M direct", []string{"--rw=write", "--bs=1M", "--direct=1", size}, false},
		{"seq read 1M direct", []string{"--rw=read", "--bs=1M", "--direct=1", size}, true},
		{"rand read 4K direct", []string{"--rw=randread", "--bs=4k", "--direct=1", size, "--time_based", "--runtime=5"}, true},
		{"buffered write", []string{"--rw=write", "--bs=1M", size, "--end_fsync=1"}, false},
		{"buffered read", []string{"--rw=read", "--bs=1M", size, "--invalidate=1"}, true},
	}
}

// fio runs one job in dir (on a file left there by the write jobs) and
// returns MB/s.
func fio(dir string, j job) (float64, error) {
	args := append([]string{"--name=bench", "--directory=" + dir, "--filename=benchfile", "--ioengine=psync",
		"--output-format=json", "--group_reporting"}, j.args...)
	out, err := exec.Command("fio", args...).Output()
	if err != nil {
		return 0, fmt.Errorf("fio %s in %s: %w", j.name, dir, err)
	}
	var res struct {
		Jobs []struct {
			Read struct {
				BwBytes float64 `json:"bw_bytes"`
			} `json:"read"`
			Write struct {
				BwBytes float64 `json:"bw_bytes"`
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out[strings.IndexByte(string(out), '{'):], &res); err != nil || len(res.Jobs) == 0 {
		return 0, fmt.Errorf("fio %s: output: %v", j.name, err)
	}
	bw := res.Jobs[0].Write.BwBytes
	if j.read {
		bw = res.Jobs[0].Read.BwBytes
	}
	return bw / 1e6, nil
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
// rdmafs's FUSE I/O sizes.
func mountLoopback(orig string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "benchmount-loopback-")
	if err != nil {
		return "", nil, err
	}
	root, err := fs.NewLoopbackRoot(orig)
	if err != nil {
		return "", nil, err
	}
	sec := time.Second
	srv, err := fs.Mount(dir, root, &fs.Options{AttrTimeout: &sec, EntryTimeout: &sec,
		MountOptions: gofuse.MountOptions{FsName: orig, Name: "loopback", MaxWrite: 1 << 20, MaxReadAhead: 1 << 20, DirectMount: true}})
	if err != nil {
		return "", nil, fmt.Errorf("loopback mount: %w", err)
	}
	return dir, func() {
		srv.Unmount()
		os.Remove(dir)
	}, nil
}

type row struct {
	job  string
	a, b []float64
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// compare runs every job on dirA and dirB, alternating, rounds times.
func compare(dirA, dirB string, sizeMiB, rounds int) ([]row, error) {
	var rows []row
	for _, j := range jobs(sizeMiB) {
		r := row{job: j.name}
		for range rounds {
			a, err := fio(dirA, j)
			if err != nil {
				return nil, err
			}
			b, err := fio(dirB, j)
			if err != nil {
				return nil, err
			}
			r.a, r.b = append(r.a, a), append(r.b, b)
		}
		rows = append(rows, r)
	}
	return rows, nil
}

func printTable(title, nameA, nameB string, rows []row) {
	fmt.Printf("\n%s\n", title)
	fmt.Printf("| job | %s MB/s | %s MB/s | %s/%s |\n|---|---|---|---|\n", nameA, nameB, nameA, nameB)
	for _, r := range rows {
		var ratios []float64
		for i := range r.a {
			if r.b[i] > 0 {
				ratios = append(ratios, r.a[i]/r.b[i])
			}
		}
		fmt.Printf("| %s | %.0f | %.0f | %.2f |\n", r.job, median(r.a), median(r.b), median(ratios))
	}
}

func main() {
	bin := flag.String("rdmafs", "bin/rdmafs", "the rdmafs binary")
	knfsd := flag.Bool("knfsd", false, "also compare proto=tcp with proto=rdma against knfsd in the qemu guest")
	size := flag.Int("size", 1024, "file size in MiB (ganesha); knfsd's tmpfs export takes at most 128")
	rounds := flag.Int("rounds", 1, "repetitions of each pair (the median is printed)")
	rpcs := flag.Bool("rpcs", false, "instead of fio: count the COMPOUNDs per entry of tar x, ls -l and rm -rf against ganesha")
	flag.Parse()
	log.SetFlags(0)
	if _, err := exec.LookPath("fio"); err != nil {
		log.Fatal("benchmount: fio not found (apt-get install fio, or make deps)")
	}
	abs, err := filepath.Abs(*bin)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	defer testpeer.StopAll()

	g, err := testpeer.StartGanesha(ctx)
	if err != nil {
		log.Fatalf("benchmount: start ganesha: %v", err)
	}
	port := g.Addr[strings.LastIndexByte(g.Addr, ':')+1:]
	if *rpcs {
		steps, err := measureRPCs(abs, "127.0.0.1:"+g.Export, g.Dir, "port="+port)
		if err != nil {
			log.Fatalf("benchmount: %v", err)
		}
		printRPCs("COMPOUNDs per entry through rdmafs (proto=tcp, ganesha on this machine), each workload on a fresh mount", steps)
		return
	}
	nfsDir, umountNFS, err := mountRdmafs(abs, "127.0.0.1:"+g.Export, "port="+port)
	if err != nil {
		log.Fatalf("benchmount: %v", err)
	}
	defer umountNFS()
	loopDir, umountLoop, err := mountLoopback(g.Dir)
	if err != nil {
		log.Fatalf("benchmount: %v", err)
	}
	defer umountLoop()
	rows, err := compare(nfsDir, loopDir, *size, *rounds)
	if err != nil {
		log.Fatalf("benchmount: %v", err)
	}
	printTable(fmt.Sprintf("rdmafs (proto=tcp, ganesha on this machine) vs go-fuse loopback of the same directory, %d MiB, median of %d", *size, *rounds),
		"rdmafs", "loopback", rows)

	if !*knfsd {
		return
	}
	k, err := testpeer.StartKnfsd(ctx, testpeer.KnfsdOptions{})
	if err != nil {
		log.Fatalf("benchmount: start knfsd: %v", err)
	}
	tcpPort := k.TCPAddr[strings.LastIndexByte(k.TCPAddr, ':')+1:]
	rdmaPort := k.RDMAAddr[strings.LastIndexByte(k.RDMAAddr, ':')+1:]
	tcpDir, umountTCP, err := mountRdmafs(abs, "127.0.0.1:/", "port="+tcpPort)
	if err != nil {
		log.Fatalf("benchmount: %v", err)
	}
	defer umountTCP()
	rdmaDir, umountRDMA, err := mountRdmafs(abs, "127.0.0.1:/", "proto=rdma", "port="+rdmaPort)
	if err != nil {
		log.Fatalf("benchmount: %v", err)
	}
	defer umountRDMA()
	// Both mounts see the same tmpfs export: separate directories.
	for _, d := range []string{filepath.Join(tcpDir, "bench-tcp"), filepath.Join(rdmaDir, "bench-rdma")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			log.Fatal(err)
		}
	}
	ksize := min(*size, 96)
	rows, err = compare(filepath.Join(rdmaDir, "bench-rdma"), filepath.Join(tcpDir, "bench-tcp"), ksize, *rounds)
	if err != nil {
		log.Fatalf("benchmount: %v", err)
	}
	printTable(fmt.Sprintf("knfsd in the qemu guest: proto=rdma vs proto=tcp, %d MiB, median of %d", ksize, *rounds), "rdma", "tcp", rows)
}
