package main

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// cpuTime returns the CPU time process pid has used so far, all its
// threads (exited ones too) in user and kernel mode, to the nanosecond:
// the process's CPU-time clock, clock_gettime(2) on the clock ID
// clock_getcpuclockid(3) would return for pid. The kernel sums the
// threads' sum_exec_runtime for it, the first field of each
// /proc/PID/task/TID/schedstat; /proc/PID/stat's utime and stime only
// count 10 ms ticks, too coarse for a job of a second or two.
func cpuTime(pid int) (time.Duration, error) {
	if pid <= 0 {
		return 0, fmt.Errorf("cpu time: pid %d", pid)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(processCPUClock(pid), &ts); err != nil {
		return 0, fmt.Errorf("cpu time of pid %d: %w", pid, err)
	}
	return time.Duration(ts.Nano()), nil
}

// processCPUClock returns the clock ID of process pid's CPU-time clock:
// Linux's MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED), the ones' complement
// of the pid shifted left by 3, with 2 (CPUCLOCK_SCHED: the scheduler's
// nanosecond runtime) in the low bits and the per-thread bit (4) clear
// (include/linux/posix-timers_types.h).
func processCPUClock(pid int) int32 {
	const cpuClockSched = 2
	return int32(^pid<<3) | cpuClockSched
}
