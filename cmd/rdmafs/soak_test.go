package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/test/soak"
)

// soakSettings are TestSoak's knobs, from the environment (make soak,
// scripts/soak.sh, sets them):
//
//	RDMAFS_SOAK_DURATION=30m   how long each peer runs (default 20s)
//	RDMAFS_SOAK_SEED=N         the workload's seed (default: from the clock)
//	RDMAFS_SOAK_CUT=60s        cut the mounts' transport connections this often
//	RDMAFS_SOAK_RESTART_CMD=.. a command that restarts the server, run once at
//	                           RDMAFS_SOAK_RESTART_AT (default half way); see
//	                           restartServer
//	RDMAFS_SOAK_PARALLEL=1     run the peers at the same time
//	RDMAFS_SOAK_OPLOG=/dir     write every operation to /dir/PEER.wN
type soakSettings struct {
	duration   time.Duration
	seed       uint64
	cut        time.Duration
	restartCmd string
	restartAt  time.Duration
	parallel   bool
	oplog      string
}

func soakSettingsFromEnv(t *testing.T) soakSettings {
	s := soakSettings{duration: 20 * time.Second}
	dur := func(name string, d *time.Duration) {
		if v := os.Getenv(name); v != "" {
			var err error
			if *d, err = time.ParseDuration(v); err != nil {
				t.Fatalf("%s=%q: %v", name, v, err)
			}
		}
	}
	dur("RDMAFS_SOAK_DURATION", &s.duration)
	dur("RDMAFS_SOAK_CUT", &s.cut)
	s.restartAt = s.duration / 2
	dur("RDMAFS_SOAK_RESTART_AT", &s.restartAt)
	if v := os.Getenv("RDMAFS_SOAK_SEED"); v != "" {
		var err error
		if s.seed, err = strconv.ParseUint(v, 0, 64); err != nil {
			t.Fatalf("RDMAFS_SOAK_SEED=%q: %v", v, err)
		}
	}
	s.restartCmd = os.Getenv("RDMAFS_SOAK_RESTART_CMD")
	s.parallel = os.Getenv("RDMAFS_SOAK_PARALLEL") == "1"
	s.oplog = os.Getenv("RDMAFS_SOAK_OPLOG")
	return s
}

