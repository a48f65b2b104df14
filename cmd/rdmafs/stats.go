package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/urfave/cli/v2"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// TransportStats is what a transport may implement to add its own
// section (credits, chunk counts, registrations) to "rdmafs stats".
type TransportStats interface {
	Stats() map[string]any
}

type statsServer struct {
	ln net.Listener
}

func startStats(o *mountOptions, m *fuse.Mount, t oncrpc.Transport, retrans *atomic.Uint64) (*statsServer, error) {
	d, err := makeRunDir()
	if err != nil {
		return nil, err
	}
	// It replaces a stale socket of a process that died (the mountpoint
	// check passed), and its Close unlinks the socket only while it is
	// still this mount's: a later mount on the same directory (after a
	// lazy unmount) has replaced it with its own.
	ln, err := listenUnixPrivate(filepath.Join(d, socketName(o.Dir)))
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
			serveStats(conn, o, m, t, retrans, start)
		}
	}()
	return &statsServer{ln: ln}, nil
}

func (s *statsServer) Close() { s.ln.Close() }

// The stats socket's requests: a client writes one line, then reads the
// answer until EOF. A client that writes nothing gets the statistics.
const (
	statsRequest  = "stats"
	stacksRequest = "stacks" // every goroutine's stack, for a hung mount
)

func serveStats(conn net.Conn, o *mountOptions, m *fuse.Mount, t oncrpc.Transport, retrans *atomic.Uint64, start time.Time) {
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	line, _ := bufio.NewReader(io.LimitReader(conn, 64)).ReadString('\n')
	conn.SetDeadline(time.Now().Add(time.Minute))
	if strings.TrimSpace(line) == stacksRequest {
		fmt.Fprintf(conn, "pid: %d\n", os.Getpid())
		pprof.Lookup("goroutine").WriteTo(conn, 2)
		return
	}
	writeStats(conn, o, m, t, retrans, start)
}

