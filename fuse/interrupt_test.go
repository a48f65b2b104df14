package fuse

import (
	"bytes"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// A /proc/PID/status of a thread with SIGKILL and SIGUSR1 pending (its
// lines from Linux 6.18, trimmed).
const statusDying = "Name:\tsignals\nState:\tD (disk sleep)\nTgid:\t4242\nPid:\t4242\n" +
	"SigQ:\t2/127372\nSigPnd:\t0000000000000100\nShdPnd:\t0000000000000300\n" +
	"SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\nSigCgt:\t0000000000000200\n"

func TestParsePendingSignals(t *testing.T) {
	for _, c := range []struct {
		name, status string
		want         uint64
		ok           bool
	}{
		{"dying", statusDying, 0x300, true},
		{"quiet", "SigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n", 0, true},
		{"group only", "SigPnd:\t0000000000000000\nShdPnd:\t0000000000000100\n", 0x100, true},
		{"no SigPnd", "Name:\tx\nShdPnd:\t0000000000000100\n", 0, false},
		{"not hex", "SigPnd:\tzz\n", 0, false},
		{"too wide", "SigPnd:\t100000000000000000\n", 0, false},
		{"empty", "", 0, false},
	} {
		got, err := parsePendingSignals([]byte(c.status))
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("%s: got %#x, %v; want %#x, ok=%v", c.name, got, err, c.want, c.ok)
		}
	}
}

// FuzzParsePendingSignals: any bytes give a mask or an error, never a
// panic, and a mask only from a SigPnd line.
func FuzzParsePendingSignals(f *testing.F) {
	f.Add([]byte(statusDying))
	f.Add([]byte("SigPnd: 1\nShdPnd: ffffffffffffffff\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := parsePendingSignals(b); err == nil && !bytes.Contains(b, []byte("SigPnd")) {
			t.Fatalf("a mask from %q, which has no SigPnd", b)
		}
	})
}

// TestThreadDying reads this thread's own status: a live test is not
// dying, and a thread /proc does not show is not either.
func TestThreadDying(t *testing.T) {
	if threadDying(uint32(syscall.Gettid())) {
		t.Errorf("the test's own thread taken for dying")
	}
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	max, err := strconv.Atoi(string(b[:len(b)-1]))
	if err != nil {
		t.Fatal(err)
	}
	if threadDying(uint32(max) + 1) {
		t.Errorf("a thread id past pid_max taken for dying")
	}
}

// TestInterruptWatch checks the channel the file system sees: not closed
// by the kernel's interrupt of a caller that is not dying, closed once
// the caller is found dying (at the interrupt or later), never for pid 0,
// and the watch ends with the request.
func TestInterruptWatch(t *testing.T) {
	var dying atomic.Bool
	var waited, honoured atomic.Int32
	w := &interruptWatch{
		dying: func(uint32) bool { return dying.Load() },
		note: func(_ uint32, d bool) {
			if d {
				honoured.Add(1)
			} else {
				waited.Add(1)
			}
		},
	}
	closed := func(c <-chan struct{}, within time.Duration) bool {
		select {
		case <-c:
			return true
		case <-time.After(within):
			return false
		}
	}

	// Interrupted, not dying: the request goes on, and ends normally.
	kernel := make(chan struct{})
	c, done := w.watch(kernel, 42)
	close(kernel)
	if closed(c, 100*time.Millisecond) {
		t.Fatal("an interrupt of a caller that is not dying ended the request")
	}
	done()

	// Interrupted, then killed: the watch sees it.
	kernel = make(chan struct{})
	c, done = w.watch(kernel, 42)
	close(kernel)
	if closed(c, 50*time.Millisecond) {
		t.Fatal("ended before the caller was dying")
	}
	dying.Store(true)
	if !closed(c, time.Minute) {
		t.Fatal("a caller killed after its interrupt did not end the request")
	}
	done()

	// Dying at the interrupt.
	kernel = make(chan struct{})
	c, done = w.watch(kernel, 42)
	close(kernel)
	if !closed(c, time.Minute) {
		t.Fatal("the interrupt of a dying caller did not end the request")
	}
	done()

	// pid 0: the mount cannot tell; the request goes on.
	kernel = make(chan struct{})
	c, done = w.watch(kernel, 0)
	close(kernel)
	if closed(c, 100*time.Millisecond) {
		t.Fatal("an interrupt of pid 0 ended the request")
	}
	done()

	// No interrupt: nothing noted.
	before := waited.Load() + honoured.Load()
	_, done = w.watch(make(chan struct{}), 42)
	done()
	time.Sleep(10 * time.Millisecond)
	if n := waited.Load() + honoured.Load(); n != before {
		t.Errorf("a request without interrupt noted %d interrupts", n-before)
	}
	if waited.Load() != 3 || honoured.Load() != 2 {
		t.Errorf("noted %d waited through and %d honoured, want 3 and 2", waited.Load(), honoured.Load())
	}
}

// BenchmarkInterruptWatch is what each request pays for its watch when
// no interrupt comes.
func BenchmarkInterruptWatch(b *testing.B) {
	w := &interruptWatch{dying: func(uint32) bool { return false }, note: func(uint32, bool) {}}
	kernel := make(chan struct{})
	for b.Loop() {
		_, done := w.watch(kernel, 1)
		done()
	}
}

// TestInterruptWatchUnprompted checks the io_uring case, where the
// kernel may send no interrupt: a request whose caller dies ends after
// unpromptedAfter without one, noted as honoured; a caller that is not
// dying waits on; pid 0 is never looked at; and a watch without
// unprompted never ends a request by itself.
func TestInterruptWatchUnprompted(t *testing.T) {
	var dying atomic.Bool
	var looked, honoured atomic.Int32
	w := &interruptWatch{
		dying: func(uint32) bool { looked.Add(1); return dying.Load() },
		note: func(_ uint32, d bool) {
			if d {
				honoured.Add(1)
			}
		},
		unprompted: true,
	}
	closed := func(c <-chan struct{}, within time.Duration) bool {
		select {
		case <-c:
			return true
		case <-time.After(within):
			return false
		}
	}
	never := make(chan struct{})

	c, done := w.watch(never, 42)
	if closed(c, 2*unpromptedAfter) {
		t.Fatal("a request whose caller is not dying ended without an interrupt")
	}
	if looked.Load() == 0 {
		t.Fatal("the caller of a long request was never looked at")
	}
	dying.Store(true)
	if !closed(c, time.Minute) {
		t.Fatal("a killed caller's request did not end without an interrupt")
	}
	done()
	if honoured.Load() != 1 {
		t.Errorf("noted %d honoured, want 1", honoured.Load())
	}

	looked.Store(0)
	c, done = w.watch(never, 0)
	if closed(c, 2*unpromptedAfter) || looked.Load() != 0 {
		t.Errorf("pid 0: ended or looked at %d times", looked.Load())
	}
	done()

	w.unprompted = false
	c, done = w.watch(never, 42)
	if closed(c, 2*unpromptedAfter) {
		t.Error("a watch without unprompted ended a request without an interrupt")
	}
	done()
}
