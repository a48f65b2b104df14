package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/test/testpeer"
)

// TestServerNICReset: the knfsd guest's network device is reset under
// two mounts, one over TCP and one over RDMA, while the RDMA mount writes
// and reads. The guest's netwatch does that when the NIC qemu emulates stops
// taking its transmit queue (test/kpeer/guest/init): first a reset of
// the transmit ring alone (ethtool -G), which keeps every connection; if
// the queue still does not move, eth0 down and up; then a driver unbind
// and bind, after which siw0 goes and a new siw link is made. The test
// takes the first and the last: the watchdog line written into the
// guest's kernel log (the way netwatch is woken by a real stall), then
// "kpeer-netreset rebind". After each, both mounts go on: data written
// through one before the reset reads back through the other after it,
// and the other way round. The ring reset keeps the RDMA connection; the
// rebind ends it, and the mount makes a new one.
func TestServerNICReset(t *testing.T) {
	k := testpeer.RequireKnfsd(t)
	if k.RunDir == "" {
		t.Fatal("the test reads the guest's console: it needs the guest the harness starts, not RDMAFS_KNFSD_TCP")
	}
	host, port := splitAddr(t, k.TCPAddr)
	rhost, rport := splitAddr(t, k.RDMAAddr)
	mt := mount(t, peer{name: "knfsd", host: host, port: port, export: "/", knfsd: k})
	mr := mount(t, peer{name: "knfsd-rdma", host: rhost, port: rport, export: "/", knfsd: k, opts: []string{"proto=rdma"}})
	dt := testDir(t, mt)
	defer os.RemoveAll(dt)
	dr := filepath.Join(mr, filepath.Base(dt))
	console := filepath.Join(k.RunDir, "serial.log")

	resets := []struct {
		name, cmd, want string
		reconnects      bool
	}{
		// What netwatch looks for, as the guest's kernel logs it. Its
		// first step is the ring reset; on e1000 that can leave the
		// transmit queue stuck until the driver's own watchdog fires,
		// and netwatch goes on to eth0 down and up: either reset is
		// what the mounts must ride through.
		{"watchdog", "echo 'kpeer test: NETDEV WATCHDOG: eth0 (e1000): transmit queue 0 timed out' > /dev/kmsg",
			"eth0 reset (", false},
		// Detached: the control shell's own connection crosses the NIC.
		{"rebind", `setsid sh -c "sleep 1; /bin/kpeer-netreset rebind >/dev/console 2>&1" </dev/null >/dev/null 2>&1 &`,
			"eth0 reset (rebind ", true},
	}
	for i, r := range resets {
		connects := rdmaConnects(t, mr)
		before, after := make([]byte, 1<<20), make([]byte, 1<<20)
		rand.Read(before)
		rand.Read(after)
		if err := os.WriteFile(filepath.Join(dt, "before"), before, 0o644); err != nil {
			t.Fatal(err)
		}
		seen := countIn(t, console, r.want)

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		// RDMA traffic in flight when the device goes: the guest's svcrdma
		// connections then have work to end before siw can let go.
		busy, stopBusy := context.WithCancel(ctx)
		busyDone := make(chan error, 1)
		go func() {
			f := filepath.Join(dr, "busy")
			for busy.Err() == nil {
				if err := os.WriteFile(f, before, 0o644); err != nil {
					busyDone <- err
					return
				}
				if _, err := os.ReadFile(f); err != nil {
					busyDone <- err
					return
				}
			}
			busyDone <- nil
		}()
		time.Sleep(2 * time.Second) // let it run
		if out, err := k.Exec(ctx, r.cmd); err != nil {
			t.Fatalf("%s: guest: %v: %s", r.name, err, out)
		}
		for deadline := time.Now().Add(2 * time.Minute); countIn(t, console, r.want) == seen; time.Sleep(500 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no %q on the guest's console two minutes later:\n%s", r.name, r.want, k.LogTail())
			}
		}
		resetLine := lastLineWith(t, console, r.want)
		t.Logf("%s: guest console: %s", r.name, resetLine)
		if !regexp.MustCompile(`link siw\d+/1 state ACTIVE .*netdev eth0 .*portlist .*rdma 20049`).MatchString(resetLine) || strings.Contains(resetLine, "LOST") {
			t.Fatalf("%s: the reset did not bring eth0, a siw link and the RDMA listener back: %s", r.name, resetLine)
		}

		stopBusy()
		select {
		case err := <-busyDone:
			if err != nil {
				t.Errorf("%s: writing and reading over RDMA during the reset: %v", r.name, err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s: a write or read over RDMA still hangs two minutes after the reset", r.name)
		}
		got, err := os.ReadFile(filepath.Join(dr, "before"))
		if err != nil || !bytes.Equal(got, before) {
			t.Fatalf("%s: reading over RDMA after the reset what TCP wrote before it: %d bytes, equal %v, %v", r.name, len(got), bytes.Equal(got, before), err)
		}
		if err := os.WriteFile(filepath.Join(dr, "after"), after, 0o644); err != nil {
			t.Fatalf("%s: writing over RDMA after the reset: %v", r.name, err)
		}
		got, err = os.ReadFile(filepath.Join(dt, "after"))
		if err != nil || !bytes.Equal(got, after) {
			t.Fatalf("%s: reading over TCP what RDMA wrote after the reset: %d bytes, equal %v, %v", r.name, len(got), bytes.Equal(got, after), err)
		}
		// The rebind ends the RDMA connection with its siw device: the
		// mount made a new one. The ring reset leaves it.
		now := rdmaConnects(t, mr)
		t.Logf("%s: RDMA connects %d before the reset, %d after", r.name, connects, now)
		if r.reconnects && now <= connects {
			t.Errorf("%s: the RDMA mount did not reconnect after reset %d: connects %d, before it %d", r.name, i+1, now, connects)
		}
		cancel()
	}
}

// rdmaConnects is the "connects:" count in rdmafs stats of the mount at mnt.
func rdmaConnects(t *testing.T, mnt string) int {
	t.Helper()
	st, _ := runBin(t, time.Minute, "stats", mnt)
	m := regexp.MustCompile(`(?m)^  connects: (\d+)`).FindStringSubmatch(st)
	if m == nil {
		t.Fatalf("no connects line in the stats of %s:\n%s", mnt, st)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func countIn(t *testing.T, file, s string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b, []byte(s))
}

func lastLineWith(t *testing.T, file, s string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return strings.TrimSpace(lines[i])
		}
	}
	return ""
}