// writeStats writes the report, in the spirit of /proc/self/mountstats.
func writeStats(w io.Writer, o *mountOptions, m *fuse.Mount, t oncrpc.Transport, retrans *atomic.Uint64, start time.Time) {
	c := m.FS.Client()
	fmt.Fprintf(w, "pid: %d\n", os.Getpid())
	fmt.Fprintf(w, "device %s:%s mounted on %s with fstype fuse.rdmafs\n", o.Server, o.Export, o.Dir)
	fmt.Fprintf(w, "opts: %s\n", o)
	impl := termSafe(c.ServerImpl()) // the server's words: no escape sequences
	if impl == "" {
		impl = "(no implementation id)" // EXCHANGE_ID's eir_server_impl_id is optional
	}
	fmt.Fprintf(w, "server: %s vers=4.%d rsize=%d wsize=%d lease=%v\n", impl, c.MinorVersion(), c.RSize(), c.WSize(), c.LeaseTime())
	fmt.Fprintf(w, "age: %v\n", time.Since(start).Round(time.Second))
	if o.Sec != nfsclient.SecSys {
		// A line per user, as rpc.gssd's contexts; the principal
		// comes from a user's ticket cache: no escape sequences.
		users := c.GSSUsers()
		fmt.Fprintf(w, "sec=%v contexts: %d\n", o.Sec, len(users))
		for _, u := range users {
			fmt.Fprintf(w, "  uid %d principal %s service %v expires %s\n", u.UID, termSafe(u.Principal), u.Service, u.Expires.UTC().Format(time.RFC3339))
		}
	}
	s := &m.FS.Stats
	fmt.Fprintf(w, "fuse: lookups=%d opens=%d creates=%d readdirs=%d reads=%d read_bytes=%d writes=%d write_bytes=%d flushes=%d fsyncs=%d write_errors=%d dir_getattrs_cached=%d\n",
		s.Lookups.Load(), s.Opens.Load(), s.Creates.Load(), s.Readdirs.Load(), s.Reads.Load(), s.ReadBytes.Load(),
		s.Writes.Load(), s.WriteBytes.Load(), s.Flushes.Load(), s.Fsyncs.Load(), s.WriteErrors.Load(), s.GetattrsAnswered.Load())
	fmt.Fprintf(w, "fuse transport: %s ring_requests=%d\n", m.FS.FUSETransport(), m.FS.RingRequests())
	// FUSE_INTERRUPTs a request waited through (its caller was not
	// dying when it came) and those honoured (the caller was found
	// dying); a blocking lock wait's is in neither.
	fmt.Fprintf(w, "interrupts: waited=%d honoured=%d\n", s.InterruptsWaited.Load(), s.InterruptsHonoured.Load())
	if r := s.LastEIO.Load(); r != nil {
		fmt.Fprintf(w, "eio: count=%d last=%s %s: %s\n", s.EIOs.Load(), r.Time.Format(time.RFC3339), r.Op, termSafe(r.Err))
	}
	// User-space copies of file data, by layer (the transport's line,
	// "bytes copied", is under transport).
	fmt.Fprintf(w, "data copies: fuse=%d nfs=%d\n", s.BytesCopied.Load(), c.BytesCopied())
	ops, recoveries := c.Snapshot()
	fmt.Fprintf(w, "rpc: retransmissions=%d session_recoveries=%d\n", retrans.Load(), recoveries)
	fmt.Fprintf(w, "callbacks: cb_recall=%d cb_notify_lock=%d\n", c.Recalls(), c.LockNotifies())
	ds, rs := c.DelegationStats(), c.Recovery()
	if st, ok := c.Slots(); ok {
		// What the mount waits for, as /sys/kernel/debug/sunrpc's tasks
		// files show it for the kernel client.
		fmt.Fprintf(w, "slots: %d target=%d retired=%d in_flight=%d waiting=%d\n", st.Slots, st.Target+1, st.Poisoned, len(st.InFlight), st.Waiting)
		for _, f := range st.InFlight {
			fmt.Fprintf(w, "  slot %d xid 0x%08x %s for %v\n", f.Slot, f.XID, f.Op, f.Age.Round(time.Millisecond))
		}
	}
	fmt.Fprintf(w, "delegations: granted=%d recalled=%d returned=%d held=%d\n", ds.Granted, ds.Recalled, ds.Returned, ds.Held)
	fmt.Fprintf(w, "server restarts: reclaimed_opens=%d reclaimed_locks=%d lost_opens=%d\n", rs.ReclaimedOpens, rs.ReclaimedLocks, rs.LostOpens)
	if mt, ok := t.(*oncrpc.MultiTransport); ok {
		// nconnect: a line per connection; the transport section below
		// is the first connection's (the others share its memory).
		fmt.Fprintf(w, "connections: %d\n", mt.Len())
		for i, cs := range mt.Stats() {
			state := "up"
			if !cs.Up {
				state = "down"
			}
			fmt.Fprintf(w, "  connection %d: %s calls=%d bytes_sent=%d bytes_received=%d resent=%d lost=%d reconnects=%d\n",
				i, state, cs.Calls, cs.BytesSent, cs.BytesRecv, cs.Resent, cs.Failures, cs.Reconnects)
		}
		t = mt.Conn(0)
	}
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
		Usage:     "print the statistics of a running mount or relay",
		ArgsUsage: "/mountpoint | --relay PORT",
		Description: `Asks the process serving the mount, over a unix socket, for its
statistics: per NFS operation the count, errors, bytes sent, average and
99th percentile latency; retransmissions and session recoveries; FUSE
request counts and bytes read and written; the session's slots and the
calls on them that the server has not answered yet, with their age; with
nconnect, a line per connection (up or down, calls, bytes, calls resent
on it after their own connection broke, losses, reconnects); and the
transport's own counters when it has any.

With --stacks it prints instead the stack of every goroutine of the
serving process: what a mount that hangs is waiting for. Attach it to a
bug report.

The socket is /run/rdmafs/HASH.sock for mounts made by root, and
$XDG_RUNTIME_DIR/rdmafs/HASH.sock (or, without XDG_RUNTIME_DIR,
/tmp/rdmafs-UID/HASH.sock, a directory private to the user) for mounts
made by other users; HASH is a hash of the mountpoint. "rdmafs stats"
looks in root's, its own user's and the mount owner's places.
RDMAFS_RUN_DIR, when set, replaces all of them. The mount refuses a
directory that is not the user's own or that others may write to. The
socket is 0600 and answers only the user who made the mount (or started
the relay) and root. Strings the server chose (its implementation id,
error texts) are printed quoted (Go syntax) when they hold control
characters or invalid UTF-8.

With --relay PORT it prints instead the counters of the "rdmafs relay"
listening on PORT (its socket is relay-PORT.sock in the same places):
connections open, accepted and refused; calls, bytes, calls the server
did not answer; callbacks relayed to clients; errors (chunks, replies,
clients exceeding their credits or leaving RDMA Reads unanswered, broken
server connections); its limits; and a line per connection.

EXIT STATUS:
   0 printed; 1 bad usage, or no rdmafs mount on the directory (no relay
   on the port), or no answer (another user's socket); 141 the reader of
   the output went away (as a command killed by SIGPIPE).

EXAMPLES:
   rdmafs stats /mnt
   rdmafs stats --relay 20049
   rdmafs stats --stacks /mnt > rdmafs-stacks.txt`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "stacks", Usage: "print every goroutine's stack instead of the statistics"},
			&cli.StringFlag{Name: "relay", Usage: "print the statistics of the rdmafs relay on `PORT` instead of a mount's"},
		},
		Action: func(cctx *cli.Context) error {
			if port := cctx.String("relay"); port != "" {
				return printRelayStats(port)
			}
			if cctx.NArg() != 1 {
				return exitf(exitUsage, nil, "usage: rdmafs stats /mountpoint")
			}
			dir, err := filepath.Abs(cctx.Args().First())
			if err != nil {
				return exitf(exitUsage, err, "%v", err)
			}
			conn, err := dialStats(dir, 5*time.Second)
			if err != nil {
				return exitf(exitUsage, err, "no rdmafs mount on %s (%v)", dir, err)
			}
			defer conn.Close()
			req := statsRequest
			if cctx.Bool("stacks") {
				req = stacksRequest
			}
			if _, err := io.WriteString(conn, req+"\n"); err != nil {
				return exitf(exitUsage, err, "stats socket of %s: %v", dir, err)
			}
			return copyOut(conn)
		},
	}
}

