package main

import (
	"io"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/rdmafs/rdmafs/internal/trace"
)

// traceCategories parses the -v flag of mount and relay: the trace
// categories, none when it is absent.
func traceCategories(cctx *cli.Context) (trace.Category, error) {
	v := cctx.String("v")
	if v == "" {
		return 0, nil
	}
	cats, err := trace.Parse(v)
	if err != nil {
		return 0, exitf(exitUsage, err, "-v %s: %v", v, err)
	}
	return cats, nil
}

// openLog opens the --log file for appending, or gives stderr when path
// is empty; close closes what it opened. A symbolic link is refused
// (openNoFollow): rdmafs often runs as root.
func openLog(path string) (w io.Writer, close func(), err error) {
	if path == "" {
		return os.Stderr, func() {}, nil
	}
	f, err := openNoFollow(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, exitf(exitUsage, err, "--log: %v", err)
	}
	return f, func() { f.Close() }, nil
}
