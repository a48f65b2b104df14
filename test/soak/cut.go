package soak

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// CutConnections breaks every TCP connection of process pid to the remote
// port port (the transport of an rdmafs mount: NFS over TCP, or the TCP
// stream under RPC-over-RDMA on iWARP): it takes a duplicate of each
// socket with pidfd_getfd(2) and shuts it down both ways, so the process
// sees its connection end as if the network had dropped it. It returns how
// many connections it cut. It needs the right to ptrace pid (root).
//
// (ss -K would do, but needs a kernel built with INET_DIAG_DESTROY.)
func CutConnections(pid, port int) (int, error) {
	inodes, err := socketsTo(pid, port)
	if err != nil {
		return 0, err
	}
	if len(inodes) == 0 {
		return 0, nil
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0, fmt.Errorf("soak: pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return 0, fmt.Errorf("soak: %w", err)
	}
	cut := 0
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil || !strings.HasPrefix(link, "socket:[") {
			continue
		}
		if !inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dup, err := unix.PidfdGetfd(pidfd, fd, 0)
		if err != nil {
			return cut, fmt.Errorf("soak: pidfd_getfd %d/%d: %w", pid, fd, err)
		}
		err = unix.Shutdown(dup, unix.SHUT_RDWR)
		unix.Close(dup)
		if err != nil && err != unix.ENOTCONN {
			return cut, fmt.Errorf("soak: shutdown %d/%d: %w", pid, fd, err)
		}
		cut++
	}
	return cut, nil
}

// socketsTo returns the inodes of pid's established TCP sockets whose
// remote port is port, from /proc/PID/net/tcp{,6}.
func socketsTo(pid, port int) (map[string]bool, error) {
	inodes := map[string]bool{}
	for _, name := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, name))
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return nil, fmt.Errorf("soak: %w", err)
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || fs[3] != "01" { // TCP_ESTABLISHED
				continue
			}
			_, rport, ok := strings.Cut(fs[2], ":")
			if !ok {
				continue
			}
			b, err := hex.DecodeString(rport)
			if err != nil || len(b) != 2 || int(b[0])<<8|int(b[1]) != port {
				continue
			}
			inodes[fs[9]] = true
		}
		f.Close()
	}
	return inodes, nil
}
