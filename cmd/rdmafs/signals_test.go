package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// The signal tests run testdata/signals.c on mounts of a ganesha of
// their own, paused (SIGSTOP) so that calls wait for it, over both FUSE
// transports.

// fuseTransports are the mount options for each FUSE transport.
var fuseTransports = []string{"nouring", "uring"}

// TestGaneshaSignalsHardMountWaits has a program with an SA_RESTART
// handler for SIGUSR1 stat, open, rename and read on a mount whose
// server is paused for two seconds, each call in a thread that gets
// SIGUSR1 every 2 ms: every call must succeed (the stat with ENOENT), as
// on a kernel NFS hard mount, where a signal that is not fatal never
// ends a wait. Before, rdmafs answered the kernel's FUSE_INTERRUPT with
// EINTR, which the program saw as "Interrupted system call".
func TestGaneshaSignalsHardMountWaits(t *testing.T) {
	bin := buildC(t, "signals")
	g, p := ownGanesha(t)
	// The files are made through a mount of their own, so that the
	// mounts under test have none of them cached: each call goes to the
	// server.
	setup := testDir(t, mount(t, p))
	for _, tr := range fuseTransports {
		d := filepath.Join(setup, tr)
		for _, name := range []string{"", "ofile", "ra", "rfile"} {
			var err error
			if name == "" {
				err = os.Mkdir(d, 0o777)
			} else {
				err = os.WriteFile(filepath.Join(d, name), make([]byte, 8192), 0o666)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tr := range fuseTransports {
		t.Run(tr, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "rdmafs.log")
			mnt := mountWith(t, p, []string{"-v", "fuse", "--log", log}, tr)
			d := filepath.Join(mnt, filepath.Base(setup), tr)
			c := startProg(t, bin, "restart", d)
			c.expect(t, "ready")
			if err := g.Pause(); err != nil {
				t.Fatal(err)
			}
			paused := true
			defer func() {
				if paused {
					g.Resume()
				}
			}()
			c.send(t, "go")
			c.expect(t, "started")
			time.Sleep(2 * time.Second) // the calls wait for the server
			if err := g.Resume(); err != nil {
				t.Fatal(err)
			}
			paused = false
			results := map[string]callResult{}
			for range 4 {
				r := parseCall(t, c.line(t))
				results[r.name] = r
			}
			c.wait(t)
			for _, name := range []string{"stat", "open", "rename", "read"} {
				r, ok := results[name]
				switch {
				case !ok:
					t.Errorf("%s: no result", name)
				case r.errno == syscall.EINTR:
					t.Errorf("%s: %v (a signal that is not fatal ended the call)", name, r.errno)
				case name == "stat" && r.errno != syscall.ENOENT, name != "stat" && r.ret < 0:
					t.Errorf("%s: ret=%d %v", name, r.ret, r.errno)
				case r.signals == 0:
					t.Errorf("%s: no signal arrived during the call: the test tests nothing", name)
				}
			}
			// rdmafs saw the kernel's interrupts and waited through them.
			// Over io_uring the kernel does not interrupt every request
			// that is waited for (some runs saw none; others EINTR
			// before the fix), so only /dev/fuse must show them.
			if n := strings.Count(readFile(log), ": not dying: the request goes on"); n == 0 && tr == "nouring" {
				t.Errorf("the log has no interrupt waited through:\n%s", readFile(log))
			} else {
				t.Logf("%d interrupts waited through; results %+v", n, results)
			}
			if _, err := os.Stat(filepath.Join(d, "rb")); err != nil {
				t.Errorf("after the rename: %v", err)
			}
		})
	}
}

// TestGaneshaSignalsLockWaitEINTR checks the exception: a blocking lock
// wait (fcntl F_SETLKW, flock without LOCK_NB) that a signal with a
// handler installed without SA_RESTART arrives at returns EINTR, as
// POSIX says and the kernel client's does.
func TestGaneshaSignalsLockWaitEINTR(t *testing.T) {
	bin := buildC(t, "signals")
	_, p := ownGanesha(t)
	for _, tr := range fuseTransports {
		t.Run(tr, func(t *testing.T) {
			d := testDir(t, mount(t, p, tr))
			f := filepath.Join(d, "lock")
			if err := os.WriteFile(f, nil, 0o666); err != nil {
				t.Fatal(err)
			}
			c := startProg(t, bin, "lockwait", f)
			for _, name := range []string{"setlkw", "flock"} {
				r := parseCall(t, c.line(t))
				if r.name != name || r.ret != -1 || r.errno != syscall.EINTR {
					t.Errorf("%s: got %+v, want ret=-1 EINTR", name, r)
				}
			}
			c.wait(t)
		})
	}
}

// TestGaneshaSignalsKill checks what SIGKILL does to processes waiting on
// a paused server: the kernel marks the waiting thread (SIGKILL in its
// SigPnd), a stat (LOOKUP) ends at once and the process dies while the
// server is still paused; an unlink (REMOVE changes state on the server,
// so rdmafs runs it to completion) dies once the server answers, and the
// file is gone.
func TestGaneshaSignalsKill(t *testing.T) {
	bin := buildC(t, "signals")
	g, p := ownGanesha(t)
	for _, tr := range fuseTransports {
		t.Run(tr, func(t *testing.T) {
			mnt := mount(t, p, tr)
			d := testDir(t, mnt)
			// Directories of their own: the stat's LOOKUP holds its
			// directory's lock, which the unlink would wait for.
			for _, sub := range []string{"s", "u"} {
				if err := os.Mkdir(filepath.Join(d, sub), 0o777); err != nil {
					t.Fatal(err)
				}
			}
			victim := filepath.Join(d, "u", "victim")
			if err := os.WriteFile(victim, nil, 0o666); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(victim); err != nil { // the kernel keeps its dentry
				t.Fatal(err)
			}
			stat := startProg(t, bin, "block", "stat", filepath.Join(d, "s", "absent"))
			unlink := startProg(t, bin, "block", "unlink", victim)
			stat.expect(t, "ready")
			unlink.expect(t, "ready")
			if err := g.Pause(); err != nil {
				t.Fatal(err)
			}
			paused := true
			defer func() {
				if paused {
					g.Resume()
				}
			}()
			stat.send(t, "go")
			unlink.send(t, "go")
			waitInFUSE(t, stat.pid())
			waitInFUSE(t, unlink.pid())
			// Waiting in FUSE is not enough for the unlink: the request
			// waited for may be a LOOKUP of the victim (revalidation),
			// which a kill ends before the REMOVE is sent. (The stat's
			// LOOKUP may still be queued in the kernel, over io_uring
			// behind the REMOVE: a kill ends it there too.)
			waitInFlight(t, mnt, "REMOVE")
			for _, c := range []*prog{stat, unlink} {
				if err := syscall.Kill(c.pid(), syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
			if !stat.exited(t, time.Minute) {
				t.Errorf("the stat's process did not die while the server was paused")
			}
			// The unlink's thread is still waiting for the server, and
			// the kernel has marked it dying.
			if pnd, err := pendingSignals(unlink.pid()); err != nil {
				t.Errorf("the unlink's process: %v", err)
			} else if pnd&(1<<(9-1)) == 0 {
				t.Errorf("the unlink's thread waits with SIGKILL not pending: SigPnd|ShdPnd=%#x", pnd)
			}
			if err := g.Resume(); err != nil {
				t.Fatal(err)
			}
			paused = false
			if !unlink.exited(t, 3*time.Minute) {
				t.Fatalf("the unlink's process did not die after the server resumed")
			}
			if _, err := os.Stat(victim); !os.IsNotExist(err) {
				t.Errorf("after the killed unlink: stat: %v, want it gone", err)
			}
			if _, err := os.ReadDir(d); err != nil {
				t.Errorf("the mount after the kills: %v", err)
			}
		})
	}
}

// ownGanesha starts a ganesha for the test alone (it pauses it) and
// returns it as a peer.
func ownGanesha(t *testing.T) (*testpeer.Ganesha, peer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := testpeer.StartGanesha(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Stop() })
	host, port := splitAddr(t, g.Addr)
	return g, peer{name: "ganesha", host: host, port: port, export: g.Export}
}

// buildC compiles testdata/NAME.c with cc into the test's temporary
// directory.
func buildC(t *testing.T, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	out, err := exec.Command("cc", "-Wall", "-O2", "-pthread", "-o", bin, filepath.Join("testdata", name+".c")).CombinedOutput()
	if err != nil {
		t.Fatalf("cc %s.c: %v\n%s", name, err, out)
	}
	return bin
}

// prog is a running test program with its standard input and output.
type prog struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	done  chan struct{}
	err   error // of Wait, once done is closed
}

// startProg starts bin with args; it is killed when the test ends.
func startProg(t *testing.T, bin string, args ...string) *prog {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	// A group of its own: the cleanup kills its children too, which
	// would keep its output open.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, out := startPiped(t, cmd)
	c := &prog{cmd: cmd, in: in, lines: make(chan string, 16), done: make(chan struct{})}
	var read sync.WaitGroup
	read.Add(1)
	go func() {
		defer read.Done()
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	go func() {
		read.Wait() // Wait closes the pipe: read it to the end first
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-c.done
		if stderr.Len() > 0 {
			t.Logf("%s %v: stderr:\n%s", bin, args, stderr.String())
		}
	})
	return c
}

func (c *prog) pid() int { return c.cmd.Process.Pid }

func (c *prog) send(t *testing.T, line string) {
	t.Helper()
	if _, err := fmt.Fprintln(c.in, line); err != nil {
		t.Fatalf("%s: %v", c.cmd.Path, err)
	}
}

// line returns the program's next line of output. Not a timing limit:
// a program silent for this long has hung.
func (c *prog) line(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			<-c.done
			t.Fatalf("%s %v: output ended: %v", c.cmd.Path, c.cmd.Args[1:], c.err)
		}
		return l
	case <-time.After(3 * time.Minute):
		t.Fatalf("%s %v: no output for 3 minutes", c.cmd.Path, c.cmd.Args[1:])
	}
	return ""
}

