// Package soak is rdmafs's data-verification workload, in the spirit of
// fsx: random writes, reads, truncates, extends, and mmap reads and writes
// over several files, by several processes, every read checked against an
// in-memory model of the file.
//
// Each worker process owns a set of files and is the only one touching
// them, so its model is exact. Ownership moves between processes: a worker
// closes a file (close-to-open: the data must then be visible to any
// opener) and passes its model down a pipe to the next worker, which opens
// the file, checks all of it, and carries on with it. With several
// directories (two mounts of the same export) the handoff crosses clients.
//
// The decisions and data come from a seeded generator; with one worker a
// run is reproducible from its seed. Every mismatch is reported with the
// seed, worker, operation index, file, offset, the expected and the read
// bytes, and the last operations on that file.
//
//	func main() {
//		soak.MaybeWorker() // a worker process runs here and exits
//		res, err := soak.Run(ctx, soak.Config{Dirs: []string{"/mnt/nfs/soak"}, Duration: time.Minute})
//		...
//	}
//
// Run starts the workers by executing the calling program again (see
// [MaybeWorker]); a test binary calls MaybeWorker from TestMain.
package soak

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Config describes one run.
type Config struct {
	// Dirs are existing directories; worker i works in Dirs[i%len(Dirs)].
	// Two directories that are the same directory seen through two
	// mounts make the handoffs cross clients.
	Dirs []string
	// Procs is the number of worker processes (default 2).
	Procs int
	// Files is the number of files each worker starts with (default 4).
	Files int
	// MaxLen is the largest file size (default 2 MiB).
	MaxLen int
	// MaxOp is the largest single read, write or mmap access (default
	// 256 KiB).
	MaxOp int
	// Seed seeds the generators; 0 picks one from the clock (reported in
	// the result).
	Seed uint64
	// Duration is how long the workers run (default 20 s).
	Duration time.Duration
	// Ops, when positive, stops each worker after this many operations.
	Ops int64
	// NoMmap leaves out the mmap reads and writes.
	NoMmap bool
	// OpLog, when set, is a file name prefix: worker i writes every
	// operation to OpLog.wI.
	OpLog string
	// Progress, when positive, makes each worker print its counts this
	// often.
	Progress time.Duration
	// StallReport is how long an operation may run before the worker says
	// so (once per operation; default 30 s). It does not stop anything.
	StallReport time.Duration
	// Exe is the program run as a worker (default: this program). It must
	// call MaybeWorker first thing.
	Exe string
	// Out receives the workers' reports, each line prefixed with its worker
	// (default os.Stderr).
	Out io.Writer `json:"-"`
}

// Stall is the longest single operation of a run.
type Stall struct {
	Duration time.Duration
	Worker   int
	Op       int64
	Desc     string
}

// Result sums up a run.
type Result struct {
	Seed       uint64
	Ops        int64            // operations done
	Kinds      map[string]int64 // operations by kind
	Bytes      int64            // bytes read and written (including checks)
	Mismatches int64            // reads that differed from the model
	Errors     int64            // operations that failed (EIO, ...); each resyncs the file
	Handoffs   int64            // files passed to another worker
	Stall      Stall            // the longest operation
}

func (r Result) String() string {
	return fmt.Sprintf("seed=%d ops=%d mismatches=%d errors=%d handoffs=%d bytes=%d longest_stall=%v (worker %d op #%d %s)",
		r.Seed, r.Ops, r.Mismatches, r.Errors, r.Handoffs, r.Bytes, r.Stall.Duration.Round(time.Millisecond), r.Stall.Worker, r.Stall.Op, r.Stall.Desc)
}

func (r *Result) add(o Result) {
	r.Ops += o.Ops
	r.Bytes += o.Bytes
	r.Mismatches += o.Mismatches
	r.Errors += o.Errors
	r.Handoffs += o.Handoffs
	if r.Kinds == nil {
		r.Kinds = map[string]int64{}
	}
	for k, v := range o.Kinds {
		r.Kinds[k] += v
	}
	if o.Stall.Duration > r.Stall.Duration {
		r.Stall = o.Stall
	}
}

