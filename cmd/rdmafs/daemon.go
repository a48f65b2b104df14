package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// spawnDaemon runs the mount in a re-executed background process and
// waits until it reports, over a pipe, that the mount is live ("ok") or
// why it failed ("err CODE MESSAGE"). So errors reach the user before the
// command returns, and a zero exit status means a working mount.
func spawnDaemon(args []string, keepStderr bool) error {
	exe, err := os.Executable()
	if err != nil {
		return exitf(exitFailure, err, "cannot find own executable: %v", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return exitf(exitFailure, err, "pipe: %v", err)
	}
	defer r.Close()
	cmd := exec.Command(exe, args[1:]...)
	cmd.Args[0] = "rdmafs"
	cmd.Env = append(os.Environ(), daemonEnv+"=3")
	cmd.ExtraFiles = []*os.File{w}
	if keepStderr {
		cmd.Stderr = os.Stderr // the user asked for traces on stderr
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	// The background process outlives this command: it must not keep
	// what the caller left open for it (a flock(1) lock file, a pipe the
	// caller reads to its end), only stdio and the report pipe.
	closeInheritedOnExec()
	if err := cmd.Start(); err != nil {
		w.Close()
		return exitf(exitFailure, err, "start background process: %v", err)
	}
	w.Close()
	msg, _ := io.ReadAll(io.LimitReader(r, 4096))
	line := strings.TrimSpace(string(msg))
	if line == "ok" {
		cmd.Process.Release()
		return nil
	}
	if rest, ok := strings.CutPrefix(line, "err "); ok {
		code, text, _ := strings.Cut(rest, " ")
		n, err := strconv.Atoi(code)
		if err != nil {
			n = exitFailure
		}
		cmd.Wait()
		return &exitError{code: n, msg: text}
	}
	werr := cmd.Wait()
	return exitf(exitFailure, werr, "background mount process ended without reporting: %v", werr)
}

// daemonNotifier returns the function that reports the mount's outcome
// to the parent once: a no-op in the foreground. In the background
// process it also detaches stdin and stdout.
func daemonNotifier() func(error) {
	fdStr := os.Getenv(daemonEnv)
	if fdStr == "" {
		return func(error) {}
	}
	os.Unsetenv(daemonEnv)
	fd, err := strconv.Atoi(fdStr)
	if err != nil {
		return func(error) {}
	}
	syscall.CloseOnExec(fd)
	pipe := os.NewFile(uintptr(fd), "rdmafs-parent")
	var once sync.Once
	return func(err error) {
		once.Do(func() {
			if err == nil {
				fmt.Fprintln(pipe, "ok")
			} else {
				code, msg := exitFailure, err.Error()
				var ee *exitError
				if errors.As(err, &ee) {
					code, msg = ee.code, ee.msg
				}
				fmt.Fprintf(pipe, "err %d %s\n", code, strings.ReplaceAll(msg, "\n", " "))
			}
			pipe.Close()
		})
	}
}

// closeInheritedOnExec marks every descriptor above stderr close-on-exec:
// those this process inherited without it. Go opens its own with it.
func closeInheritedOnExec() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}
