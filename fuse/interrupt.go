package fuse

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	gofuse "github.com/hanwen/go-fuse/v2/fuse"
)

// Interrupts: a hard mount waits as the Linux NFS client's does.
//
// The kernel sends FUSE_INTERRUPT when the thread waiting for a request
// gets any signal (fs/fuse/dev.c request_wait_answer: its first wait is
// wait_event_interruptible), and go-fuse closes the request's cancel
// channel, which the file system sees as its context's Done. Answering
// EINTR then makes the system call fail "Interrupted system call" for a
// signal the program handles and means to survive (SA_RESTART cannot
// restart it: the error is the file system's), and Go programs get
// SIGURG all the time. The Linux client's hard mount waits in
// TASK_KILLABLE: only a fatal signal ends it. So does this one:
// killable hands the file system a cancel channel of its own, closed only
// once the kernel has interrupted the request and the calling thread is
// dying. Blocking lock waits (F_SETLKW, flock without LOCK_NB: FUSE's
// SETLKW) keep the kernel's channel: a signal ends them with EINTR, as
// POSIX says (fcntl(2)). Soft mounts keep their timeouts, which the RPC
// transport keeps whatever the context.
//
// A fatal signal is told from /proc: when one is delivered to a thread
// group, the kernel adds SIGKILL to the pending set of each of its
// threads (kernel/signal.c complete_signal: sigaddset(&t->pending.signal,
// SIGKILL); zap_other_threads likewise for exit_group), and the FUSE
// request's pid is the calling thread's id (fs/fuse/dev.c:
// pid_nr_ns(task_pid(current), fc->pid_ns)). After its one interrupt the
// kernel waits killable, then, once the request is in user space, without
// any wake-up by signals until the answer comes; it sends no second
// interrupt. So a thread not yet dying at the interrupt is looked at
// again, more and more seldom, until the request ends or it is.
//
// A caller whose pid the mount's pid namespace cannot name (pid 0) is
// never taken for dying: its wait ends when the server answers.
//
// Over io_uring the interrupt may never come. The kernel marks a ring
// request sent (FR_SENT) only when the ring's task copies it into an
// entry (fs/fuse/dev_uring.c fuse_uring_prepare_send, run as task work
// after the request was queued), and a signal that comes before that
// queues no interrupt (fs/fuse/dev.c request_wait_answer: queue_interrupt
// only if FR_SENT); unlike read(2) on /dev/fuse (fuse_dev_do_read), the
// ring path does not look for FR_INTERRUPTED once the request is sent.
// The kernel's documentation says as much (fuse-io-uring.rst:
// "Interrupts are probably not working correctly yet"). So over io_uring
// a request that has waited unpromptedAfter is looked at for a dying
// caller as if it had been interrupted, without counting an interrupt.

// SIGKILL's bit in the masks of /proc/PID/status (signal 9: bit 8).
const sigkillMask = 1 << (9 - 1)

// Bounds of the interval at which an interrupted request's thread is
// looked at again for a fatal signal.
const (
	dyingPollMin = 10 * time.Millisecond
	dyingPollMax = 250 * time.Millisecond
)

// unpromptedAfter is how long a request waits before its caller is
// looked at for a fatal signal without an interrupt (io_uring, above):
// longer than most requests take, so that they pay nothing for it.
const unpromptedAfter = 200 * time.Millisecond

// interruptWatch makes, for each request, the cancel channel the file
// system sees (see above).
type interruptWatch struct {
	// dying reports whether thread tid has a fatal signal pending.
	dying func(tid uint32) bool
	// note is told of each interrupt when it comes, with whether its
	// caller is dying then, and again if the caller is found dying
	// later.
	note func(tid uint32, dying bool)
	// unprompted makes a request that has waited unpromptedAfter look
	// for a dying caller without an interrupt (io_uring, above).
	unprompted bool
}

// watch returns the cancel channel for a request from thread tid whose
// kernel-side channel is cancel, and the function to call when the
// request is done.
func (w *interruptWatch) watch(cancel <-chan struct{}, tid uint32) (<-chan struct{}, func()) {
	out := make(chan struct{})
	done := make(chan struct{})
	go func() {
		var unprompted <-chan time.Time
		if w.unprompted && tid != 0 {
			t := time.NewTimer(unpromptedAfter)
			defer t.Stop()
			unprompted = t.C
		}
		select {
		case <-done:
			return
		case <-cancel:
			if w.waitDying(tid, done) {
				close(out)
			}
		case <-unprompted:
			if w.pollDying(tid, done) {
				close(out)
			}
		}
	}()
	return out, func() { close(done) }
}

// waitDying reports true once thread tid is dying, false when done
// closes first.
func (w *interruptWatch) waitDying(tid uint32, done <-chan struct{}) bool {
	dying := tid != 0 && w.dying(tid)
	w.note(tid, dying)
	if dying || tid == 0 {
		return dying
	}
	return w.pollDying(tid, done)
}

// pollDying looks at thread tid, more and more seldom, until it is dying
// (true) or done closes (false).
func (w *interruptWatch) pollDying(tid uint32, done <-chan struct{}) bool {
	t := time.NewTimer(dyingPollMin)
	defer t.Stop()
	for delay := dyingPollMin; ; {
		select {
		case <-done:
			return false
		case <-t.C:
		}
		if w.dying(tid) {
			w.note(tid, true)
			return true
		}
		delay = min(2*delay, dyingPollMax)
		t.Reset(delay)
	}
}

// threadDying reports whether thread tid has SIGKILL pending: a fatal
// signal is being delivered to its thread group. A thread /proc does not
// show is not taken for dying.
func threadDying(tid uint32) bool {
	f, err := os.Open("/proc/" + strconv.FormatUint(uint64(tid), 10) + "/status")
	if err != nil {
		return false
	}
	defer f.Close()
	// /proc/PID/status is about 1.5 KiB; the signal lines come in its
	// first half. Read no more than a bound of it.
	b, err := io.ReadAll(io.LimitReader(f, 16<<10))
	if err != nil {
		return false
	}
	pending, err := parsePendingSignals(b)
	return err == nil && pending&sigkillMask != 0
}

// errNoSigPnd says a status file had no SigPnd line.
var errNoSigPnd = errors.New("no SigPnd line")

// parsePendingSignals returns the union of the "SigPnd:" (the thread's
// own) and "ShdPnd:" (its thread group's) masks of a /proc/PID/status
// file (proc(5): hexadecimal, bit N-1 for signal N).
func parsePendingSignals(status []byte) (uint64, error) {
	var mask uint64
	found := false
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		key, val, ok := bytes.Cut(sc.Bytes(), []byte(":"))
		if !ok || !bytes.Equal(key, []byte("SigPnd")) && !bytes.Equal(key, []byte("ShdPnd")) {
			continue
		}
		// The masks have _NSIG bits: 64 on every architecture Go's
		// linux ports run on.
		v, err := strconv.ParseUint(string(bytes.TrimSpace(val)), 16, 64)
		if err != nil {
			return 0, fmt.Errorf("%s %q: %w", key, bytes.TrimSpace(val), err)
		}
		mask |= v
		found = found || bytes.Equal(key, []byte("SigPnd"))
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !found {
		return 0, errNoSigPnd
	}
	return mask, nil
}

// killable is the raw file system the kernel talks to: each request that
// a signal should not end gets the cancel channel of interruptWatch.
// It wraps rawHooks, whose requestInfo is keyed by the channel the file
// system sees (request.go).
type killable struct {
	gofuse.RawFileSystem
	w *interruptWatch
}