// restartServer restarts p's server once during a soak, as
// RDMAFS_SOAK_RESTART_CMD says: "server" uses the test peer's own restart
// (knfsd: kpeer-restart-nfsd; ganesha: a ganesha of the soak's own that
// keeps a grace period), after which the clients must reclaim their state
// without an error; "guest:CMD" runs CMD in the knfsd guest's control
// shell (knfsd peers only), for example
//
//	guest:echo 0 >/proc/fs/nfsd/threads; echo 4 >/proc/fs/nfsd/threads
//
// and anything else runs on this machine with sh -c, told which server
// through the environment: RDMAFS_SOAK_PEER (knfsd, knfsd-rdma, ganesha,
// ganesha-rdma-v2), RDMAFS_SOAK_SERVER (the address the mounts use) and,
// for knfsd, RDMAFS_KNFSD_SHELL (the guest's control shell, host:port).
func restartServer(ctx context.Context, p peer, cmdline string) (string, error) {
	if cmdline == "server" {
		if p.restart == nil {
			return "", fmt.Errorf("%s: this server has no restart knob", p.name)
		}
		return "", p.restart(ctx)
	}
	if guestCmd, ok := strings.CutPrefix(cmdline, "guest:"); ok {
		if p.knfsd == nil {
			return "", fmt.Errorf("%s: a guest: restart command needs knfsd", p.name)
		}
		return p.knfsd.Exec(ctx, guestCmd)
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", cmdline)
	cmd.Env = append(os.Environ(), "RDMAFS_SOAK_PEER="+p.name, "RDMAFS_SOAK_SERVER="+p.host+":"+p.port)
	if p.knfsd != nil {
		cmd.Env = append(cmd.Env, "RDMAFS_KNFSD_SHELL="+p.knfsd.ShellAddr)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestSoak runs the data-verification workload (test/soak: random
// writes, reads, truncates, extends, mmap reads and writes, by two
// processes over four files each, every read checked against a model)
// against each server and transport, through two mounts of the export:
// each process works in its own mount, and files handed from one process
// to the other (close, then open: close-to-open) cross clients. It asserts
// that operations were done, none failed and no byte read differed from
// the model. `make soak` runs it for longer, optionally cutting the
// connections and restarting the server (see soakSettings).
func TestSoak(t *testing.T) {
	s := soakSettingsFromEnv(t)
	forEachTransport(t, func(t *testing.T, p peer) {
		if s.parallel {
			t.Parallel()
		}
		restartCmd := s.restartCmd
		if restartCmd == "server" {
			switch {
			case p.name == "ganesha":
				p = graceGanesha(t)
			case p.restart == nil:
				t.Logf("%s: no server restart: the v2 relay's ganesha is shared and graceless", p.name)
				restartCmd = ""
			}
		}
		mntA, mntB := mount(t, p), mount(t, p)
		dirA := testDir(t, mntA)
		dirB := mntB + strings.TrimPrefix(dirA, mntA)
		pids := []int{servingPIDOf(t, mntA), servingPIDOf(t, mntB)}
		port, err := strconv.Atoi(p.port)
		if err != nil {
			t.Fatal(err)
		}
		cfg := soak.Config{
			Dirs:     []string{dirA, dirB},
			Seed:     s.seed,
			Duration: s.duration,
			Out:      testWriter{t, p.name},
		}
		if s.duration >= 5*time.Minute {
			cfg.Progress = time.Minute
		}
		if s.oplog != "" {
			cfg.OpLog = fmt.Sprintf("%s/%s", s.oplog, p.name)
		}

		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var cuts, cutConns int
		if s.cut > 0 {
			wg.Go(func() {
				tick := time.NewTicker(s.cut)
				defer tick.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
					}
					cuts++
					for _, pid := range pids {
						n, err := soak.CutConnections(pid, port)
						if err != nil {
							t.Errorf("%s: cutting the connections of rdmafs %d: %v", p.name, pid, err)
						}
						cutConns += n
					}
				}
			})
		}
		restarted := false
		if restartCmd != "" {
			wg.Go(func() {
				select {
				case <-ctx.Done():
					return
				case <-time.After(s.restartAt):
				}
				start := time.Now()
				out, err := restartServer(ctx, p, restartCmd)
				if err != nil {
					t.Errorf("%s: restart command %q: %v\n%s", p.name, restartCmd, err, out)
					return
				}
				restarted = true
				t.Logf("%s: server restarted at %v (command took %v): %s", p.name, s.restartAt, time.Since(start).Round(time.Millisecond), strings.TrimSpace(out))
			})
		}
		// A hung operation (the workers report each one after 30 s) ends
		// the run this long after its end, instead of the test binary's
		// timeout ending every test.
		const hangAfter = 5 * time.Minute
		runCtx, cancelRun := context.WithTimeout(ctx, s.duration+hangAfter)
		start := time.Now()
		ranOut := make(chan struct{})
		wg.Go(func() {
			// A worker blocked in a FUSE request cannot be killed: the
			// kernel waits for rdmafs's answer. Show what the mounts wait
			// for, then end them, so that the workers' requests fail.
			select {
			case <-ranOut:
				return
			case <-runCtx.Done():
			}
			select {
			case <-ranOut:
				return
			case <-time.After(10 * time.Second):
			}
			for _, m := range []string{mntA, mntB} {
				dumpHungMount(t, m)
			}
			if p.knfsd != nil {
				// A hard mount waits for ever for a server that died:
				// is the guest alive, and what did its kernel say?
				gctx, gcancel := context.WithTimeout(context.Background(), time.Minute)
				out, err := p.knfsd.Exec(gctx, "cat /proc/loadavg; cat /proc/fs/nfsd/threads; free; dmesg | tail -60")
				gcancel()
				t.Logf("%s: the guest: %v\n%s\nconsole:\n%s", p.name, err, out, p.knfsd.LogTail())
			}
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		})
		res, err := soak.Run(runCtx, cfg)
		close(ranOut)
		if runCtx.Err() != nil {
			err = fmt.Errorf("workers still running %v after the end of the run, killed (hung operations are reported above as stalls): %w", hangAfter, err)
		}
		cancelRun()
		cancel()
		wg.Wait()
		el := time.Since(start)
		t.Logf("%s: %v in %v; cuts=%d (%d connections)", p.name, res, el.Round(time.Second), cuts, cutConns)
		t.Logf("%s: operations by kind: %v", p.name, res.Kinds)
		for _, m := range []string{mntA, mntB} {
			if st, code := runBin(t, time.Minute, "stats", m); code == 0 {
				for _, line := range strings.Split(st, "\n") {
					if strings.HasPrefix(line, "rpc:") || strings.HasPrefix(line, "eio:") || strings.Contains(line, "connects:") {
						t.Logf("%s: %s: %s", p.name, m, strings.TrimSpace(line))
					}
				}
			}
		}
		if err != nil {
			t.Fatalf("%s: soak: %v", p.name, err)
		}
		if cuts > 0 && cutConns == 0 {
			t.Errorf("%s: %d cuts found no connection of rdmafs (pids %v) to port %d", p.name, cuts, pids, port)
		}
		if res.Ops == 0 || res.Handoffs == 0 {
			t.Errorf("%s: %d operations, %d handoffs: the workload did not run", p.name, res.Ops, res.Handoffs)
		}
		if res.Mismatches != 0 {
			t.Errorf("%s: %d reads differed from the model (seed %d; details above)", p.name, res.Mismatches, res.Seed)
		}
		if res.Errors != 0 {
			// After a restart by a command of the user's, which may not
			// leave a grace period, the files open at the restart may
			// fail: that is reported, not asserted. The peers' own
			// restart keeps a grace period, so every open is reclaimed.
			if restarted && restartCmd != "server" {
				t.Logf("%s: %d operations failed after the server restart (see above)", p.name, res.Errors)
			} else {
				t.Errorf("%s: %d operations failed (seed %d; details above)", p.name, res.Errors, res.Seed)
			}
		}
		if res.Mismatches == 0 && res.Errors == 0 {
			os.RemoveAll(dirA)
		}
	})
}

// testWriter writes the workers' lines to the test log.
type testWriter struct {
	t    *testing.T
	name string
}

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Logf("%s: %s", w.name, strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
