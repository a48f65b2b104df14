// Command rdmafs mounts an NFSv4.1 export through FUSE, over TCP or
// RPC-over-RDMA, and reports the statistics of a running mount; it also
// relays RPC-over-RDMA to a TCP NFS server.
//
//	rdmafs mount server:/export /mnt
//	rdmafs stats /mnt
//	rdmafs umount /mnt
//	rdmafs relay --listen :20049 --to server:2049
//
// Installed as mount.rdmafs (or mount.fuse.rdmafs), it follows mount(8)'s
// helper convention, so an fstab line works:
//
//	server:/export  /mnt  fuse.rdmafs  proto=rdma,_netdev  0 0
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"
)

func main() {
	args := os.Args
	// mount(8) runs mount.rdmafs; mount.fuse3 runs "rdmafs SOURCE DIR -o OPTS".
	if isMountHelper(args[0]) || (len(args) > 2 && strings.Contains(args[1], ":") && !strings.HasPrefix(args[1], "-")) {
		args = helperArgs(args)
	}
	args = reorderMountArgs(args)
	app := newApp()
	app.Commands = append(app.Commands, manCommand()) // hidden: make man
	app.Metadata = map[string]any{"args": args}
	err := app.Run(args)
	os.Exit(report(err))
}

// report prints err as one line and returns the exit code.
func report(err error) int {
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.msg != "" {
			fmt.Fprintf(os.Stderr, "rdmafs: %s\n", ee.msg)
		}
		return ee.code
	}
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		fmt.Fprintf(os.Stderr, "rdmafs: %v\n", err)
		return ec.ExitCode()
	}
	fmt.Fprintf(os.Stderr, "rdmafs: %v\n", err)
	return exitUsage
}

func newApp() *cli.App {
	return &cli.App{
		Name:  "rdmafs",
		Usage: "mount NFSv4.1 exports through FUSE, over TCP or RPC-over-RDMA",
		Description: `rdmafs is a userspace NFSv4.1 client. "rdmafs mount" serves an NFS export
as a FUSE file system; the process that serves the mount keeps the NFS
session and answers "rdmafs stats". Unmounting (rdmafs umount, umount, or
fusermount3 -u) writes back buffered data, closes open state, destroys
the session and ends that process. SIGTERM or SIGINT to that process
unmounts too; a second one, or one after the unmount, stops waiting for
a server that does not answer (buffered data is then lost, and the
process says so); the write-back after an unmount gives up by itself
after a minute.

Its fast transport is RPC-over-RDMA (RFC 8166, and the draft version 2);
plain TCP is the fallback. Two verbs providers carry it, chosen per mount
with -o rdmadev: rdma-core (libibverbs and librdmacm) on an RDMA device
(mlx5_0, rxe0, siw0; the default where /sys/class/infiniband lists a
device, taking the first with an active port), and iwarp-go, a pure-Go
iWARP provider over TCP that needs no RDMA hardware (the default
otherwise). "rdmafs relay" puts RPC-over-RDMA in front of an NFS server
that speaks only TCP. The same client is a Go library, package
github.com/rdmafs/rdmafs/nfs.

EXAMPLES:
   rdmafs mount server:/export /mnt       # background; returns when mounted
   rdmafs mount -o proto=rdma server:/export /mnt
   rdmafs mount -f -v nfs,fuse server:/ /mnt
   rdmafs stats /mnt
   rdmafs umount /mnt
   rdmafs relay --to nfs1:2049      # RPC-over-RDMA on :20049 to TCP nfs1:2049

Run "rdmafs COMMAND --help" for a command's options and exit codes.

ENVIRONMENT:
   RDMAFS_RUN_DIR    directory of the stats sockets and handle caches,
                     instead of /run/rdmafs (root) or the user's own;
                     it must be the user's, writable by no one else
   XDG_RUNTIME_DIR   a non-root user's stats sockets go in
                     $XDG_RUNTIME_DIR/rdmafs (else /tmp/rdmafs-UID)

EXIT STATUS:
   0 success; 1 bad usage; 2 to 5 and 32: see "rdmafs mount --help" and
   "rdmafs relay --help".`,
		HideHelpCommand: true,
		Commands:        []*cli.Command{mountCommand(), umountCommand(), statsCommand(), relayCommand()},
		ExitErrHandler:  func(*cli.Context, error) {}, // main reports errors
	}
}

// isMountHelper reports whether rdmafs runs as a mount(8) helper.
func isMountHelper(argv0 string) bool {
	b := filepath.Base(argv0)
	return b == "mount.rdmafs" || b == "mount.fuse.rdmafs" || b == "mount.fuse3.rdmafs"
}

// helperArgs translates mount(8)'s helper calling convention,
//
//	mount.rdmafs SOURCE DIR [-sfnv] [-N ns] [-o OPTIONS] [-t type]
//
// into "rdmafs mount -o OPTIONS SOURCE DIR".
func helperArgs(args []string) []string {
	out := []string{"rdmafs", "mount"}
	var pos []string
	for i := 1; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-o" && i+1 < len(args):
			out = append(out, "-o", args[i+1])
			i++
		case strings.HasPrefix(a, "-o") && len(a) > 2:
			out = append(out, "-o", a[2:])
		case (a == "-t" || a == "-N") && i+1 < len(args):
			i++ // the type is ours; namespaces are not supported
		case strings.HasPrefix(a, "-"):
			// -s (sloppy), -f (fake), -n (no mtab), -v (verbose): nothing to do
		default:
			pos = append(pos, a)
		}
	}
	return append(out, pos...)
}

// reorderMountArgs moves flags given after the positional arguments of
// "mount" ahead of them ("rdmafs mount src dir -o ro"), since the flag
// parser stops at the first positional argument.
func reorderMountArgs(args []string) []string {
	if len(args) < 3 || args[1] != "mount" {
		return args
	}
	valued := map[string]bool{}
	for _, f := range mountFlags() {
		if _, isBool := f.(*cli.BoolFlag); isBool {
			continue
		}
		for _, n := range f.Names() {
			valued["-"+n], valued["--"+n] = true, true
		}
	}
	var flags, pos []string
	rest := args[2:]
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" {
			pos = append(pos, rest[i+1:]...)
			break
		}
		if strings.HasPrefix(a, "-") && len(a) > 1 {
			flags = append(flags, a)
			if valued[a] && i+1 < len(rest) {
				flags = append(flags, rest[i+1])
				i++
			}
			continue
		}
		pos = append(pos, a)
	}
	out := append([]string{args[0], "mount"}, flags...)
	return append(out, pos...)
}
