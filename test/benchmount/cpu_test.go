package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU returns the calling thread's CPU time.
func threadCPU(t *testing.T) time.Duration {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ts.Nano())
}

// TestCPUTimePrecise checks that cpuTime counts finer than ticks: over
// 2 ms of this thread's computing, the process's CPU time grows by at
// least that much (a 10 ms tick count mostly would not move at all).
func TestCPUTimePrecise(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p0, err := cpuTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	t0 := threadCPU(t)
	x := 0
	for threadCPU(t)-t0 < 2*time.Millisecond {
		for i := range 1 << 12 {
			x += i
		}
	}
	spun := threadCPU(t) - t0
	p1, err := cpuTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if p1-p0 < spun {
		t.Errorf("process CPU grew %v while this thread computed for %v (x=%d)", p1-p0, spun, x)
	}
}

// schedstatRuntime returns the first field of a /proc/.../schedstat
// line: the nanoseconds the task has run on a CPU (proc(5)).
func schedstatRuntime(b []byte) (time.Duration, error) {
	f := bytes.Fields(b)
	if len(f) != 3 {
		return 0, fmt.Errorf("schedstat %q: %d fields, want 3", b, len(f))
	}
	ns, err := strconv.ParseInt(string(f[0]), 10, 64)
	if err != nil || ns < 0 {
		return 0, fmt.Errorf("schedstat %q: run time not a count", b)
	}
	return time.Duration(ns), nil
}

func TestSchedstatRuntime(t *testing.T) {
	if d, err := schedstatRuntime([]byte("123456789 42 7\n")); err != nil || d != 123456789 {
		t.Errorf("schedstatRuntime = %v, %v; want 123.456789ms", d, err)
	}
	for _, bad := range []string{"", "1 2", "x 1 2", "-5 1 2", "1 2 3 4"} {
		if d, err := schedstatRuntime([]byte(bad)); err == nil {
			t.Errorf("schedstatRuntime(%q) = %v, want an error", bad, d)
		}
	}
}

// TestCPUTimeAllThreads checks that cpuTime is the whole process's: at
// least the sum of its threads' run times in schedstat, read just before
// (the main thread's own /proc/PID/schedstat is only that thread's).
func TestCPUTimeAllThreads(t *testing.T) {
	// Keep a few goroutines busy for a moment, so that there is more
	// than the main thread to count (the runtime keeps their threads).
	done := make(chan struct{})
	for range 3 {
		go func() {
			x := 0
			for start := time.Now(); time.Since(start) < 20*time.Millisecond; x++ {
			}
			done <- struct{}{}
		}()
	}
	for range 3 {
		<-done
	}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", os.Getpid()))
	if err != nil || len(tasks) < 2 {
		t.Fatalf("threads' schedstat: %v, %v", tasks, err)
	}
	var sum, leader time.Duration
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread exited
		}
		d, err := schedstatRuntime(b)
		if err != nil {
			t.Fatal(err)
		}
		sum += d
		if p == fmt.Sprintf("/proc/%d/task/%[1]d/schedstat", os.Getpid()) {
			leader = d
		}
	}
	got, err := cpuTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got < sum {
		t.Errorf("cpuTime = %v, less than the threads' schedstat sum %v", got, sum)
	}
	if got <= leader {
		t.Errorf("cpuTime = %v, no more than the main thread's %v", got, leader)
	}
}

// TestCPUTimeOtherProcess checks cpuTime of another process: a child
// that computes.
func TestCPUTimeOtherProcess(t *testing.T) {
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sh: %v", err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	for start := time.Now(); time.Since(start) < time.Minute; time.Sleep(10 * time.Millisecond) {
		d, err := cpuTime(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if d > 0 {
			return
		}
	}
	t.Error("the child's CPU time stayed 0 for a minute of computing")
}

func TestCPUTimeNoProcess(t *testing.T) {
	// pid_max is at most 2^22 (proc(5)).
	for _, pid := range []int{-1, 0, 1<<22 + 1} {
		if d, err := cpuTime(pid); err == nil {
			t.Errorf("cpuTime(%d) = %v, want an error", pid, d)
		}
	}
}
