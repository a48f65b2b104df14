package main

import (
	"fmt"
	"os"
)

// The nconnect comparison (-nconnect): rdmafs with nconnect=1, 2 and 4
// against ganesha on this machine, over TCP straight to ganesha and over
// RPC-over-RDMA through an rdma relay process (relay.go, TCP on to
// ganesha), with four fio jobs in parallel. The six mounts take turns in
// each round (compareN), and each ratio is the median of the per-round
// ratios over nconnect=1 on the same transport.

// nconnects are the connection counts compared.
var nconnects = []int{1, 2, 4}

// nconnectJobs are four fio jobs at once, each on its own quarter of
// one file (offset_increment), 1 MiB sequential O_DIRECT writes, then
// reads.
func nconnectJobs(sizeMiB int) []job {
	q := max(1, sizeMiB/4)
	par := []string{"--numjobs=4", fmt.Sprintf("--size=%dM", q), fmt.Sprintf("--offset_increment=%dM", q), "--bs=1M", "--direct=1"}
	return []job{
		{name: "4 jobs seq write 1M direct", args: append([]string{"--rw=write"}, par...)},
		{name: "4 jobs seq read 1M direct", args: append([]string{"--rw=read"}, par...), read: true},
	}
}

// benchNconnect runs the nconnect comparison with a file of size MiB in
// all (a quarter per job), rounds times.
func benchNconnect(abs, exportOn string, size, rounds int) error {
	// Six files of size MiB; exportDir asks for room for five times its size.
	g, stop, err := startGanesha(exportOn, (2*len(nconnects)*size+4)/5)
	if err != nil {
		return err
	}
	defer stop()
	relay, err := startRelayProcess("rdma", g.Addr)
	if err != nil {
		return err
	}
	defer relay.stop()
	var ms []mount
	var ratios []ratio
	for _, proto := range []struct{ name, opt, port string }{
		{"tcp", "proto=tcp", port(g.Addr)},
		{"rdma-relay", "proto=rdma", port(relay.addr)},
	} {
		base := len(ms)
		for i, n := range nconnects {
			m := mount{name: fmt.Sprintf("%s nc=%d", proto.name, n), sub: fmt.Sprintf("bench-%s-nc%d", proto.name, n),
				opts: []string{proto.opt, "port=" + proto.port, fmt.Sprintf("nconnect=%d", n)}}
			if proto.name == "rdma-relay" {
				m.relayPID = relay.pid
			}
			ms = append(ms, m)
			if i > 0 {
				ratios = append(ratios, ratio{base + i, base})
			}
		}
	}
	vs, umount, err := mountVariants(abs, "127.0.0.1:"+g.Export, ms)
	if err != nil {
		return err
	}
	defer umount()
	rows, err := compareN(vs, nconnectJobs(size), rounds)
	if err != nil {
		return err
	}
	printTableN(os.Stdout, fmt.Sprintf("nconnect: rdmafs with 1, 2 and 4 connections, 4 parallel fio jobs on one %d MiB file (a quarter each), ganesha on this machine (export on %s): tcp straight to ganesha, rdma-relay through a relay process on this host (TCP on to ganesha); median of %d rounds, ratios are medians of per-round ratios",
		size, exportOn, rounds), vs, ratios, rows)
	return nil
}
