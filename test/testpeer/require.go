package testpeer

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Start timeouts used by RequireKnfsd and RequireGanesha. The knfsd one
// covers a first-time guest build (package downloads, siw compile).
const (
	knfsdStartTimeout   = 15 * time.Minute
	ganeshaStartTimeout = time.Minute
)

// shared holds the servers started by Require* in this test binary.
var shared struct {
	knfsdMu     sync.Mutex // held while the shared guest starts
	knfsd       *Knfsd
	knfsdErr    error
	ganeshaOnce sync.Once
	ganesha     *Ganesha
	ganeshaErr  error
	kdcOnce     sync.Once
	kdc         *KDC
	kdcErr      error
	krbOnce     sync.Once
	krb         *Kerberos
	krbErr      error

	mu       sync.Mutex
	stopping bool
	stops    []func() error
}

var stopAllMu sync.Mutex

// register records a server's Stop for StopAll. It reports false (and the
// caller must stop the server itself) when StopAll already ran.
func register(stop func() error) bool {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.stopping {
		return false
	}
	shared.stops = append(shared.stops, stop)
	return true
}

// RequireKnfsd returns the knfsd shared by all tests of this test binary,
// starting it on first use; concurrent calls wait for the same start. It
// skips the test in -short mode and fails it (with the server's log tail)
// if the server cannot be started.
//
// A shared guest whose qemu has gone (a guest kernel panic ends qemu:
// panic=-1, -no-reboot) fails the test that finds it so, with the dead
// guest's console, and is replaced by a new one for this test and the
// ones after it: a crashed server is reported once, loudly, instead of
// as every later test's "connection refused". The dead guest's run
// directory is kept.
func RequireKnfsd(t testing.TB) *Knfsd {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs knfsd (qemu guest from test/kpeer); skipped in -short mode")
	}
	k, died, err := sharedKnfsd()
	if died != "" {
		t.Errorf("integration test: the shared knfsd guest died under an earlier test; a new one serves this test and the ones after it.\n%s", died)
	}
	if err != nil {
		t.Fatalf("integration test: cannot start knfsd: %v", err)
	}
	return k
}

// sharedKnfsd returns the shared guest, starting it if there is none or
// the one there was has died; died then describes the dead one.
func sharedKnfsd() (k *Knfsd, died string, err error) {
	shared.knfsdMu.Lock()
	defer shared.knfsdMu.Unlock()
	if old := shared.knfsd; old != nil && !old.Alive() {
		died = fmt.Sprintf("Its qemu has exited; run directory %s kept.\n%s", old.RunDir, old.LogTail())
		old.stopOnce.Do(func() { old.stopErr = old.stop(false) })
		shared.knfsd = nil
	}
	if shared.knfsd == nil && shared.knfsdErr == nil {
		ctx, cancel := context.WithTimeout(context.Background(), knfsdStartTimeout)
		defer cancel()
		k, err := StartKnfsd(ctx, KnfsdOptions{})
		if err == nil && !register(k.Stop) {
			_ = k.Stop()
			k, err = nil, errors.New("testpeer: stopping")
		}
		shared.knfsd, shared.knfsdErr = k, err
	}
	return shared.knfsd, died, shared.knfsdErr
}

// RequireKDC returns the Kerberos KDC shared by all tests of this test
// binary, starting it on first use. It skips the test in -short mode and
// fails it if the KDC cannot be started.
func RequireKDC(t testing.TB) *KDC {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs an MIT Kerberos KDC (krb5kdc); skipped in -short mode")
	}
	shared.kdcOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		k, err := StartKDC(ctx)
		if err == nil && !register(k.Stop) {
			_ = k.Stop()
			k, err = nil, errors.New("testpeer: stopping")
		}
		shared.kdc, shared.kdcErr = k, err
	})
	if shared.kdcErr != nil {
		t.Fatalf("integration test: cannot start the KDC: %v", shared.kdcErr)
	}
	return shared.kdc
}

