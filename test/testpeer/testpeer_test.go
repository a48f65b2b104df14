package testpeer

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) { Main(m) }

func TestKnfsdNull(t *testing.T) {
	k := RequireKnfsd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := NullCall(ctx, k.TCPAddr); err != nil {
		t.Fatalf("knfsd %s: %v\n%s", k.TCPAddr, err, k.LogTail())
	}
}

func TestKnfsdExec(t *testing.T) {
	k := RequireKnfsd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := k.Exec(ctx, "echo hi")
	if err != nil || out != "hi\n" {
		t.Fatalf("Exec(echo hi) = %q, %v", out, err)
	}
	// stderr is included, the exit status is reported.
	out, err = k.Exec(ctx, "echo oops >&2; exit 3")
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Status != 3 || out != "oops\n" {
		t.Fatalf("Exec(exit 3) = %q, %v; want output oops and *ExitError status 3", out, err)
	}
	// The guest exports /export as the pseudo-root; nfsd is up.
	out, err = k.Exec(ctx, "cat /export/README; cat /proc/fs/nfsd/portlist")
	if err != nil || !strings.Contains(out, "kpeer") || !strings.Contains(out, "rdma 20049") {
		t.Fatalf("Exec(README, portlist) = %q, %v", out, err)
	}
	// Concurrent calls each get their own shell.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Go(func() {
			want := strings.Repeat("x", i+1)
			out, err := k.Exec(ctx, "sleep 0.2; echo "+want)
			if err != nil || out != want+"\n" {
				errs <- errors.Join(err, errors.New("got "+out))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestGaneshaNull(t *testing.T) {
	g := RequireGanesha(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := NullCall(ctx, g.Addr); err != nil {
		t.Fatalf("ganesha %s: %v\n%s", g.Addr, err, g.LogTail())
	}
	if g.Export != "/export" {
		t.Errorf("Export = %q, want /export", g.Export)
	}
	if g.Dir != "" {
		if st, err := os.Stat(g.Dir); err != nil || !st.IsDir() {
			t.Errorf("export dir %s: %v", g.Dir, err)
		}
	}
}

// TestGaneshaStartStop checks that a private Ganesha stops cleanly and
// removes its run directory.
func TestGaneshaStartStop(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: needs NFS-Ganesha")
	}
	if os.Getenv("RDMAFS_GANESHA") != "" {
		t.Skip("RDMAFS_GANESHA set: no private server to stop")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	g, err := StartGanesha(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ganesha answered NULL %v after start", time.Since(start))
	pid := g.cmd.Process.Pid
	start = time.Now()
	if err := g.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("ganesha stopped in %v", time.Since(start))
	if processAlive(pid) {
		t.Errorf("ganesha pid %d still alive after Stop", pid)
	}
	if _, err := os.Stat(g.RunDir); !os.IsNotExist(err) && !keepRunDirs() {
		t.Errorf("run dir %s not removed: %v", g.RunDir, err)
	}
	if err := g.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestNullCallWire(t *testing.T) {
	var buf bytes.Buffer
	if err := writeNullCall(&buf, 0x01020304); err != nil {
		t.Fatal(err)
	}
	want := "80000028" + "01020304" + "00000000" + "00000002" + "000186a3" + "00000004" +
		"00000000" + "0000000000000000" + "0000000000000000"
	if got := hex.EncodeToString(buf.Bytes()); got != want {
		t.Errorf("call\n got %s\nwant %s", got, want)
	}
	for _, tc := range []struct {
		name, reply string
		ok          bool
	}{
		{"success", "80000018" + "01020304" + "00000001" + "00000000" + "0000000000000000" + "00000000", true},
		{"two fragments", "0000000c" + "01020304" + "00000001" + "00000000" + "8000000c" + "0000000000000000" + "00000000", true},
		{"wrong xid", "80000018" + "01020305" + "00000001" + "00000000" + "0000000000000000" + "00000000", false},
		{"prog unavail", "80000018" + "01020304" + "00000001" + "00000000" + "0000000000000000" + "00000001", false},
		{"denied", "80000018" + "01020304" + "00000001" + "00000001" + "0000000000000000" + "00000000", false},
		{"short", "80000008" + "01020304" + "00000001", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := hex.DecodeString(tc.reply)
			if err != nil {
				t.Fatal(err)
			}
			err = readNullReply(bytes.NewReader(b), 0x01020304)
			if (err == nil) != tc.ok {
				t.Errorf("readNullReply = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestRepoRoot(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "test", "kpeer", "run.sh")); err != nil {
		t.Errorf("repo root %s: %v", root, err)
	}
}

// recordingTB is a testing.TB that records Errorf instead of failing.
type recordingTB struct {
	testing.TB
	errs []string
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestKnfsdDiedReplaced kills the shared guest's qemu, as a guest kernel
// panic would end it, and checks that the next RequireKnfsd reports the
// death once with the dead guest's console, keeps its run directory, and
// returns a new guest that answers.
func TestKnfsdDiedReplaced(t *testing.T) {
	old := RequireKnfsd(t)
	if old.RunDir == "" {
		t.Fatal("RDMAFS_KNFSD_TCP names an outside server; this test needs the harness's own guest")
	}
	pid := old.qemuPID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); old.Alive(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("qemu %d still there a minute after SIGKILL", pid)
		}
	}
	rec := &recordingTB{TB: t}
	k := RequireKnfsd(rec)
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "died") || !strings.Contains(rec.errs[0], "serial.log") {
		t.Fatalf("RequireKnfsd after the guest died reported %q; want one error with the console", rec.errs)
	}
	if k == old || !k.Alive() {
		t.Fatalf("RequireKnfsd returned the dead guest (or one not running)")
	}
	if _, err := os.Stat(filepath.Join(old.RunDir, "serial.log")); err != nil {
		t.Errorf("the dead guest's console: %v", err)
	}
	os.RemoveAll(old.RunDir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := NullCall(ctx, k.TCPAddr); err != nil {
		t.Fatalf("the new guest: %v", err)
	}
	rec.errs = nil
	if RequireKnfsd(rec) != k || len(rec.errs) != 0 {
		t.Errorf("a live guest was replaced or reported: %q", rec.errs)
	}
}

// TestKDC gets a user a ticket from the harness's KDC with kinit, as the
// user would, and checks klist shows it for the realm; a wrong password
// is refused.
func TestKDC(t *testing.T) {
	k := RequireKDC(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := k.AddPrincipal(ctx, "kdctest", "secret-1"); err != nil {
		t.Fatal(err)
	}
	ccache := filepath.Join(t.TempDir(), "krb5cc")
	if err := k.Kinit(ctx, "kdctest", "wrong", ccache, 0); err == nil {
		t.Fatal("kinit with a wrong password worked")
	}
	if err := k.Kinit(ctx, "kdctest", "secret-1", ccache, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	out, err := k.run(ctx, "klist", "-c", "FILE:"+ccache)
	if err != nil || !strings.Contains(out, "kdctest@"+KDCRealm) || !strings.Contains(out, "krbtgt/"+KDCRealm+"@"+KDCRealm) {
		t.Fatalf("klist: %v\n%s", err, out)
	}
	keytab := filepath.Join(t.TempDir(), "keytab")
	if err := k.AddService(ctx, "nfs/kdctest.localhost", keytab); err != nil {
		t.Fatal(err)
	}
	if err := k.AddService(ctx, "nfs/kdctest.localhost", keytab); err == nil {
		t.Error("adding a principal twice worked")
	}
	out, err = k.run(ctx, "klist", "-k", keytab)
	if err != nil || !strings.Contains(out, "nfs/kdctest.localhost@"+KDCRealm) {
		t.Fatalf("klist -k: %v\n%s", err, out)
	}
}