func (c *Config) defaults() {
	if c.Procs <= 0 {
		c.Procs = 2
	}
	if c.Files <= 0 {
		c.Files = 4
	}
	if c.MaxLen <= 0 {
		c.MaxLen = 2 << 20
	}
	if c.MaxOp <= 0 {
		c.MaxOp = 256 << 10
	}
	if c.MaxOp > c.MaxLen {
		c.MaxOp = c.MaxLen
	}
	if c.Duration <= 0 {
		c.Duration = 20 * time.Second
	}
	if c.StallReport <= 0 {
		c.StallReport = 30 * time.Second
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	if c.Out == nil {
		c.Out = os.Stderr
	}
}

// workerEnv carries a worker's configuration (JSON) to the worker process.
const workerEnv = "RDMAFS_SOAK_WORKER"

type workerConfig struct {
	Config
	Index int
}

// Run runs the workload and returns its sum. A mismatch is not an error:
// it is counted in the result (and reported on Out); the error is for a
// run that could not be done (a worker that could not start or crashed).
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg.defaults()
	res := Result{Seed: cfg.Seed, Kinds: map[string]int64{}}
	if len(cfg.Dirs) == 0 {
		return res, errors.New("soak: no directory")
	}
	exe := cfg.Exe
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return res, fmt.Errorf("soak: %w", err)
		}
	}
	// A ring of pipes: worker i hands files to worker i+1.
	n := cfg.Procs
	rs, ws := make([]*os.File, n), make([]*os.File, n)
	for i := range n {
		r, w, err := os.Pipe()
		if err != nil {
			return res, fmt.Errorf("soak: %w", err)
		}
		rs[(i+1)%n], ws[i] = r, w
	}
	var outMu sync.Mutex
	type done struct {
		res Result
		err error
	}
	results := make(chan done, n)
	var cmds []*exec.Cmd
	for i := range n {
		data, err := json.Marshal(workerConfig{Config: cfg, Index: i})
		if err != nil {
			return res, fmt.Errorf("soak: %w", err)
		}
		cmd := exec.CommandContext(ctx, exe)
		cmd.Env = append(os.Environ(), workerEnv+"="+string(data))
		cmd.ExtraFiles = []*os.File{rs[i], ws[i]}
		// A worker must not outlive a test binary that dies.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		var stdout bytes.Buffer
		cmd.Stdout = &stdout
		stderr, err := cmd.StderrPipe()
		if err != nil {
			return res, fmt.Errorf("soak: %w", err)
		}
		if err := cmd.Start(); err != nil {
			for _, c := range cmds {
				c.Process.Kill()
				c.Wait()
			}
			return res, fmt.Errorf("soak: start worker %d: %w", i, err)
		}
		cmds = append(cmds, cmd)
		go func() {
			sc := bufio.NewScanner(stderr)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				outMu.Lock()
				fmt.Fprintf(cfg.Out, "soak w%d: %s\n", i, sc.Text())
				outMu.Unlock()
			}
			err := cmd.Wait()
			var r Result
			if err == nil {
				err = json.Unmarshal(stdout.Bytes(), &r)
			}
			if err != nil {
				err = fmt.Errorf("soak: worker %d: %w (stdout %q)", i, err, strings.TrimSpace(stdout.String()))
			}
			results <- done{r, err}
		}()
	}
	// The children hold the pipe ends now.
	for i := range n {
		rs[i].Close()
		ws[i].Close()
	}
	var errs []error
	for range n {
		d := <-results
		if d.err != nil {
			errs = append(errs, d.err)
			continue
		}
		res.add(d.res)
	}
	return res, errors.Join(errs...)
}

// MaybeWorker runs a worker and exits when this process was started as one
// by Run; otherwise it returns at once. Call it first thing in main (or
// TestMain).
func MaybeWorker() {
	data := os.Getenv(workerEnv)
	if data == "" {
		return
	}
	os.Unsetenv(workerEnv)
	var wc workerConfig
	if err := json.Unmarshal([]byte(data), &wc); err != nil {
		fmt.Fprintf(os.Stderr, "bad %s: %v\n", workerEnv, err)
		os.Exit(2)
	}
	wc.Out = os.Stderr
	in, out := os.NewFile(3, "handoff-in"), os.NewFile(4, "handoff-out")
	res, err := runWorker(wc.Config, wc.Index, in, out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "worker failed: %v\n", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		os.Exit(1)
	}
	os.Exit(0)
}
