package ibverbs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdmafs/rdmafs/verbs"
)

// fakeSysfs writes a /sys/class/infiniband lookalike.
func fakeSysfs(t *testing.T, devs map[string][2]string) string {
	t.Helper()
	root := t.TempDir()
	for name, v := range devs { // v: node_type, port 1 state
		d := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Join(d, "ports", "1"), 0o755); err != nil {
			t.Fatal(err)
		}
		ll := "Ethernet"
		write := func(p, s string) {
			if err := os.WriteFile(p, []byte(s+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write(filepath.Join(d, "node_type"), v[0])
		write(filepath.Join(d, "ports", "1", "state"), v[1])
		write(filepath.Join(d, "ports", "1", "link_layer"), ll)
	}
	return root
}

func TestChooseDevice(t *testing.T) {
	root := fakeSysfs(t, map[string][2]string{
		"rxe0": {"1: CA", "1: DOWN"},
		"siw0": {"4: RNIC", "4: ACTIVE"},
	})
	devs, err := Devices(root)
	if err != nil || len(devs) != 2 {
		t.Fatalf("Devices = %v, %v", devs, err)
	}
	if !Available(root) || Available(filepath.Join(root, "missing")) {
		t.Fatal("Available wrong")
	}
	d, port, err := ChooseDevice(devs, "")
	if err != nil || d.Name != "siw0" || port != 1 || !d.IWARP() || d.Kind() != "iWARP" {
		t.Fatalf("auto choice = %+v %d %v", d, port, err)
	}
	if _, _, err := ChooseDevice(devs, "rxe0"); !errors.Is(err, ErrNoActivePort) {
		t.Fatalf("rxe0 (port down): %v", err)
	}
	if _, _, err := ChooseDevice(devs, "mlx5_0"); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("missing device: %v", err)
	}
	if _, _, err := ChooseDevice(nil, ""); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("no devices: %v", err)
	}
	if d := devs[0]; d.Name != "rxe0" || d.Kind() != "RoCE" {
		t.Fatalf("rxe0 = %+v kind %s", d, d.Kind())
	}
	down := fakeSysfs(t, map[string][2]string{"rxe0": {"1: CA", "1: DOWN"}})
	devs, _ = Devices(down)
	if _, _, err := ChooseDevice(devs, ""); !errors.Is(err, ErrNoActivePort) {
		t.Fatalf("all ports down: %v", err)
	}
}

func TestMapStatus(t *testing.T) {
	for _, c := range []struct {
		wc   int
		want verbs.Status
		err  error
	}{
		{wcSuccess, verbs.StatusSuccess, nil},
		{wcWRFlushErr, verbs.StatusFlushed, nil},
		{wcLocLenErr, verbs.StatusLocalLengthErr, verbs.ErrTerminated},
		{wcLocProtErr, verbs.StatusLocalProtectionErr, verbs.ErrTerminated},
		{wcRemAccessErr, verbs.StatusRemoteAccessErr, verbs.ErrTerminated},
		{wcRemOpErr, verbs.StatusRemoteOpErr, verbs.ErrTerminated},
		{wcRetryExcErr, verbs.StatusFatalErr, verbs.ErrConnectionLost},
		{wcFatalErr, verbs.StatusFatalErr, verbs.ErrConnectionLost},
	} {
		if got := mapStatus(c.wc); got != c.want {
			t.Errorf("mapStatus(%d) = %v, want %v", c.wc, got, c.want)
		}
		err := statusError(c.wc, verbs.OpSend)
		if (c.err == nil) != (err == nil) || (c.err != nil && !errors.Is(err, c.err)) {
			t.Errorf("statusError(%d) = %v, want %v", c.wc, err, c.err)
		}
	}
}