// Kerberos is the realm the Kerberos tests of a test binary share: the
// KDC, the keytab of the NFS service nfs/localhost, and a ganesha that
// serves the export with krb5, krb5i and krb5p under that keytab.
type Kerberos struct {
	KDC     *KDC
	Keytab  string
	Ganesha *Ganesha
}

// RequireKerberos returns the shared Kerberos realm and its ganesha,
// starting them on first use.
func RequireKerberos(t testing.TB) *Kerberos {
	t.Helper()
	kdc := RequireKDC(t)
	shared.krbOnce.Do(func() {
		shared.krb, shared.krbErr = startKerberos(kdc)
	})
	if shared.krbErr != nil {
		t.Fatalf("integration test: cannot start the Kerberos ganesha: %v", shared.krbErr)
	}
	return shared.krb
}

func startKerberos(kdc *KDC) (*Kerberos, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	keytab := filepath.Join(kdc.RunDir, "nfs.keytab")
	if err := kdc.AddService(ctx, "nfs/localhost", keytab); err != nil {
		return nil, err
	}
	g, err := StartGaneshaWith(ctx, GaneshaOptions{Krb5: &GaneshaKrb5{Keytab: keytab, Env: kdc.Env()}})
	if err != nil {
		return nil, err
	}
	if !register(g.Stop) {
		_ = g.Stop()
		return nil, errors.New("testpeer: stopping")
	}
	return &Kerberos{KDC: kdc, Keytab: keytab, Ganesha: g}, nil
}

// RequireGanesha returns the NFS-Ganesha server shared by all tests of this
// test binary, starting it on first use; concurrent calls wait for the same
// start. It skips the test in -short mode and fails it (with the server's
// log tail) if the server cannot be started.
func RequireGanesha(t testing.TB) *Ganesha {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs NFS-Ganesha (ganesha.nfsd, run as root); skipped in -short mode")
	}
	g, err := SharedGanesha()
	if err != nil {
		t.Fatalf("integration test: cannot start ganesha: %v", err)
	}
	return g
}

// SharedGanesha is RequireGanesha outside a test: a TestMain that needs
// the server for its examples calls it before Main, which stops it.
func SharedGanesha() (*Ganesha, error) {
	shared.ganeshaOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), ganeshaStartTimeout)
		defer cancel()
		g, err := StartGanesha(ctx)
		if err == nil && !register(g.Stop) {
			_ = g.Stop()
			g, err = nil, errors.New("testpeer: stopping")
		}
		shared.ganesha, shared.ganeshaErr = g, err
	})
	return shared.ganesha, shared.ganeshaErr
}

// StopAll stops every server started by RequireKnfsd and RequireGanesha in
// this test binary, and any knfsd still booting in StartKnfsd; later
// Require* calls fail. Main calls it.
func StopAll() error {
	// Serialize: a second caller (Main after m.Run while the signal handler
	// is stopping servers) must not exit before the first one is done.
	stopAllMu.Lock()
	defer stopAllMu.Unlock()
	shared.mu.Lock()
	shared.stopping = true
	stops := shared.stops
	shared.stops = nil
	shared.mu.Unlock()
	var errs []error
	startingKnfsd.Range(func(k, _ any) bool {
		errs = append(errs, k.(*Knfsd).stop(!keepRunDirs()))
		return true
	})
	for i := len(stops) - 1; i >= 0; i-- {
		errs = append(errs, stops[i]())
	}
	return errors.Join(errs...)
}

// Main is the body of TestMain in packages with integration tests:
//
//	func TestMain(m *testing.M) { testpeer.Main(m) }
//
// It parses flags, runs the tests, stops every server started by
// RequireKnfsd/RequireGanesha and exits with the tests' status. On SIGINT
// or SIGTERM it stops the servers and exits too.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main without the exit: it returns the exit code.
func Run(m *testing.M) int {
	flag.Parse()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		fmt.Fprintf(os.Stderr, "testpeer: %v: stopping test servers\n", sig)
		if err := StopAll(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		os.Exit(128 + int(sig.(syscall.Signal)))
	}()
	code := m.Run()
	signal.Stop(sigs)
	if err := StopAll(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
