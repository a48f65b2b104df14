package testpeer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// KnfsdOptions configures StartKnfsd.
type KnfsdOptions struct {
	// Append is extra guest kernel command line, e.g.
	// "kpeer.siw=mpa_crc_required=1" or "kpeer.debug=1"; see test/kpeer/guest/init.
	Append string
	// Env holds extra KPEER_* settings for run.sh ("KPEER_MEM=512",
	// "KPEER_SMP=2"); the ports and run directory are always chosen by
	// StartKnfsd.
	Env []string
	// KeepGrace leaves the NFSv4 grace period that starts with the server
	// running (kpeer.endgrace=0) instead of ending it at once: until it
	// ends (kpeer.grace, 10 s by default) non-reclaim OPENs and LOCKs get
	// NFS4ERR_GRACE.
	KeepGrace bool
}

// Knfsd is a Linux knfsd running in a kpeer qemu guest. It exports /export
// (ext4 on a 256 MiB RAM disk, mounted user_xattr, so that the export has
// user.* extended attributes; kpeer.exportfs=tmpfs in KnfsdOptions.Append
// gives the tmpfs of earlier versions, which has none) as the NFSv4
// pseudo-root (fsid=0), so the root filehandle is the export; connections
// from the host appear in the guest as 10.0.2.2.
type Knfsd struct {
	TCPAddr   string // NFS over TCP, "127.0.0.1:port"
	RDMAAddr  string // RPC-over-RDMA on soft-iWARP (siw), "127.0.0.1:port"
	ShellAddr string // guest control shell used by Exec, "127.0.0.1:port"
	// RunDir holds qemu.pid, serial.log (guest console) and run.log
	// (run.sh output). Empty for a server given by RDMAFS_KNFSD_TCP.
	RunDir string

	stopOnce sync.Once
	stopErr  error
}