func TestCMError(t *testing.T) {
	for _, c := range []struct {
		ev, status int
		want       error
	}{
		{cmEstablished, 0, nil},
		{cmRejected, 8, ErrUnreachable},    // RoCE: nobody listens
		{cmRejected, -111, ErrUnreachable}, // iWARP: ECONNREFUSED
		{cmRejected, 28, verbs.ErrRejected},
		{cmUnreachable, -110, ErrUnreachable},
		{cmAddrError, -113, ErrUnreachable},
		{cmConnectError, -104, verbs.ErrConnectionLost},
		{cmDisconnected, 0, verbs.ErrConnectionLost},
		{cmTimewaitExit, 0, verbs.ErrConnectionLost},
	} {
		err := cmError(c.ev, c.status, cmEstablished)
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("cmError(%s, %d) = %v, want %v", cmName(c.ev), c.status, err, c.want)
		}
	}
}

func TestCheckWR(t *testing.T) {
	mr := new(verbs.MemoryRegion) // only compared against nil
	sge := verbs.SGE{MR: mr, Length: 10}
	for _, c := range []struct {
		name string
		wr   verbs.SendWR
		ok   bool
	}{
		{"send", verbs.SendWR{Opcode: verbs.OpSend, SGL: []verbs.SGE{sge}}, true},
		{"empty send", verbs.SendWR{Opcode: verbs.OpSend}, true},
		{"read", verbs.SendWR{Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{sge}, Length: 10}, true},
		{"read length mismatch", verbs.SendWR{Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{sge}, Length: 11}, false},
		{"read without sink", verbs.SendWR{Opcode: verbs.OpRDMARead}, false},
		{"recv opcode", verbs.SendWR{Opcode: verbs.OpRecv}, false},
		{"nil MR", verbs.SendWR{Opcode: verbs.OpSend, SGL: []verbs.SGE{{Length: 1}}}, false},
		{"too many SGEs", verbs.SendWR{Opcode: verbs.OpRDMAWrite, SGL: []verbs.SGE{sge, sge, sge}}, false},
		{"two-element Write", verbs.SendWR{Opcode: verbs.OpRDMAWrite, SGL: []verbs.SGE{sge, sge}}, true},
		{"two-element Read sink (iWARP: one)", verbs.SendWR{Opcode: verbs.OpRDMARead, SGL: []verbs.SGE{sge, sge}, Length: 20}, false},
	} {
		err := checkSend(&c.wr, 2, 1)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, verbs.ErrInvalidWR)) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	if err := checkRecv(&verbs.RecvWR{SGL: []verbs.SGE{sge, sge, sge}}, 2); !errors.Is(err, verbs.ErrInvalidWR) {
		t.Errorf("recv too many SGEs: %v", err)
	}
	if err := checkRecv(&verbs.RecvWR{SGL: []verbs.SGE{{}}}, 2); !errors.Is(err, verbs.ErrInvalidWR) {
		t.Errorf("recv nil MR: %v", err)
	}
}

func TestCheckSlab(t *testing.T) {
	pg := uintptr(os.Getpagesize())
	if err := checkSlab(4*pg, 8*int(pg)); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][2]uintptr{{4*pg + 16, pg}, {4 * pg, 100}, {4 * pg, 0}} {
		if err := checkSlab(c[0], int(c[1])); !errors.Is(err, ErrNotSlab) {
			t.Errorf("checkSlab(%#x, %d) = %v", c[0], c[1], err)
		}
	}
	if err := sgeRange(10, 10, 20); err != nil {
		t.Fatal(err)
	}
	if err := sgeRange(11, 10, 20); !errors.Is(err, verbs.ErrBounds) {
		t.Fatal(err)
	}
	if err := sgeRange(21, 0, 20); !errors.Is(err, verbs.ErrBounds) {
		t.Fatal(err)
	}
}

func TestOpenNoDevice(t *testing.T) {
	if Available(SysfsRoot) {
		t.Skip("this machine has an RDMA device")
	}
	_, err := Open("")
	if !errors.Is(err, ErrNoDevice) && !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Open without devices: %v", err)
	}
}
