package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// A test that hangs ends in go test's -timeout panic, which shows the
// test binary's goroutines but not what the rdmafs mounts were waiting
// for, and loses the logs of the running tests. warnBeforeTimeout prints,
// shortly before that panic, each live mount's calls in flight and its
// goroutines that have been blocked for minutes, every line marked
// "HUNG:" so that .ci/run can show them at the end of a failed run.
func warnBeforeTimeout() {
	f := flag.Lookup("test.timeout")
	if f == nil {
		return
	}
	timeout, ok := f.Value.(flag.Getter).Get().(time.Duration)
	if !ok || timeout < 5*time.Minute {
		return
	}
	time.AfterFunc(timeout-2*time.Minute, func() {
		fmt.Fprintf(os.Stderr, "HUNG: the test binary is about to reach its %v timeout; the rdmafs mounts:\n", timeout)
		socks, _ := filepath.Glob(filepath.Join(runDir(), "*.sock"))
		for _, s := range socks {
			dumpSocket(os.Stderr, s)
		}
	})
}

// blockedLong matches a goroutine header of a stack dump whose wait has
// lasted minutes: "goroutine 7 [select, 12 minutes]:".
var blockedLong = regexp.MustCompile(`^goroutine \d+ \[[^\]]*, \d+ minutes\]:$`)

// dumpSocket writes the statistics of the mount serving socket path
// (its slots and calls in flight) and the first frames of its goroutines
// blocked for minutes, each line prefixed with "HUNG: ".
func dumpSocket(w io.Writer, path string) {
	ask := func(req string) string {
		c, err := net.DialTimeout("unix", path, 5*time.Second)
		if err != nil {
			return fmt.Sprintf("%s: %v\n", path, err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		io.WriteString(c, req+"\n")
		b, _ := io.ReadAll(c)
		return string(b)
	}
	for _, l := range strings.Split(ask(statsRequest), "\n") {
		if strings.HasPrefix(l, "pid:") || strings.HasPrefix(l, "device ") || strings.HasPrefix(l, "rpc:") || strings.HasPrefix(l, "eio:") ||
			strings.HasPrefix(l, "slots:") || strings.HasPrefix(l, "  slot ") || strings.Contains(l, "connects:") {
			fmt.Fprintf(w, "HUNG: %s\n", l)
		}
	}
	sc := bufio.NewScanner(strings.NewReader(ask(stacksRequest)))
	frames := -1 // frames still to print of the current goroutine; -1: skip it
	for sc.Scan() {
		l := sc.Text()
		switch {
		case blockedLong.MatchString(l):
			frames = 6
			fmt.Fprintf(w, "HUNG: %s\n", l)
		case l == "":
			frames = -1
		case frames > 0 && !strings.HasPrefix(l, "\t"):
			frames--
			fmt.Fprintf(w, "HUNG:   %s\n", l)
		}
	}
}
