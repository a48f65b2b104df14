// Command soak runs rdmafs's data-verification workload (package
// test/soak) in directories of mounted file systems: random writes,
// reads, truncates and mmap accesses by several processes, each read
// checked against a model of the file. It exits 1 on a mismatch or error.
//
//	go run ./test/soakrun -dir /mnt/nfs/soak -duration 10m
//	go run ./test/soakrun -dir /mnt/a/soak,/mnt/b/soak -procs 2   # handoffs across two mounts
//
// make soak runs it (through cmd/rdmafs's TestSoak) against the test
// servers; this command is for any mount.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rdmafs/rdmafs/test/soak"
)

func main() {
	soak.MaybeWorker()
	var cfg soak.Config
	dirs := flag.String("dir", "", "comma-separated directories (worker i uses the i-th, cyclically)")
	flag.IntVar(&cfg.Procs, "procs", 2, "worker processes")
	flag.IntVar(&cfg.Files, "files", 4, "files per worker")
	flag.IntVar(&cfg.MaxLen, "maxlen", 2<<20, "largest file size")
	flag.IntVar(&cfg.MaxOp, "maxop", 256<<10, "largest single access")
	flag.Uint64Var(&cfg.Seed, "seed", 0, "seed (0: from the clock)")
	flag.DurationVar(&cfg.Duration, "duration", 20*time.Second, "how long to run")
	flag.Int64Var(&cfg.Ops, "ops", 0, "stop each worker after this many operations (0: no limit)")
	flag.BoolVar(&cfg.NoMmap, "nommap", false, "no mmap reads and writes")
	flag.StringVar(&cfg.OpLog, "oplog", "", "write every operation to FILE.wN")
	flag.DurationVar(&cfg.Progress, "progress", time.Minute, "report counts this often (0: never)")
	flag.Parse()
	if *dirs == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: soak -dir DIR[,DIR...] [flags]")
		flag.PrintDefaults()
		os.Exit(2)
	}
	cfg.Dirs = strings.Split(*dirs, ",")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := soak.Run(ctx, cfg)
	fmt.Println(res)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if res.Mismatches != 0 || res.Errors != 0 || res.Ops == 0 {
		os.Exit(1)
	}
}