// StartKnfsd boots a kpeer guest with free host ports and a private run
// directory and returns once the guest reports READY and its NFS port
// answers an RPC NULL call. The first start builds the guest (see
// test/kpeer/README.md), which downloads Debian packages. If
// RDMAFS_KNFSD_TCP is set, StartKnfsd returns that server instead.
func StartKnfsd(ctx context.Context, opts KnfsdOptions) (*Knfsd, error) {
	if tcp := os.Getenv("RDMAFS_KNFSD_TCP"); tcp != "" {
		return &Knfsd{
			TCPAddr:   tcp,
			RDMAAddr:  os.Getenv("RDMAFS_KNFSD_RDMA"),
			ShellAddr: os.Getenv("RDMAFS_KNFSD_SHELL"),
		}, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	script := filepath.Join(root, "test", "kpeer", "run.sh")
	if _, err := os.Stat(script); err != nil {
		return nil, fmt.Errorf("testpeer: knfsd: %w", err)
	}
	var lastErr error
	for attempt := 0; attempt < startAttempts; attempt++ {
		k, retry, err := startKnfsdOnce(ctx, script, opts)
		if err == nil {
			return k, nil
		}
		lastErr = err
		if !retry || ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

// startKnfsdOnce makes one attempt; retry reports a likely port collision.
func startKnfsdOnce(ctx context.Context, script string, opts KnfsdOptions) (k *Knfsd, retry bool, err error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, false, err
	}
	runDir, err := newRunDir("kpeer")
	if err != nil {
		return nil, false, err
	}
	k = &Knfsd{
		TCPAddr:   loopback(ports[0]),
		RDMAAddr:  loopback(ports[1]),
		ShellAddr: loopback(ports[2]),
		RunDir:    runDir,
	}
	// Until it is returned, the half-started server is stopped by StopAll
	// (e.g. on SIGINT during the boot).
	startingKnfsd.Store(k, struct{}{})
	defer startingKnfsd.Delete(k)
	runLog := filepath.Join(runDir, "run.log")
	logf, err := os.Create(runLog)
	if err != nil {
		os.RemoveAll(runDir)
		return nil, false, fmt.Errorf("testpeer: knfsd: %w", err)
	}
	defer logf.Close()

	cmd := exec.Command(script)
	cmd.Env = append(os.Environ(), opts.Env...)
	cmd.Env = append(cmd.Env,
		"KPEER_TCP_PORT="+strconv.Itoa(ports[0]),
		"KPEER_RDMA_PORT="+strconv.Itoa(ports[1]),
		"KPEER_SHELL_PORT="+strconv.Itoa(ports[2]),
		"KPEER_RUN_DIR="+runDir,
		"KPEER_WATCH_PID="+strconv.Itoa(os.Getpid()),
		"KPEER_APPEND="+appendOpts(opts),
	)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		os.RemoveAll(runDir)
		return nil, false, fmt.Errorf("testpeer: knfsd: start %s: %w", script, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	fail := func(err error) (*Knfsd, bool, error) {
		logs := tail(40, runLog, filepath.Join(runDir, "serial.log"))
		retry := strings.Contains(logs, "host forwarding") || strings.Contains(logs, "ports") && strings.Contains(logs, "busy")
		// The run dir is kept for inspection; a later test process removes it.
		_ = k.stop(false)
		return nil, retry, fmt.Errorf("testpeer: knfsd (logs kept in %s): %w\n%s", runDir, err, logs)
	}
	select {
	case err := <-done:
		if err != nil {
			return fail(fmt.Errorf("run.sh: %w", err))
		}
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		return fail(fmt.Errorf("waiting for READY after %v: %w", time.Since(start).Round(time.Millisecond), ctx.Err()))
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := NullCall(pctx, k.TCPAddr); err != nil {
		return fail(fmt.Errorf("guest READY but NFS/TCP does not answer: %w", err))
	}
	return k, false, nil
}

func appendOpts(opts KnfsdOptions) string {
	if opts.KeepGrace {
		return strings.TrimSpace(opts.Append + " kpeer.endgrace=0")
	}
	return opts.Append
}

// Restart restarts knfsd in the guest as a server reboot looks to its
// clients, without rebooting the guest (test/kpeer/guest/init,
// kpeer-restart-nfsd): every nfsd thread stops, so the server forgets all
// clients, sessions, opens, locks and delegations and drops its
// connections; it comes back with a new boot time (old client IDs are
// NFS4ERR_STALE_CLIENTID, sessions NFS4ERR_BADSESSION) and a new write
// verifier, in a grace period (kpeer.grace seconds) in which the clients
// it recorded may reclaim their state (RFC 8881 s8.4.2). The export keeps
// its files. Restart returns once NFS over TCP answers again.
func (k *Knfsd) Restart(ctx context.Context) error {
	return k.restart(ctx, "kpeer-restart-nfsd")
}

// RestartEndGrace restarts knfsd like Restart and ends the new grace
// period at once: reclaims are refused with NFS4ERR_NO_GRACE, and other
// clients may take conflicting locks.
func (k *Knfsd) RestartEndGrace(ctx context.Context) error {
	return k.restart(ctx, "kpeer-restart-nfsd endgrace")
}

func (k *Knfsd) restart(ctx context.Context, cmd string) error {
	out, err := k.Exec(ctx, cmd)
	if err != nil {
		return fmt.Errorf("testpeer: knfsd restart: %w", err)
	}
	if !strings.Contains(out, "restarted:") {
		return fmt.Errorf("testpeer: knfsd restart: unexpected output %q", out)
	}
	if err := NullCall(ctx, k.TCPAddr); err != nil {
		return fmt.Errorf("testpeer: knfsd restart: NFS/TCP does not answer: %w", err)
	}
	return nil
}

// startingKnfsd holds the *Knfsd being started (see StopAll).
var startingKnfsd sync.Map

// qemuPID returns the PID recorded in the run directory, 0 if none.
func (k *Knfsd) qemuPID() int { return readPID(filepath.Join(k.RunDir, "qemu.pid")) }

// Alive reports whether the guest's qemu is still running. A server
// given by RDMAFS_KNFSD_TCP is taken to be.
func (k *Knfsd) Alive() bool {
	if k.RunDir == "" {
		return true
	}
	pid := k.qemuPID()
	return pid != 0 && processAlive(pid) && cmdlineContains(pid, "qemu-system")
}

// Stop kills the guest's qemu (by the PID run.sh recorded, after checking
// it is a qemu) and removes the run directory unless RDMAFS_TESTPEER_KEEP=1.
// Stop is idempotent; it does nothing for a server from RDMAFS_KNFSD_TCP.
func (k *Knfsd) Stop() error {
	k.stopOnce.Do(func() { k.stopErr = k.stop(!keepRunDirs()) })
	return k.stopErr
}

func (k *Knfsd) stop(removeRunDir bool) error {
	if k.RunDir == "" {
		return nil
	}
	var err error
	if pid := k.qemuPID(); pid != 0 && processAlive(pid) && cmdlineContains(pid, "qemu-system") {
		if kerr := killAndWait(pid, 5*time.Second, nil); kerr != nil {
			err = fmt.Errorf("testpeer: knfsd stop: %w", kerr)
		}
	}
	if err == nil && removeRunDir {
		_ = os.RemoveAll(k.RunDir)
	}
	return err
}

// LogTail returns the last lines of run.sh's output and the guest console.
func (k *Knfsd) LogTail() string {
	if k.RunDir == "" {
		return ""
	}
	return tail(40, filepath.Join(k.RunDir, "run.log"), filepath.Join(k.RunDir, "serial.log"))
}

// ExitError is returned by Exec when the guest command exits non-zero.
type ExitError struct {
	Cmd    string
	Status int
	Output string
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("testpeer: guest command %q: exit status %d: %s", e.Cmd, e.Status, strings.TrimSpace(e.Output))
}

const exitMarker = "\n__RDMAFS_TESTPEER_EXIT="

// Exec runs cmd with /bin/sh (busybox) in the guest's control shell and
// returns its combined stdout and stderr. A non-zero exit status is
// reported as an *ExitError (the output is returned as well). Calls may run
// concurrently. Example: k.Exec(ctx, "ls /proc/fs/nfsd/clients").
func (k *Knfsd) Exec(ctx context.Context, cmd string) (string, error) {
	if k.ShellAddr == "" {
		return "", errors.New("testpeer: knfsd has no control shell address (set RDMAFS_KNFSD_SHELL)")
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		out, got, err := k.execOnce(ctx, cmd)
		if err == nil || got || ctx.Err() != nil {
			return out, err
		}
		// Nothing came back: the guest's listener was (re)starting; retry.
		lastErr = err
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("testpeer: guest exec %q: %w", cmd, ctx.Err())
		case <-time.After(time.Duration(attempt+1) * 100 * time.Millisecond):
		}
	}
	return "", lastErr
}

// execOnce runs cmd over one connection; got reports whether any bytes came
// back (then the command ran and must not be retried).
func (k *Knfsd) execOnce(ctx context.Context, cmd string) (out string, got bool, err error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", k.ShellAddr)
	if err != nil {
		return "", false, fmt.Errorf("testpeer: guest exec %q: %w", cmd, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	script := fmt.Sprintf("( %s\n) </dev/null 2>&1; printf '%s%%d\\n' $?\nexit\n",
		cmd, strings.ReplaceAll(exitMarker, "\n", `\n`))
	if _, err := io.WriteString(conn, script); err != nil {
		return "", false, fmt.Errorf("testpeer: guest exec %q: write: %w", cmd, err)
	}
	data, rerr := io.ReadAll(conn)
	got = len(data) > 0
	i := bytes.LastIndex(data, []byte(exitMarker))
	if i < 0 {
		if rerr == nil {
			rerr = io.ErrUnexpectedEOF
		}
		if ctx.Err() != nil {
			rerr = ctx.Err()
		}
		return string(data), got, fmt.Errorf("testpeer: guest exec %q: no exit status: %w (output %q)", cmd, rerr, data)
	}
	out = string(data[:i])
	status, err := strconv.Atoi(strings.TrimSpace(string(data[i+len(exitMarker):])))
	if err != nil {
		return out, got, fmt.Errorf("testpeer: guest exec %q: bad exit status: %w", cmd, err)
	}
	if status != 0 {
		return out, got, &ExitError{Cmd: cmd, Status: status, Output: out}
	}
	return out, got, nil
}
