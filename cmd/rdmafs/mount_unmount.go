package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmafs/rdmafs/fuse"
	"github.com/rdmafs/rdmafs/internal/trace"
)

// serveUntilUnmount serves m until it is unmounted, then writes what is
// buffered and closes the open state and the session.
func serveUntilUnmount(o *mountOptions, m *fuse.Mount, tr *trace.Tracer, logw io.Writer) error {
	// While mounted, SIGINT and SIGTERM unmount, as umount does (it
	// fails while files are busy). Once unmounted, buffered writes go to
	// the server and the open state is closed, for at most
	// shutdownTimeout: a hard mount would retry for ever against a server
	// that is gone, so a signal then stops waiting for it. So does a
	// signal while the unmount is under way: the unmount waits for the
	// FUSE requests being served, which may wait for the server.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	var unmounted atomic.Bool
	go func() {
		unmountDone := make(chan error, 1)
		unmounting := false
		for {
			var sig os.Signal
			select {
			case <-sctx.Done():
				return
			case err := <-unmountDone:
				if err != nil {
					fmt.Fprintf(logw, "rdmafs: unmount %s: %v\n", o.Dir, err)
				}
				unmounting = false
				continue
			case sig = <-sigs:
			}
			if !unmounted.Load() && !unmounting {
				unmounting = true
				go func() { unmountDone <- m.Unmount() }()
				continue
			}
			fmt.Fprintf(logw, "rdmafs: %v while closing files: not waiting for the server any longer\n", sig)
			scancel()
			m.Abandon()
			return
		}
	}()
	m.Wait()
	unmounted.Store(true)
	if tr.On(trace.FUSE) {
		tr.Printf(trace.FUSE, "%s unmounted: closing open files and the NFS session", o.Dir)
	}
	tctx, tcancel := context.WithTimeout(sctx, shutdownTimeout)
	defer tcancel()
	start := time.Now()
	err := m.Shutdown(tctx)
	if tr.On(trace.FUSE) {
		tr.Printf(trace.FUSE, "shutdown done in %v: %v", time.Since(start).Round(time.Microsecond), err)
	}
	if err != nil && tctx.Err() != nil {
		why := "after " + shutdownTimeout.String()
		if sctx.Err() != nil {
			why = "on a signal"
		}
		return exitf(exitFailure, err, "unmount of %s: gave up on the server %s: data still buffered for open files was not written: %s", o.Dir, why, strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if err != nil {
		return exitf(exitFailure, err, "unmount of %s: %v", o.Dir, err)
	}
	return nil
}
