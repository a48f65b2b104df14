package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// rpcCounts is the per-op table of "rdmafs stats": COMPOUNDs sent, by
// the name stats gives them.
type rpcCounts map[string]int

// readRPCCounts runs "rdmafs stats dir" and parses its per-op table.
func readRPCCounts(bin, dir string) (rpcCounts, error) {
	out, err := exec.Command(bin, "stats", dir).Output()
	if err != nil {
		return nil, fmt.Errorf("rdmafs stats %s: %w", dir, err)
	}
	counts := rpcCounts{}
	in := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case strings.HasPrefix(sc.Text(), "per-op statistics:"):
			in = true
		case in && len(f) >= 2 && f[0] != "op":
			if n, err := strconv.Atoi(f[1]); err == nil {
				counts[f[0]] = n
			}
		}
	}
	if !in {
		return nil, fmt.Errorf("rdmafs stats %s: no per-op table in:\n%s", dir, out)
	}
	return counts, nil
}

// sub returns c minus before, without zero entries.
func (c rpcCounts) sub(before rpcCounts) rpcCounts {
	d := rpcCounts{}
	for op, n := range c {
		if k := n - before[op]; k != 0 {
			d[op] = k
		}
	}
	return d
}

func (c rpcCounts) total() int {
	t := 0
	for _, n := range c {
		t += n
	}
	return t
}

// String lists the ops, most frequent first.
func (c rpcCounts) String() string {
	ops := make([]string, 0, len(c))
	for op := range c {
		ops = append(ops, op)
	}
	sort.Slice(ops, func(i, j int) bool { return c[ops[i]] > c[ops[j]] || c[ops[i]] == c[ops[j]] && ops[i] < ops[j] })
	var b strings.Builder
	for i, op := range ops {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%d", op, c[op])
	}
	return b.String()
}

// makeTree writes a tar archive of files small files in dirs directories
// (1-4 KiB each, like a source tree) and returns its path.
func makeTree(files, dirs int) (string, error) {
	f, err := os.CreateTemp("", "benchmount-tree-*.tar")
	if err != nil {
		return "", err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	data := bytes.Repeat([]byte("rdmafs small-file workload\n"), 160)
	for d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: fmt.Sprintf("tree/d%02d/", d), Mode: 0o755}); err != nil {
			return "", err
		}
	}
	for i := range files {
		n := 1024 + (i*337)%3072
		h := &tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("tree/d%02d/f%04d.c", i%dirs, i), Mode: 0o644, Size: int64(n)}
		if err := tw.WriteHeader(h); err != nil {
			return "", err
		}
		if _, err := tw.Write(data[:n]); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	return f.Name(), nil
}

// rpcStep is one measured workload: the shell command, how many entries
// it handles, and the COMPOUNDs it took.
type rpcStep struct {
	name    string
	entries int
	counts  rpcCounts
}

// measureRPCs counts the COMPOUNDs per file of tar x, ls -l and rm -rf
// through rdmafs against ganesha (serverDir is the export's directory on
// this machine). Each step runs on a fresh mount, so no cache from the
// step before helps it.
func measureRPCs(bin, source, serverDir string, opts ...string) ([]rpcStep, error) {
	const files, dirs, listed = 500, 10, 1000
	tarball, err := makeTree(files, dirs)
	if err != nil {
		return nil, err
	}
	defer os.Remove(tarball)
	work := "rpcs-" + strconv.Itoa(os.Getpid())
	// The 1000-entry directory is made on the server's side, so that
	// listing it through a fresh mount starts cold.
	lsDir := filepath.Join(serverDir, work, "ls")
	for _, d := range []string{lsDir, filepath.Join(serverDir, work, "bare")} {
		if err := os.MkdirAll(d, 0o777); err != nil {
			return nil, err
		}
	}
	for i := range listed {
		if err := os.WriteFile(filepath.Join(lsDir, fmt.Sprintf("e%04d", i)), []byte("x"), 0o644); err != nil {
			return nil, err
		}
	}
	steps := []struct {
		name    string
		entries int
		cmd     func(mnt string) *exec.Cmd
	}{
		// Without restoring times, owner and mode, tar x is create,
		// write and close only: what the Linux client's
		// OPEN+WRITE+CLOSE sets the bar for.
		{"tar x -m --no-same-owner --no-same-permissions (create+write+close)", files + dirs, func(mnt string) *exec.Cmd {
			return exec.Command("tar", "-x", "-m", "--no-same-owner", "--no-same-permissions", "-f", tarball, "-C", filepath.Join(mnt, work, "bare"))
		}},
		// As root, plain tar x also sets each file's mtime, owner and
		// mode (futimens, fchown, fchmod before close): three SETATTRs
		// of its own, which the Linux client sends too. The buffered
		// data goes out in the first one's COMPOUND, counted as WRITE.
		{"tar x (and tar's own utimes, chown, chmod)", files + dirs, func(mnt string) *exec.Cmd {
			return exec.Command("tar", "-x", "-f", tarball, "-C", filepath.Join(mnt, work))
		}},
		{"ls -l (1000 entries)", listed, func(mnt string) *exec.Cmd {
			return exec.Command("ls", "-l", filepath.Join(mnt, work, "ls"))
		}},
		{"rm -rf (tar x's tree)", files + dirs + 1, func(mnt string) *exec.Cmd {
			return exec.Command("rm", "-rf", filepath.Join(mnt, work, "tree"))
		}},
	}
	var res []rpcStep
	for _, s := range steps {
		mnt, umount, err := mountRdmafs(bin, source, opts...)
		if err != nil {
			return nil, err
		}
		before, err := readRPCCounts(bin, mnt)
		if err == nil {
			if out, cerr := s.cmd(mnt).CombinedOutput(); cerr != nil {
				err = fmt.Errorf("%s: %v: %s", s.name, cerr, out)
			}
		}
		var after rpcCounts
		if err == nil {
			after, err = readRPCCounts(bin, mnt)
		}
		umount()
		if err != nil {
			return nil, err
		}
		res = append(res, rpcStep{s.name, s.entries, after.sub(before)})
	}
	os.RemoveAll(filepath.Join(serverDir, work))
	return res, nil
}

func printRPCs(title string, steps []rpcStep) {
	fmt.Printf("\n%s\n\n| workload | entries | COMPOUNDs | per entry | by op |\n|---|---|---|---|---|\n", title)
	for _, s := range steps {
		t := s.counts.total()
		fmt.Printf("| %s | %d | %d | %.2f | %v |\n", s.name, s.entries, t, float64(t)/float64(s.entries), s.counts)
	}
}
