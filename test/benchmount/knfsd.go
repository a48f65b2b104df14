package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// variant is one way of mounting a server: its name in the table and the
// side fio runs on. relayPID, if not zero, is a process between the
// client and the server whose CPU time is reported on its own (a relay
// process, relay.go).
type variant struct {
	name     string
	side     side
	relayPID int
}

// rowN is one job's samples on each variant: s[v][round].
type rowN struct {
	job string
	s   [][]sample
	// relay[v][round] is the relay process's CPU seconds per GiB moved,
	// for a variant with a relayPID.
	relay [][]float64
}

// compareN runs each job on every variant, rounds times; each round
// starts one variant later than the one before, so that no variant is
// always first after the previous job.
func compareN(vs []variant, js []job, rounds int) ([]rowN, error) {
	var rows []rowN
	for _, j := range js {
		r := rowN{job: j.name, s: make([][]sample, len(vs)), relay: make([][]float64, len(vs))}
		for round := range rounds {
			for k := range vs {
				i := (round + k) % len(vs)
				smp, relay, err := fioRelay(vs[i], j)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", vs[i].name, err)
				}
				r.s[i] = append(r.s[i], smp)
				r.relay[i] = append(r.relay[i], relay)
			}
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// fioRelay runs j on v and also returns the CPU seconds per GiB moved
// that v's relay process spent (zero without one).
func fioRelay(v variant, j job) (sample, float64, error) {
	if perfDir != "" {
		stop, err := startPerf(v, j)
		if err != nil {
			return sample{}, 0, err
		}
		defer stop()
	}
	if v.relayPID == 0 {
		smp, err := fio(v.side, j)
		return smp, 0, err
	}
	cpu0, err := cpuTime(v.relayPID)
	if err != nil {
		return sample{}, 0, err
	}
	smp, err := fio(v.side, j)
	if err != nil {
		return sample{}, 0, err
	}
	cpu1, err := cpuTime(v.relayPID)
	if err != nil {
		return sample{}, 0, err
	}
	return smp, perGiB(cpu1-cpu0, smp.bytesMoved), nil
}

// perfDir, if set (-perf), is where fioRelay has perf(1) record the
// rdmafs process (and the relay) during each job, one file per variant,
// job and process: perf report -i FILE.data --no-children; FILE.stat
// counts its context switches and system calls (in all and by name).
// Without perfRecord (-perf-record=false) only perf stat runs: the
// sampling slows the jobs more than the counting.
var (
	perfDir    string
	perfRecord = true
)

// startPerf starts perf record on v's rdmafs process and relay and returns
// the function that stops it and waits for the files to be written.
func startPerf(v variant, j job) (func(), error) {
	name := strings.ReplaceAll(v.name+"-"+j.name, " ", "-")
	pids := map[string]int{"client": v.side.pid}
	if v.relayPID != 0 {
		pids["relay"] = v.relayPID
	}
	var cmds []*exec.Cmd
	stop := func() {
		for _, c := range cmds {
			c.Process.Signal(os.Interrupt)
			c.Wait()
		}
	}
	for who, pid := range pids {
		out := filepath.Join(perfDir, fmt.Sprintf("%s-%s.data", name, who))
		if perfRecord {
			// Go binaries keep frame pointers: -g walks them.
			cmd := exec.Command("perf", "record", "-q", "-F", "999", "-g", "-p", strconv.Itoa(pid), "-o", out)
			if err := cmd.Start(); err != nil {
				stop()
				return nil, fmt.Errorf("perf record: %w", err)
			}
			cmds = append(cmds, cmd)
		}
		// And counts: context switches and every system call, in all
		// (raw_syscalls) and by name.
		stat := exec.Command("perf", "stat", "-e", "context-switches,raw_syscalls:sys_enter,syscalls:sys_enter_*",
			"-p", strconv.Itoa(pid), "-o", strings.TrimSuffix(out, ".data")+".stat")
		if err := stat.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("perf stat: %w", err)
		}
		cmds = append(cmds, stat)
	}
	time.Sleep(500 * time.Millisecond) // let perf attach
	return stop, nil
}

// perGiB returns CPU seconds per GiB for cpu spent moving n bytes (zero
// if none moved).
func perGiB(cpu time.Duration, n int64) float64 {
	if n <= 0 {
		return 0
	}
	return cpu.Seconds() / (float64(n) / (1 << 30))
}

// ratio names two variants, by index, whose per-round ratio a table
// prints.
type ratio struct{ a, b int }

// printTableN writes one row per job: each variant's MB/s, the ratios
// (the median of per-round ratios), each variant's client CPU seconds per
// GiB and the same ratios of them, and the relay process's CPU seconds
// per GiB for each variant that has one and the ratios of those.
func printTableN(w io.Writer, title string, vs []variant, ratios []ratio, rows []rowN) {
	var head, sep strings.Builder
	head.WriteString("| job |")
	add := func(format string, a ...any) {
		fmt.Fprintf(&head, " "+format+" |", a...)
		sep.WriteString("---|")
	}
	for _, v := range vs {
		add("%s MB/s", v.name)
	}
	for _, q := range ratios {
		add("%s/%s", vs[q.a].name, vs[q.b].name)
	}
	for _, v := range vs {
		add("%s CPU s/GiB", v.name)
	}
	for _, q := range ratios {
		add("CPU %s/%s", vs[q.a].name, vs[q.b].name)
	}
	for _, v := range vs {
		if v.relayPID != 0 {
			add("%s relay process CPU s/GiB", v.name)
		}
	}
	for _, q := range ratios {
		if relayPair(vs, q) {
			add("relay CPU %s/%s", vs[q.a].name, vs[q.b].name)
		}
	}
	fmt.Fprintf(w, "\n%s\n%s\n|---|%s\n", title, head.String(), sep.String())
	// MB/s, then CPU s/GiB: each variant's median, then the ratios.
	metrics := []struct {
		of     func(sample) float64
		format string
	}{
		{func(s sample) float64 { return s.mbps }, "%.0f"},
		{func(s sample) float64 { return s.cpuPerGiB }, "%.2f"},
	}
	for _, r := range rows {
		var cells []string
		for _, mt := range metrics {
			for i := range vs {
				m, _, _ := medians(r.s[i], r.s[0], mt.of)
				cells = append(cells, fmt.Sprintf(mt.format, m))
			}
			for _, q := range ratios {
				_, _, ratio := medians(r.s[q.a], r.s[q.b], mt.of)
				cells = append(cells, fmt.Sprintf("%.2f", ratio))
			}
		}
		for i, v := range vs {
			if v.relayPID != 0 {
				cells = append(cells, fmt.Sprintf("%.2f", median(r.relay[i])))
			}
		}
		for _, q := range ratios {
			if relayPair(vs, q) {
				cells = append(cells, fmt.Sprintf("%.2f", medianRatio(r.relay[q.a], r.relay[q.b])))
			}
		}
		fmt.Fprintf(w, "| %s | %s |\n", r.job, strings.Join(cells, " | "))
	}
}

// relayPair reports whether both variants of q go through a relay.
func relayPair(vs []variant, q ratio) bool {
	return vs[q.a].relayPID != 0 && vs[q.b].relayPID != 0
}

// medianRatio returns the median of the per-round ratios a[i]/b[i].
func medianRatio(a, b []float64) float64 {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	return median(rs)
}

// pairRows returns the rows of variants a and b as two-sided rows (for
// printBuffered).
func pairRows(rows []rowN, a, b int) []row {
	var out []row
	for _, r := range rows {
		out = append(out, row{job: r.job, a: r.s[a], b: r.s[b]})
	}
	return out
}

// benchKnfsd measures knfsd in the qemu guest, whose network is net
// (test/kpeer KPEER_NET), mounted with proto=tcp and proto=rdma (siw in
// the guest), and with relay also twice through relay processes on this
// host (relay.go): tcp-relay, proto=tcp to a relay, and rdma-relay,
// proto=rdma to a responder on the pure-Go provider, both relaying over
// TCP to the same knfsd. rdma-relay
// takes siw and the guest's emulated CPU out of the RDMA path: if it runs
// as fast as tcp-relay, the client's RDMA path is not what limits
// proto=rdma.
func benchKnfsd(abs, net string, size, rounds int, relay bool, match *regexp.Regexp) error {
	if net != "user" && net != "passt" {
		return fmt.Errorf("-knfsd-net %s: want user or passt", net)
	}
	ksize := min(size, 96)
	js := selectJobs(jobs(ksize), match)
	mounts := 2
	if relay {
		mounts = 4
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Each mount writes its own file in the tmpfs export (the guest has
	// 1 GiB; the export's default is 256 MiB).
	k, err := testpeer.StartKnfsd(ctx, testpeer.KnfsdOptions{Env: []string{"KPEER_NET=" + net},
		Append: fmt.Sprintf("kpeer.exportsize=%dm", mounts*ksize+64)})
	if err != nil {
		return fmt.Errorf("start knfsd: %w", err)
	}
	defer k.Stop()
	ms := []mount{
		{name: "tcp", sub: "bench-tcp", opts: []string{"port=" + port(k.TCPAddr)}},
		{name: "rdma", sub: "bench-rdma", opts: []string{"proto=rdma", "port=" + port(k.RDMAAddr)}},
	}
	// Ratios to proto=tcp, and with the relays rdma-relay to tcp-relay:
	// the same hop, the same server path, only the client's transport
	// differs.
	ratios := []ratio{{1, 0}}
	if relay {
		rms, stop, err := relayMounts(k.TCPAddr)
		if err != nil {
			return err
		}
		defer stop()
		ms = append(ms, rms...)
		ratios = append(ratios, ratio{3, 0}, ratio{3, 2})
	}
	// All mounts see the same tmpfs export: separate directories.
	vs, umount, err := mountVariants(abs, "127.0.0.1:/", ms)
	if err != nil {
		return err
	}
	defer umount()
	rows, err := compareN(vs, js, rounds)
	if err != nil {
		return err
	}
	title := fmt.Sprintf("knfsd in the qemu guest (network %s): proto=tcp, proto=rdma (siw in the guest)", net)
	if relay {
		title += ", tcp-relay and rdma-relay (proto=tcp or proto=rdma to a server on this host relaying over TCP)"
	}
	printTableN(os.Stdout, fmt.Sprintf("%s, %d MiB, median of %d", title, ksize, rounds), vs, ratios, rows)
	printBuffered("rdma", "tcp", pairRows(rows, 1, 0))
	return nil
}