// printRelayStats prints the statistics of the relay on port.
func printRelayStats(port string) error {
	conn, err := dialRelayStats(port, 5*time.Second)
	if err != nil {
		return exitf(exitUsage, err, "no rdmafs relay on port %s (%v)", port, err)
	}
	defer conn.Close()
	return copyOut(conn)
}

// exitBrokenPipe is the exit status of a command whose standard output
// was closed by its reader, the shell's for a death by SIGPIPE.
const exitBrokenPipe = 128 + int(syscall.SIGPIPE)

// copyOut copies the answer on conn to standard output. A reader that
// has gone (rdmafs stats | head -1) ends it quietly, as it ends cat. No
// answer at all is an error: the socket answers only its own user and
// root.
func copyOut(conn net.Conn) error {
	n, err := io.Copy(os.Stdout, conn)
	switch {
	case errors.Is(err, syscall.EPIPE):
		return exitf(exitBrokenPipe, err, "")
	case err != nil:
		return exitf(exitUsage, err, "stats socket: %v", err)
	case n == 0:
		return exitf(exitUsage, nil, "the stats socket gave no answer (it answers only the user who started the process, and root)")
	}
	return nil
}

// termSafe returns s as it may be printed to a terminal: s itself when it
// is valid UTF-8 made of printable characters and spaces, else s quoted
// as a Go string (strconv.Quote), so that a string a server chose can
// carry no control characters or escape sequences to the terminal.
func termSafe(s string) string {
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// servingPID asks the mount on dir for the PID of its serving process.
func servingPID(dir string) (int, bool) {
	conn, err := dialStats(dir, 2*time.Second)
	if err != nil {
		return 0, false
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, statsRequest+"\n"); err != nil {
		return 0, false
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "pid:")))
	return pid, err == nil
}
