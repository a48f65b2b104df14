package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/rdmafs/rdmafs/nfsclient"
	"github.com/rdmafs/rdmafs/oncrpc"
	"github.com/rdmafs/rdmafs/verbs"
	"github.com/rdmafs/rdmafs/verbs/ibverbs"
)

// Exit codes of rdmafs mount (also documented in README.md and rdmafs mount --help).
const (
	exitUsage      = 1  // bad command line or option
	exitMountpoint = 2  // mountpoint missing, not a directory, or busy
	exitFUSE       = 3  // no /dev/fuse, or fusermount3 or the kernel refused the FUSE mount
	exitServer     = 4  // server unreachable, closed the connection, or no reply
	exitExport     = 5  // export not found or access denied
	exitFailure    = 32 // any other mount failure (mount(8)'s code)
)

// exitError is an error with the exit code and the one line to print.
type exitError struct {
	code int
	msg  string
	err  error
}

func (e *exitError) Error() string { return e.msg }
func (e *exitError) Unwrap() error { return e.err }

func exitf(code int, err error, format string, args ...any) *exitError {
	return &exitError{code: code, msg: fmt.Sprintf(format, args...), err: err}
}

// classifyDial turns an error from reaching the server into a message a
// user can act on.
func classifyDial(err error, o *mountOptions, wait time.Duration) *exitError {
	addr := o.addr()
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return exitf(exitServer, err, "cannot reach NFS server %s: connection refused (is the server running, and is port %s right?)", addr, portOf(addr))
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return exitf(exitServer, err, "cannot reach NFS server %s: no route to host", addr)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return exitf(exitServer, err, "NFS server %s closed the connection (is it an NFS server, and does it accept this client?)", addr)
	case errors.Is(err, oncrpc.ErrProgUnavail), errors.Is(err, oncrpc.ErrProgMismatch), errors.Is(err, nfsclient.ErrMinorVersMismatch):
		return exitf(exitServer, err, "server %s does not offer NFS version 4.1", addr)
	case errors.Is(err, nfsclient.ErrNoEnt), errors.Is(err, nfsclient.ErrNotDir):
		return exitf(exitExport, err, "export %s not found on %s", o.Export, o.Server)
	case errors.Is(err, nfsclient.ErrWrongSec):
		return exitf(exitExport, err, "access to export %s on %s denied with sec=%v: the server wants another security flavor (sec=sys, krb5, krb5i or krb5p)", o.Export, o.Server, o.Sec)
	case errors.Is(err, nfsclient.ErrNoCredentials):
		return exitf(exitExport, err, "mount of %s:%s with sec=%v: %v", o.Server, o.Export, o.Sec, err)
	case errors.Is(err, nfsclient.ErrAccess), errors.Is(err, nfsclient.ErrPerm), errors.Is(err, oncrpc.ErrDenied):
		return exitf(exitExport, err, "access to export %s on %s denied", o.Export, o.Server)
	case errors.Is(err, ibverbs.ErrUnreachable), errors.Is(err, ibverbs.ErrWrongDevice), errors.Is(err, verbs.ErrRejected):
		return exitf(exitServer, err, "cannot reach NFS server %s over RDMA: %v", addr, err)
	case errors.Is(err, oncrpc.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return exitf(exitServer, err, "no reply from NFS server %s within %v (timeo=%d, retrans=%d)", addr, wait.Round(time.Second), o.Timeo/(100*time.Millisecond), o.Retrans)
	}
	return exitf(exitFailure, err, "mount of %s:%s failed: %v", o.Server, o.Export, err)
}

func portOf(addr string) string {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			return addr[i+1:]
		}
	}
	return addr
}
