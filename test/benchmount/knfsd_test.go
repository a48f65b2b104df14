package main

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestPrintTableN(t *testing.T) {
	vs := []variant{{name: "tcp"}, {name: "rdma"}, {name: "rdma-relay", relayPID: 1}}
	// Three rounds; the medians are of 3 values, the ratios per round.
	rows := []rowN{{
		job: "seq read 1M direct",
		s: [][]sample{
			{{mbps: 100, cpuPerGiB: 2}, {mbps: 120, cpuPerGiB: 4}, {mbps: 80, cpuPerGiB: 3}},
			{{mbps: 50, cpuPerGiB: 4}, {mbps: 48, cpuPerGiB: 12}, {mbps: 40, cpuPerGiB: 9}},
			{{mbps: 90, cpuPerGiB: 1}, {mbps: 60, cpuPerGiB: 2}, {mbps: 88, cpuPerGiB: 1.5}},
		},
		relay: [][]float64{nil, nil, {7, 5, 6}},
	}}
	var b strings.Builder
	printTableN(&b, "title", vs, []ratio{{1, 0}, {2, 0}, {2, 1}}, rows)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("got %d lines, want 4 (title, head, rule, row):\n%s", len(lines), b.String())
	}
	wantHead := "| job | tcp MB/s | rdma MB/s | rdma-relay MB/s | rdma/tcp | rdma-relay/tcp | rdma-relay/rdma | tcp CPU s/GiB | rdma CPU s/GiB | rdma-relay CPU s/GiB | CPU rdma/tcp | CPU rdma-relay/tcp | CPU rdma-relay/rdma | rdma-relay relay process CPU s/GiB |"
	if lines[1] != wantHead {
		t.Errorf("head:\n got %s\nwant %s", lines[1], wantHead)
	}
	if got, want := strings.Count(lines[2], "---"), strings.Count(wantHead, "|")-1; got != want {
		t.Errorf("rule %q has %d columns, want %d", lines[2], got, want)
	}
	// MB/s medians 100, 48, 88; ratios rdma/tcp 0.5, 0.4, 0.5 -> 0.50,
	// relay/tcp 0.9, 0.5, 1.1 -> 0.90, relay/rdma 1.8, 1.25, 2.2 -> 1.80;
	// CPU medians 3, 9, 1.5; CPU ratios rdma/tcp 2, 3, 3 -> 3.00,
	// relay/tcp 0.5, 0.5, 0.5 -> 0.50, relay/rdma 0.25, 1/6, 1/6 -> 0.17;
	// relay process 6.
	want := "| seq read 1M direct | 100 | 48 | 88 | 0.50 | 0.90 | 1.80 | 3.00 | 9.00 | 1.50 | 3.00 | 0.50 | 0.17 | 6.00 |"
	if lines[3] != want {
		t.Errorf("row:\n got %s\nwant %s", lines[3], want)
	}
}

// TestPrintTableNRelayRatio checks the relay CPU ratio column of two
// relayed variants.
func TestPrintTableNRelayRatio(t *testing.T) {
	vs := []variant{{name: "tcp-relay", relayPID: 1}, {name: "rdma-relay", relayPID: 1}}
	rows := []rowN{{
		job: "j",
		s:   [][]sample{{{mbps: 10, cpuPerGiB: 1}, {mbps: 10, cpuPerGiB: 1}, {mbps: 10, cpuPerGiB: 1}}, {{mbps: 9, cpuPerGiB: 2}, {mbps: 7, cpuPerGiB: 2}, {mbps: 8, cpuPerGiB: 2}}},
		// Per-round ratios 3, 1.5, 0.5 (the last round's tcp relay was slow): median 1.5.
		relay: [][]float64{{1, 2, 8}, {3, 3, 4}},
	}}
	var b strings.Builder
	printTableN(&b, "t", vs, []ratio{{1, 0}}, rows)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if !strings.HasSuffix(lines[1], "| tcp-relay relay process CPU s/GiB | rdma-relay relay process CPU s/GiB | relay CPU rdma-relay/tcp-relay |") {
		t.Errorf("head: %s", lines[1])
	}
	if want := "| j | 10 | 8 | 0.80 | 1.00 | 2.00 | 2.00 | 2.00 | 3.00 | 1.50 |"; lines[3] != want {
		t.Errorf("row:\n got %s\nwant %s", lines[3], want)
	}
}

func TestPrintTableNNoRelay(t *testing.T) {
	vs := []variant{{name: "tcp"}, {name: "rdma"}}
	rows := []rowN{{job: "j", s: [][]sample{{{mbps: 10, cpuPerGiB: 1}}, {{mbps: 5, cpuPerGiB: 2}}}, relay: [][]float64{{0}, {0}}}}
	var b strings.Builder
	printTableN(&b, "t", vs, []ratio{{1, 0}}, rows)
	if strings.Contains(b.String(), "relay") {
		t.Errorf("table without a relay variant has a relay column:\n%s", b.String())
	}
	if !strings.Contains(b.String(), "| j | 10 | 5 | 0.50 | 1.00 | 2.00 | 2.00 |") {
		t.Errorf("row missing or wrong:\n%s", b.String())
	}
}

func TestSelectJobs(t *testing.T) {
	all := jobs(16)
	if got := selectJobs(all, nil); len(got) != len(all) {
		t.Errorf("nil match kept %d of %d jobs", len(got), len(all))
	}
	got := selectJobs(all, regexp.MustCompile("1M direct"))
	var names []string
	for _, j := range got {
		names = append(names, j.name)
	}
	if strings.Join(names, ",") != "seq write 1M direct,seq read 1M direct" {
		t.Errorf("selectJobs(1M direct) = %q", names)
	}
	if hasBufferedPairs(pairRows([]rowN{{job: got[0].name, s: make([][]sample, 1)}, {job: got[1].name, s: make([][]sample, 1)}}, 0, 0)) {
		t.Error("hasBufferedPairs true without the buffered jobs")
	}
	var rows []row
	for _, j := range all {
		rows = append(rows, row{job: j.name})
	}
	if !hasBufferedPairs(rows) {
		t.Error("hasBufferedPairs false with every job")
	}
}

func TestPerGiB(t *testing.T) {
	if got := perGiB(3*time.Second, 1<<29); got != 6 {
		t.Errorf("perGiB(3s, 512 MiB) = %v, want 6", got)
	}
	if got := perGiB(time.Second, 0); got != 0 {
		t.Errorf("perGiB(1s, 0) = %v, want 0", got)
	}
}
