// Command peer starts one of the test servers the way the integration
// tests do (test/testpeer: free loopback ports, a private run
// directory, ready once it answers an RPC NULL call) and keeps it up for a
// script: scripts/xfstests.sh runs it in the background, reads the
// server's addresses from its standard output and ends it by closing its
// standard input or with SIGTERM.
//
//	peer -server ganesha -dirs test,scratch
//	peer -server knfsd -append kpeer.exportsize=1g -env KPEER_MEM=2048
//
// Once the server is up, peer prints shell assignments, one a line, then
// READY:
//
//	PEER_TCP=127.0.0.1:PORT      NFS over TCP
//	PEER_RDMA=127.0.0.1:PORT     RPC-over-RDMA (knfsd only)
//	PEER_EXPORT=/export          the path to mount (knfsd: /)
//	PEER_DIR=/tmp/...            the host directory behind the export (ganesha only)
//	PEER_LOG=/tmp/...            the server's log (ganesha.log, or the guest's serial.log)
//
// -dirs makes those directories in the export first. -logs DIR copies the
// server's logs there when it stops (the run directory is removed).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "peer: %v\n", err)
		os.Exit(1)
	}
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, " ") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

// run starts the server, writes its variables and READY to stdout, and
// stops the server once stdin ends or ctx is done.
func run(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	flags := flag.NewFlagSet("peer", flag.ContinueOnError)
	server := flags.String("server", "ganesha", "ganesha or knfsd")
	dirs := flags.String("dirs", "", "comma-separated directories to make in the export")
	exportDir := flags.String("export-dir", "", "ganesha: the host directory to export (default: one in its run directory)")
	appendArgs := flags.String("append", "", "knfsd: extra guest kernel command line (kpeer.*)")
	logs := flags.String("logs", "", "copy the server's logs into this directory when it stops")
	var env multi
	flags.Var(&env, "env", "knfsd: a KPEER_* setting for test/kpeer/run.sh (repeatable)")
	if err := flags.Parse(args); err != nil {
		return err
	}
	var (
		vars   []string
		logFn  string
		mkdirs func(ctx context.Context, dirs []string) error
		halt   func() error
	)
	startCtx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	switch *server {
	case "ganesha":
		g, err := testpeer.StartGaneshaWith(startCtx, testpeer.GaneshaOptions{ExportDir: *exportDir})
		if err != nil {
			return err
		}
		halt = g.Stop
		logFn = filepath.Join(g.RunDir, "ganesha.log")
		vars = []string{"PEER_TCP=" + g.Addr, "PEER_EXPORT=" + g.Export, "PEER_DIR=" + g.Dir, "PEER_LOG=" + logFn}
		mkdirs = func(_ context.Context, dirs []string) error {
			for _, d := range dirs {
				if err := os.MkdirAll(filepath.Join(g.Dir, d), 0o755); err != nil {
					return err
				}
			}
			return nil
		}
	case "knfsd":
		k, err := testpeer.StartKnfsd(startCtx, testpeer.KnfsdOptions{Append: *appendArgs, Env: env})
		if err != nil {
			return err
		}
		halt = k.Stop
		logFn = filepath.Join(k.RunDir, "serial.log")
		vars = []string{"PEER_TCP=" + k.TCPAddr, "PEER_RDMA=" + k.RDMAAddr, "PEER_EXPORT=/", "PEER_LOG=" + logFn}
		mkdirs = func(ctx context.Context, dirs []string) error {
			var cmd []string
			for _, d := range dirs {
				cmd = append(cmd, "mkdir -p "+path.Join("/export", d))
			}
			out, err := k.Exec(ctx, strings.Join(cmd, " && "))
			if err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			return nil
		}
	default:
		return fmt.Errorf("-server %q: want ganesha or knfsd", *server)
	}
	defer func() {
		if *logs != "" {
			if err := copyFile(logFn, filepath.Join(*logs, filepath.Base(logFn))); err != nil {
				fmt.Fprintf(os.Stderr, "peer: keeping the log: %v\n", err)
			}
		}
		if err := halt(); err != nil {
			fmt.Fprintf(os.Stderr, "peer: stop: %v\n", err)
		}
	}()
	if *dirs != "" {
		if err := mkdirs(startCtx, strings.Split(*dirs, ",")); err != nil {
			return fmt.Errorf("making %s in the export: %w", *dirs, err)
		}
	}
	w := bufio.NewWriter(stdout)
	for _, v := range vars {
		fmt.Fprintln(w, v)
	}
	fmt.Fprintln(w, "READY")
	if err := w.Flush(); err != nil {
		return err
	}

	// Up until stdin closes or a signal comes.
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(eof)
	}()
	select {
	case <-eof:
	case <-ctx.Done():
	}
	return nil
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	return os.WriteFile(to, b, 0o644)
}
