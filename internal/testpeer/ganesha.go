package testpeer

import (
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
	// RunDir holds ganesha.conf, ganesha.log and the export directory.
	// Empty for a server given by RDMAFS_GANESHA.
	RunDir string

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
	Active_krb5 = false;
}
NFSV4 {
	Minor_Versions = 1, 2;
	Graceless = true;
	Lease_Lifetime = 60;
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
	SecType = sys;
	FSAL {
		Name = VFS;
	}
}
`

// StartGanesha runs ganesha.nfsd in the foreground on a free loopback port,
// exporting a fresh temporary directory (Dir) as /export, and returns once
// the port answers an RPC NULL call. It needs root. If RDMAFS_GANESHA is set,
// StartGanesha returns that server instead.
func StartGanesha(ctx context.Context) (*Ganesha, error) {
	if addr := os.Getenv("RDMAFS_GANESHA"); addr != "" {
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
		g, retry, err := startGaneshaOnce(ctx, bin)
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

func startGaneshaOnce(ctx context.Context, bin string) (g *Ganesha, retry bool, err error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, false, err
	}
	runDir, err := newRunDir("ganesha")
	if err != nil {
		return nil, false, err
	}
	g = &Ganesha{
		Addr:   loopback(ports[0]),
		Export: "/export",
		Dir:    filepath.Join(runDir, "export"),
		RunDir: runDir,
		exited: make(chan struct{}),
	}
	recovery := filepath.Join(runDir, "recovery")
	conf := filepath.Join(runDir, "ganesha.conf")
	logFile := filepath.Join(runDir, "ganesha.log")
	outFile := filepath.Join(runDir, "stdout.log")
	setup := func() error {
		for _, d := range []string{g.Dir, recovery} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		return os.WriteFile(conf, fmt.Appendf(nil, ganeshaConf, ports[0], recovery, g.Dir), 0o644)
	}
	if err := setup(); err != nil {
		os.RemoveAll(runDir)
		return nil, false, fmt.Errorf("testpeer: ganesha setup: %w", err)
	}
	out, err := os.Create(outFile)
	if err != nil {
		os.RemoveAll(runDir)
		return nil, false, fmt.Errorf("testpeer: ganesha: %w", err)
	}
	defer out.Close()
	g.cmd = exec.Command(bin, "-F", "-f", conf, "-L", logFile, "-p", filepath.Join(runDir, "ganesha.pid"))
	g.cmd.Dir = runDir
	g.cmd.Stdout = out
	g.cmd.Stderr = out
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := g.cmd.Start(); err != nil {
		os.RemoveAll(runDir)
		return nil, false, fmt.Errorf("testpeer: ganesha: start %s: %w", bin, err)
	}
	go func() {
		_ = g.cmd.Wait()
		close(g.exited)
	}()

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
	if err := waitTCP(g.Addr, deadline, g.exited); err != nil {
		return fail(err)
	}
	pctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := NullCall(pctx, g.Addr); err != nil {
		return fail(fmt.Errorf("NFS NULL call: %w", err))
	}
	return g, false, nil
}

// Stop kills ganesha.nfsd, waits for it to exit and
// removes the run directory (and so Dir) unless RDMAFS_TESTPEER_KEEP=1.
// Stop is idempotent; it does nothing for a server from RDMAFS_GANESHA.
func (g *Ganesha) Stop() error {
	g.stopOnce.Do(func() { g.stopErr = g.stop(!keepRunDirs()) })
	return g.stopErr
}

func (g *Ganesha) stop(removeRunDir bool) error {
	if g.cmd == nil || g.cmd.Process == nil {
		return nil
	}
	var err error
	// ganesha.nfsd is a single (multi-threaded) process; signal it through
	// os.Process, which never signals a PID after it was reaped.
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.exited:
	case <-time.After(10 * time.Second):
		_ = g.cmd.Process.Kill()
		select {
		case <-g.exited:
		case <-time.After(5 * time.Second):
			err = fmt.Errorf("testpeer: ganesha stop: pid %d did not exit after SIGKILL", g.cmd.Process.Pid)
		}
	}
	if err == nil && removeRunDir {
		_ = os.RemoveAll(g.RunDir)
	}
	return err
}

// LogTail returns the last lines of ganesha's log.
func (g *Ganesha) LogTail() string {
	if g.RunDir == "" {
		return ""
	}
	return tail(40, filepath.Join(g.RunDir, "ganesha.log"), filepath.Join(g.RunDir, "stdout.log"))
}
