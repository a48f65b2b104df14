package main

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// cpuProfileEnv names the environment variable that has the daemon
// write a pprof CPU profile of the mount's whole life to a file (make
// bench-kernel takes one in the knfsd guest, which has no perf).
const cpuProfileEnv = "RDMAFS_CPUPROFILE"

// startCPUProfile starts the profile $RDMAFS_CPUPROFILE asks for, if
// any, and returns what ends it.
func startCPUProfile() (stop func(), err error) {
	path := os.Getenv(cpuProfileEnv)
	if path == "" {
		return func() {}, nil
	}
	// A symbolic link is refused (openNoFollow): rdmafs often runs as root.
	f, err := openNoFollow(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cpuProfileEnv, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s=%s: %w", cpuProfileEnv, path, err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
