package main

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
)

// TestInterruptedReadNoStickyEINTR reads a file whose writes are still
// buffered in rdmafs while signals interrupt the read (the kernel then
// sends FUSE_INTERRUPT), and checks that the file works afterwards: an
// interrupted write-out must not stay the file's error, or every later
// read returns EINTR, which callers retry for ever (found by TestSoak:
// a worker spinning in pread64 = -EINTR).
func TestInterruptedReadNoStickyEINTR(t *testing.T) {
	forEachTransport(t, func(t *testing.T, p peer) {
		mnt := mount(t, p)
		d := testDir(t, mnt)
		defer os.RemoveAll(d)
		const n = 512 << 10
		sticky := 0
		for round := range 20 {
			f, err := os.OpenFile(filepath.Join(d, "f"), os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			data := bytes.Repeat([]byte{byte(round + 1)}, n)
			if _, err := f.WriteAt(data, 0); err != nil {
				t.Fatal(err)
			}
			// Interrupt the thread that reads, as often as possible, for
			// the duration of one read (the write-out happens in it).
			tid := make(chan int)
			var stop atomic.Bool
			done := make(chan struct{})
			go func() {
				defer close(done)
				id := <-tid
				for !stop.Load() {
					syscall.Tgkill(os.Getpid(), id, syscall.SIGURG)
				}
			}()
			buf := make([]byte, n)
			func() {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				tid <- syscall.Gettid()
				syscall.Pread(int(f.Fd()), buf, 0)
			}()
			stop.Store(true)
			<-done
			// No signals now: the read must work.
			var got int
			for try := 0; try < 3; try++ {
				got, err = syscall.Pread(int(f.Fd()), buf, 0)
				if err != syscall.EINTR {
					break
				}
			}
			if err == syscall.EINTR {
				sticky++
				t.Errorf("%s: round %d: pread returns EINTR with no signal pending: the interrupted write-out stuck as the file's error", p.name, round)
			} else if err != nil || got != n || !bytes.Equal(buf, data) {
				t.Errorf("%s: round %d: read back %d bytes, %v; equal to the data written: %v", p.name, round, got, err, bytes.Equal(buf[:max(got, 0)], data[:max(got, 0)]))
			}
			f.Close()
			if sticky >= 2 {
				return
			}
		}
	})
}