func (c *prog) expect(t *testing.T, want string) {
	t.Helper()
	if got := c.line(t); got != want {
		t.Fatalf("%s %v: got %q, want %q", c.cmd.Path, c.cmd.Args[1:], got, want)
	}
}

// wait waits for the program to exit 0.
func (c *prog) wait(t *testing.T) {
	t.Helper()
	if !c.exited(t, 3*time.Minute) {
		t.Fatalf("%s %v: still running after 3 minutes", c.cmd.Path, c.cmd.Args[1:])
	}
	if c.err != nil {
		t.Fatalf("%s %v: %v", c.cmd.Path, c.cmd.Args[1:], c.err)
	}
}

// exited reports whether the program exits within d.
func (c *prog) exited(t *testing.T, d time.Duration) bool {
	select {
	case <-c.done:
		return true
	case <-time.After(d):
		return false
	}
}

// callResult is a line "NAME ret=R errno=E [signals=N]" of the program.
type callResult struct {
	name    string
	ret     int
	errno   syscall.Errno
	signals int
}

var callLine = regexp.MustCompile(`^(\w+) ret=(-?\d+) errno=(\d+)(?: signals=(\d+))?$`)

func parseCall(t *testing.T, line string) callResult {
	t.Helper()
	m := callLine.FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("not a result line: %q", line)
	}
	r := callResult{name: m[1]}
	r.ret, _ = strconv.Atoi(m[2])
	e, _ := strconv.Atoi(m[3])
	r.errno = syscall.Errno(e)
	if m[4] != "" {
		r.signals, _ = strconv.Atoi(m[4])
	}
	return r
}

