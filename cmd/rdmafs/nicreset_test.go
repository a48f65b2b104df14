package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/testpeer"
)

// TestServerNICReset: the knfsd guest's network device is reset (driver
// unbind and bind) under two mounts, one over TCP and one over RDMA: the
// guest's netwatch does that when qemu's virtio-net stops taking its
// transmit queue (test/kpeer/guest/init). The RDMA device on the NIC
// (siw) goes away with it, while the RDMA mount writes and reads, and
// comes back. Both mounts go on: data
// written through one before the reset reads back through the other
// after it, and the other way round.
func TestServerNICReset(t *testing.T) {
	k := testpeer.RequireKnfsd(t)
	host, port := splitAddr(t, k.TCPAddr)
	rhost, rport := splitAddr(t, k.RDMAAddr)
	mt := mount(t, peer{name: "knfsd", host: host, port: port, export: "/", knfsd: k})
	mr := mount(t, peer{name: "knfsd-rdma", host: rhost, port: rport, export: "/", knfsd: k, opts: []string{"proto=rdma"}})
	dt := testDir(t, mt)
	defer os.RemoveAll(dt)
	dr := filepath.Join(mr, filepath.Base(dt))
	before, after := make([]byte, 1<<20), make([]byte, 1<<20)
	rand.Read(before)
	rand.Read(after)
	if err := os.WriteFile(filepath.Join(dt, "before"), before, 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
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
	// What netwatch looks for, as the guest's kernel logs it.
	if out, err := k.Exec(ctx, "echo 'kpeer test: NETDEV WATCHDOG: eth0 (virtio_net): transmit queue 0 timed out' > /dev/kmsg"); err != nil {
		t.Fatalf("guest: %v: %s", err, out)
	}
	var console string
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		console = k.LogTail()
		if strings.Contains(console, "netwatch: ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no netwatch reset two minutes after the watchdog message; console:\n%s", console)
		}
	}
	if !strings.Contains(console, "eth0 reset (") || !strings.Contains(console, "siw0") || !strings.Contains(console, "rdma 20049") {
		t.Fatalf("the reset did not bring eth0, siw0 and the RDMA listener back; console:\n%s", console)
	}

	stopBusy()
	if err := <-busyDone; err != nil {
		t.Errorf("writing and reading over RDMA during the reset: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(dr, "before"))
	if err != nil || !bytes.Equal(got, before) {
		t.Fatalf("reading over RDMA after the reset what TCP wrote before it: %d bytes, equal %v, %v", len(got), bytes.Equal(got, before), err)
	}
	if err := os.WriteFile(filepath.Join(dr, "after"), after, 0o644); err != nil {
		t.Fatalf("writing over RDMA after the reset: %v", err)
	}
	got, err = os.ReadFile(filepath.Join(dt, "after"))
	if err != nil || !bytes.Equal(got, after) {
		t.Fatalf("reading over TCP what RDMA wrote after the reset: %d bytes, equal %v, %v", len(got), bytes.Equal(got, after), err)
	}
	if out, err := k.Exec(ctx, "cat /proc/fs/nfsd/portlist; rdma link show"); err != nil || !strings.Contains(out, "siw0") {
		t.Errorf("guest after the reset: %v: %s", err, out)
	}
	for _, l := range strings.Split(console, "\n") {
		if strings.Contains(l, "netwatch: ") {
			t.Logf("guest console: %s", strings.TrimSpace(l))
		}
	}
	// The RDMA connection died with the guest's siw device: the
	// mount made a new one.
	st, _ := runBin(t, time.Minute, "stats", mr)
	if !regexp.MustCompile(`(?m)^  connects: ([2-9]|\d\d)`).MatchString(st) {
		t.Errorf("the RDMA mount did not reconnect after the reset:\n%s", st)
	}
}
