package testpeer

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Ganesha is an NFS-Ganesha server (NFSv4.1 and 4.2 over TCP, AUTH_SYS,
// VFS FSAL, no root squash) run on the host.
type Ganesha struct {
	Addr   string // NFS over TCP, "127.0.0.1:port"
	Export string // pseudo path of the export, "/export"
	Dir    string // host directory backing the export
	// RunDir holds ganesha.conf, ganesha.log and the export directory
	// (unless GaneshaOptions.ExportDir put it elsewhere).
	// Empty for a server given by RDMAFS_GANESHA.
	RunDir string

	bin, conf, logFile, outFile string
	env                         []string // added to ganesha.nfsd's environment

	mu sync.Mutex // guards cmd, exited and ready, replaced by Restart
	// ready is when the running process first answered: its epoch (its
	// start second, taken during its start-up) is at or before it.
	ready    time.Time
	cmd      *exec.Cmd
	exited   chan struct{}
	stopOnce sync.Once
	stopErr  error
}

// ganeshaBinary finds ganesha.nfsd in PATH or the Debian locations.
func ganeshaBinary() (string, error) {
	if p, err := exec.LookPath("ganesha.nfsd"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/bin/ganesha.nfsd", "/usr/sbin/ganesha.nfsd"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("ganesha.nfsd not found (install nfs-ganesha nfs-ganesha-vfs: scripts/deps.sh)")
}

const ganeshaConf = `NFS_CORE_PARAM {
	Bind_addr = 127.0.0.1;
	NFS_Port = %d;
	NFS_Protocols = 4;
	Enable_NLM = false;
	Enable_RQUOTA = false;
	Enable_UDP = false;
}
NFS_KRB5 {
%s}
NFSV4 {
	Minor_Versions = %s;
	Graceless = %v;
	Lease_Lifetime = %d;
	Grace_Period = %d;
	RecoveryBackend = fs;
	RecoveryRoot = %q;
}
EXPORT {
	Export_Id = 1;
	Path = %q;
	Pseudo = /export;
	Protocols = 4;
	Transports = TCP;
	Access_Type = RW;
	Squash = No_Root_Squash;
	SecType = %s;
	FSAL {
		Name = VFS;
	}
}
`

// GaneshaOptions configures StartGaneshaWith.
type GaneshaOptions struct {
	// Grace makes the server keep a grace period at start (Graceless =
	// false): after a Restart, clients recorded by the fs recovery
	// backend reclaim their state (RFC 8881 s8.4.2), and other OPENs and
	// LOCKs get NFS4ERR_GRACE until they are done or GracePeriod ends.
	Grace bool
	// Lease and GracePeriod are Lease_Lifetime and Grace_Period in
	// seconds; zero means 60 and 90 (Graceless) or 15 and 20 (Grace).
	Lease, GracePeriod int
	// ExportDir, if set, is the directory to export (created if missing;
	// the caller removes it) instead of a fresh one in the run directory:
	// a tmpfs keeps a benchmark's disk out of its figures.
	ExportDir string
	// MinorVersions is Minor_Versions, the NFSv4 minor versions served;
	// empty means "1, 2". "1" makes a server that refuses NFSv4.2.
	MinorVersions string
	// Krb5, if set, serves RPCSEC_GSS with Kerberos V5.
	Krb5 *GaneshaKrb5
}

// GaneshaKrb5 is how a ganesha serves Kerberos (NFS_KRB5, SecType).
type GaneshaKrb5 struct {
	// Keytab holds the keys of nfs/localhost (KDC.AddService).
	Keytab string
	// Env is the realm's environment (KDC.Env).
	Env []string
	// SecType is the export's flavors, "krb5, krb5i, krb5p"; empty
	// means those three.
	SecType string
}

// confKrb5 returns the NFS_KRB5 block's body and the export's SecType.
func (o GaneshaOptions) confKrb5() (block, secType string) {
	if o.Krb5 == nil {
		return "\tActive_krb5 = false;\n", "sys"
	}
	return fmt.Sprintf("\tActive_krb5 = true;\n\tPrincipalName = nfs;\n\tKeytabPath = %q;\n", o.Krb5.Keytab),
		cmp.Or(o.Krb5.SecType, "krb5, krb5i, krb5p")
}

// StartGanesha runs ganesha.nfsd in the foreground on a free loopback port,
// exporting a fresh temporary directory (Dir) as /export, and returns once
// the port answers an RPC NULL call. It needs root. If RDMAFS_GANESHA is set,
// StartGanesha returns that server instead.
func StartGanesha(ctx context.Context) (*Ganesha, error) {
	return StartGaneshaWith(ctx, GaneshaOptions{})
}

// StartGaneshaWith is StartGanesha with options; RDMAFS_GANESHA is not
// consulted (the options could not be honoured).
func StartGaneshaWith(ctx context.Context, opts GaneshaOptions) (*Ganesha, error) {
	if opts.Lease == 0 {
		opts.Lease = map[bool]int{false: 60, true: 15}[opts.Grace]
	}
	if opts.GracePeriod == 0 {
		opts.GracePeriod = map[bool]int{false: 90, true: 20}[opts.Grace]
	}
	return startGanesha(ctx, opts)
}

func startGanesha(ctx context.Context, opts GaneshaOptions) (*Ganesha, error) {
	if addr := os.Getenv("RDMAFS_GANESHA"); addr != "" && !opts.Grace && opts.MinorVersions == "" {
		export := os.Getenv("RDMAFS_GANESHA_EXPORT")
		if export == "" {
			export = "/export"
		}
		return &Ganesha{Addr: addr, Export: export, Dir: os.Getenv("RDMAFS_GANESHA_DIR")}, nil
	}
	bin, err := ganeshaBinary()
	if err != nil {
		return nil, fmt.Errorf("testpeer: ganesha: %w", err)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("testpeer: ganesha: ganesha.nfsd must run as root")
	}
	var lastErr error
	for attempt := 0; attempt < startAttempts; attempt++ {
		g, retry, err := startGaneshaOnce(ctx, bin, opts)
		if err == nil {
			return g, nil
		}
		lastErr = err
		if !retry || ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

func startGaneshaOnce(ctx context.Context, bin string, opts GaneshaOptions) (g *Ganesha, retry bool, err error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, false, err
	}
	runDir, err := newRunDir("ganesha")
	if err != nil {
		return nil, false, err
	}
	g = &Ganesha{
		Addr:    loopback(ports[0]),
		Export:  "/export",
		Dir:     cmp.Or(opts.ExportDir, filepath.Join(runDir, "export")),
		RunDir:  runDir,
		bin:     bin,
		conf:    filepath.Join(runDir, "ganesha.conf"),
		logFile: filepath.Join(runDir, "ganesha.log"),
		outFile: filepath.Join(runDir, "stdout.log"),
	}
	if opts.Krb5 != nil {
		g.env = opts.Krb5.Env
	}
	recovery := filepath.Join(runDir, "recovery")
	conf, logFile, outFile := g.conf, g.logFile, g.outFile
	setup := func() error {
		for _, d := range []string{g.Dir, recovery} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		krb5Block, secType := opts.confKrb5()
		return os.WriteFile(conf, fmt.Appendf(nil, ganeshaConf, ports[0], krb5Block, cmp.Or(opts.MinorVersions, "1, 2"), !opts.Grace, opts.Lease, opts.GracePeriod, recovery, g.Dir, secType), 0o644)
	}
	if err := setup(); err != nil {
		os.RemoveAll(runDir)
		return nil, false, fmt.Errorf("testpeer: ganesha setup: %w", err)
	}
	if err := g.launch(); err != nil {
		os.RemoveAll(runDir)
		return nil, false, err
	}

	fail := func(err error) (*Ganesha, bool, error) {
		logs := tail(30, logFile, outFile)
		retry := strings.Contains(logs, "Address already in use")
		// The run dir is kept for inspection; a later test process removes it.
		_ = g.stop(false)
		return nil, retry, fmt.Errorf("testpeer: ganesha (logs kept in %s): %w\n%s", runDir, err, logs)
	}
	deadline := time.Now().Add(30 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := g.waitReady(ctx, deadline); err != nil {
		return fail(err)
	}
	return g, false, nil
}

// launch starts ganesha.nfsd in the foreground with the run directory's
// configuration; its output is appended to stdout.log.
func (g *Ganesha) launch() error {
	out, err := os.OpenFile(g.outFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("testpeer: ganesha: %w", err)
	}
	defer out.Close()
	cmd := exec.Command(g.bin, "-F", "-f", g.conf, "-L", g.logFile, "-p", filepath.Join(g.RunDir, "ganesha.pid"))
	cmd.Dir = g.RunDir
	if g.env != nil {
		cmd.Env = append(os.Environ(), g.env...)
	}
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testpeer: ganesha: start %s: %w", g.bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	g.mu.Lock()
	g.cmd, g.exited, g.ready = cmd, exited, time.Time{}
	g.mu.Unlock()
	return nil
}

// waitReady waits until the server answers an RPC NULL call.
func (g *Ganesha) waitReady(ctx context.Context, deadline time.Time) error {
	g.mu.Lock()
	exited := g.exited
	g.mu.Unlock()
	if err := waitTCP(g.Addr, deadline, exited); err != nil {
		return err
	}
	pctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := NullCall(pctx, g.Addr); err != nil {
		return fmt.Errorf("NFS NULL call: %w", err)
	}
	g.mu.Lock()
	g.ready = time.Now()
	g.mu.Unlock()
	return nil
}

// Restart stops ganesha.nfsd (SIGTERM, as an administrator restarting
// the service would) and starts it again on the same port, export and
// recovery directory, and returns once it answers. The export's files
// survive. Started with GaneshaOptions.Grace, the new server is in its
// grace period: the clients its fs recovery backend recorded reclaim
// their opens and locks (RFC 8881 s8.4.2); new client IDs, session IDs,
// stateids and write verifiers all change (the new process starts in a
// later second than the last: ganesha's epoch is its start second).
func (g *Ganesha) Restart(ctx context.Context) error {
	if g.RunDir == "" {
		return errors.New("testpeer: ganesha restart: server not started by testpeer")
	}
	if err := g.kill(); err != nil {
		return fmt.Errorf("testpeer: ganesha restart: %w", err)
	}
	// Ganesha's epoch, part of its client IDs and stateids and its write
	// verifier, is its start time in seconds: a process started in the
	// same second as the last one would look like the same instance. The
	// last one took its epoch during its start-up, which on a loaded
	// machine can end in the second after the one it was launched in:
	// wait for the second after it first answered.
	g.mu.Lock()
	next := g.ready.Truncate(time.Second).Add(time.Second)
	g.mu.Unlock()
	select {
	case <-time.After(time.Until(next)):
	case <-ctx.Done():
		return fmt.Errorf("testpeer: ganesha restart: %w", ctx.Err())
	}
	if err := g.launch(); err != nil {
		return fmt.Errorf("testpeer: ganesha restart: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := g.waitReady(ctx, deadline); err != nil {
		return fmt.Errorf("testpeer: ganesha restart: %w\n%s", err, g.LogTail())
	}
	return nil
}

// Stop kills ganesha.nfsd, waits for it to exit and
// removes the run directory (and so Dir) unless RDMAFS_TESTPEER_KEEP=1.
// Stop is idempotent; it does nothing for a server from RDMAFS_GANESHA.
func (g *Ganesha) Stop() error {
	g.stopOnce.Do(func() { g.stopErr = g.stop(!keepRunDirs()) })
	return g.stopErr
}

func (g *Ganesha) stop(removeRunDir bool) error {
	err := g.kill()
	if err == nil && removeRunDir {
		_ = os.RemoveAll(g.RunDir)
	}
	return err
}

// Pause stops ganesha.nfsd (SIGSTOP) without closing its connections:
// to its clients the server has gone silent, as a hung or partitioned
// server does. Resume undoes it.
// It returns once every thread has stopped: SIGSTOP is delivered
// asynchronously, and a thread busy with a call could still answer it.
func (g *Ganesha) Pause() error {
	if err := g.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	g.mu.Lock()
	pid := g.cmd.Process.Pid
	g.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		running, err := runningThreads(pid)
		if err != nil {
			return fmt.Errorf("ganesha: pause: %w", err)
		}
		if running == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ganesha: pause: %d threads still running after 10s", running)
		}
		time.Sleep(time.Millisecond)
	}
}

// runningThreads counts the threads of process pid not stopped (state T
// in /proc/PID/task/TID/stat, proc(5)).
func runningThreads(pid int) (int, error) {
	tids, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	running := 0
	for _, tid := range tids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, tid.Name()))
		if err != nil {
			continue // the thread exited
		}
		// The state follows the command name, which is in parentheses
		// and may hold any byte.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return 0, fmt.Errorf("thread %s: malformed stat %q", tid.Name(), b)
		}
		if st := b[i+2]; st != 'T' && st != 't' && st != 'Z' && st != 'X' {
			running++
		}
	}
	return running, nil
}

// Resume continues a paused ganesha.nfsd (SIGCONT).
func (g *Ganesha) Resume() error { return g.signal(syscall.SIGCONT) }

func (g *Ganesha) signal(sig syscall.Signal) error {
	g.mu.Lock()
	cmd := g.cmd
	g.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return errors.New("ganesha: no process of ours to signal")
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("ganesha: %v: %w", sig, err)
	}
	return nil
}

// kill stops the running ganesha.nfsd and waits for it to exit.
func (g *Ganesha) kill() error {
	g.mu.Lock()
	cmd, exited := g.cmd, g.exited
	g.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return nil
	}
	// ganesha.nfsd is a single (multi-threaded) process; signal it through
	// os.Process, which never signals a PID after it was reaped.
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Process.Signal(syscall.SIGCONT) // if paused
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			return fmt.Errorf("ganesha: pid %d did not exit after SIGKILL", cmd.Process.Pid)
		}
	}
	return nil
}

// LogTail returns the last lines of ganesha's log.
func (g *Ganesha) LogTail() string {
	if g.RunDir == "" {
		return ""
	}
	return tail(40, filepath.Join(g.RunDir, "ganesha.log"), filepath.Join(g.RunDir, "stdout.log"))
}
