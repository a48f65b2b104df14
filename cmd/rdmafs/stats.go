package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// TransportStats is what a transport may implement to add its own
// section (credits, chunk counts, registrations) to "rdmafs stats".
type TransportStats interface {
	Stats() map[string]any
}

// runDir holds the stats sockets: /run/rdmafs for root,
// $XDG_RUNTIME_DIR/rdmafs for other users; RDMAFS_RUN_DIR overrides it.
func runDir() string {
	if d := os.Getenv("RDMAFS_RUN_DIR"); d != "" {
		return d
	}
	if x := os.Getenv("XDG_RUNTIME_DIR"); x != "" && os.Geteuid() != 0 {
		return filepath.Join(x, "rdmafs")
	}
	return "/run/rdmafs"
}

// statsSocket is the unix socket of the mount on dir: named by a hash of
// the absolute mountpoint, so any path to it finds the same socket.
func statsSocket(dir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(dir)))
	return filepath.Join(runDir(), hex.EncodeToString(sum[:8])+".sock")
}

type statsServer struct {
	ln net.Listener
}

func startStats(o *mountOptions, m *fuse.Mount, t oncrpc.Transport, retrans *atomic.Uint64) (*statsServer, error) {
	path := statsSocket(o.Dir)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	os.Remove(path) // a stale socket of a process that died; the mountpoint check passed
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			writeStats(conn, o, m, t, retrans, start)
			conn.Close()
		}
	}()
	return &statsServer{ln: ln}, nil
}

func (s *statsServer) Close() {
	s.ln.Close() // removes the socket file
}

// writeStats writes the report, in the spirit of /proc/self/mountstats.
func writeStats(w io.Writer, o *mountOptions, m *fuse.Mount, t oncrpc.Transport, retrans *atomic.Uint64, start time.Time) {
	c := m.FS.Client()
	fmt.Fprintf(w, "pid: %d\n", os.Getpid())
	fmt.Fprintf(w, "device %s:%s mounted on %s with fstype fuse.rdmafs\n", o.Server, o.Export, o.Dir)
	fmt.Fprintf(w, "opts: %s\n", o)
	fmt.Fprintf(w, "server: %s rsize=%d wsize=%d lease=%v\n", c.ServerImpl(), c.RSize(), c.WSize(), c.LeaseTime())
	fmt.Fprintf(w, "age: %v\n", time.Since(start).Round(time.Second))
	s := &m.FS.Stats
	fmt.Fprintf(w, "fuse: lookups=%d opens=%d creates=%d readdirs=%d reads=%d read_bytes=%d writes=%d write_bytes=%d flushes=%d fsyncs=%d write_errors=%d\n",
		s.Lookups.Load(), s.Opens.Load(), s.Creates.Load(), s.Readdirs.Load(), s.Reads.Load(), s.ReadBytes.Load(),
		s.Writes.Load(), s.WriteBytes.Load(), s.Flushes.Load(), s.Fsyncs.Load(), s.WriteErrors.Load())
	ops, recoveries := c.Snapshot()
	fmt.Fprintf(w, "rpc: retransmissions=%d session_recoveries=%d\n", retrans.Load(), recoveries)
	if ts, ok := t.(TransportStats); ok {
		kv := ts.Stats()
		keys := make([]string, 0, len(kv))
		for k := range kv {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(w, "transport:\n")
		for _, k := range keys {
			fmt.Fprintf(w, "  %s: %v\n", k, kv[k])
		}
	}
	fmt.Fprintf(w, "per-op statistics:\n")
	tw := tabwriter.NewWriter(w, 4, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "op\tcount\terrors\tbytes_sent\tavg_ms\tp99_ms\t\n")
	for _, op := range ops {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.3f\t%.3f\t\n", op.Op, op.Count, op.Errors, op.BytesSent, ms(op.Avg), ms(op.P99))
	}
	tw.Flush()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func statsCommand() *cli.Command {
	return &cli.Command{
		Name:      "stats",
		Usage:     "print the statistics of a running mount",
		ArgsUsage: "/mountpoint",
		Description: `Asks the process serving the mount (over a unix socket under /run/rdmafs)
for its statistics: per NFS operation the count, errors, bytes sent,
average and 99th percentile latency; retransmissions and session
recoveries; FUSE request counts and bytes read and written; and the
transport's own counters when it has any.

EXAMPLE:
   rdmafs stats /mnt`,
		Action: func(cctx *cli.Context) error {
			if cctx.NArg() != 1 {
				return exitf(exitUsage, nil, "usage: rdmafs stats /mountpoint")
			}
			dir, err := filepath.Abs(cctx.Args().First())
			if err != nil {
				return exitf(exitUsage, err, "%v", err)
			}
			conn, err := net.Dial("unix", statsSocket(dir))
			if err != nil {
				return exitf(exitUsage, err, "no rdmafs mount on %s (%v)", dir, errors.Unwrap(err))
			}
			defer conn.Close()
			_, err = io.Copy(os.Stdout, conn)
			return err
		},
	}
}

// servingPID asks the mount on dir for the PID of its serving process.
func servingPID(dir string) (int, bool) {
	conn, err := net.DialTimeout("unix", statsSocket(dir), 2*time.Second)
	if err != nil {
		return 0, false
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "pid:")))
	return pid, err == nil
}