// waitInFUSE waits until process pid waits for a FUSE request
// (request_wait_answer in its kernel stack).
func waitInFUSE(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		stack, err := os.ReadFile(fmt.Sprintf("/proc/%d/stack", pid))
		if err != nil {
			t.Fatalf("process %d: %v", pid, err)
		}
		if strings.Contains(string(stack), "request_wait_answer") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d not waiting for a FUSE request after a minute; its stack:\n%s", pid, stack)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitInFlight waits until the mount on mnt has a COMPOUND of each
// of ops on its session's slots, as `rdmafs stats` lists them.
func waitInFlight(t *testing.T, mnt string, ops ...string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		out, code := runBin(t, time.Minute, "stats", mnt)
		missing := ""
		for _, op := range ops {
			if code != 0 || !regexp.MustCompile(`(?m)^  slot \d+ xid \S+ `+op+` for `).MatchString(out) {
				missing = op
				break
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s in flight after a minute; rdmafs stats (exit %d):\n%s", missing, code, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pendingSignals returns the SigPnd and ShdPnd masks of process pid
// (single-threaded: its thread's id is its pid), or-ed.
func pendingSignals(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	var mask uint64
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ":")
		if k == "SigPnd" || k == "ShdPnd" {
			x, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %w", l, err)
			}
			mask |= x
		}
	}
	return mask, nil
}
