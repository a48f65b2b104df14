package testpeer

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// KDC is an MIT Kerberos KDC (krb5kdc) for a private realm, listening on
// a loopback port, with its database, configuration and log in a run
// directory of its own. Tests add principals, write keytabs and get
// tickets with kinit exactly as an administrator and a user would.
type KDC struct {
	Realm  string // "RDMAFS.TEST"
	Addr   string // "127.0.0.1:port", UDP and TCP
	RunDir string
	// Config is the krb5.conf of the realm (KRB5_CONFIG for clients and
	// servers); KDCProfile is the KDC's kdc.conf (KRB5_KDC_PROFILE).
	Config, KDCProfile string

	cmd      *exec.Cmd
	exited   chan struct{}
	stopOnce sync.Once
	stopErr  error
}

// KDCRealm is the realm of every KDC the harness starts.
const KDCRealm = "RDMAFS.TEST"

const kdcConf = `[kdcdefaults]
	kdc_listen = 127.0.0.1:%[1]d
	kdc_tcp_listen = 127.0.0.1:%[1]d
[realms]
	%[2]s = {
		database_name = %[3]s/principal
		key_stash_file = %[3]s/stash
		acl_file = %[3]s/kadm5.acl
		max_life = 10h
		max_renewable_life = 7d
		supported_enctypes = aes256-cts-hmac-sha1-96:normal aes128-cts-hmac-sha1-96:normal aes256-cts-hmac-sha384-192:normal aes128-cts-hmac-sha256-128:normal
	}
`

const krb5Conf = `[libdefaults]
	default_realm = %[2]s
	dns_lookup_kdc = false
	dns_lookup_realm = false
	rdns = false
	ignore_acceptor_hostname = true
	permitted_enctypes = aes256-cts-hmac-sha1-96 aes128-cts-hmac-sha1-96 aes256-cts-hmac-sha384-192 aes128-cts-hmac-sha256-128
[realms]
	%[2]s = {
		kdc = 127.0.0.1:%[1]d
	}
[domain_realm]
	localhost = %[2]s
	.localhost = %[2]s
[logging]
	kdc = FILE:%[3]s/kdc.log
`

// kdcBinary finds one of MIT Kerberos's programs (Debian krb5-kdc,
// krb5-admin-server, krb5-user: scripts/deps.sh installs them).
func kdcBinary(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/usr/bin"} {
		if p := filepath.Join(dir, name); fileExists(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found (install krb5-kdc krb5-admin-server krb5-user: scripts/deps.sh)", name)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// StartKDC creates a realm database in a fresh run directory and runs
// krb5kdc for it in the foreground on a free loopback port, returning
// once the KDC answers: a kinit of a principal made for the purpose
// works.
func StartKDC(ctx context.Context) (*KDC, error) {
	var lastErr error
	for attempt := 0; attempt < startAttempts; attempt++ {
		k, err := startKDCOnce(ctx)
		if err == nil {
			return k, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

func startKDCOnce(ctx context.Context) (*KDC, error) {
	kdcBin, err := kdcBinary("krb5kdc")
	if err != nil {
		return nil, fmt.Errorf("testpeer: kdc: %w", err)
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	runDir, err := newRunDir("kdc")
	if err != nil {
		return nil, err
	}
	k := &KDC{
		Realm:      KDCRealm,
		Addr:       loopback(ports[0]),
		RunDir:     runDir,
		Config:     filepath.Join(runDir, "krb5.conf"),
		KDCProfile: filepath.Join(runDir, "kdc.conf"),
	}
	fail := func(err error) (*KDC, error) {
		_ = k.stop(false)
		return nil, fmt.Errorf("testpeer: kdc (run directory %s kept): %w\n%s", runDir, err, k.LogTail())
	}
	for name, text := range map[string]string{
		k.Config:                           fmt.Sprintf(krb5Conf, ports[0], k.Realm, runDir),
		k.KDCProfile:                       fmt.Sprintf(kdcConf, ports[0], k.Realm, runDir),
		filepath.Join(runDir, "kadm5.acl"): "",
	} {
		if err := os.WriteFile(name, []byte(text), 0o600); err != nil {
			return fail(err)
		}
	}
	// The master key is random and stays in the stash file: nobody types
	// it.
	if _, err := k.run(ctx, "kdb5_util", "-r", k.Realm, "create", "-s", "-P", randomPassword()); err != nil {
		return fail(err)
	}
	out, err := os.Create(filepath.Join(runDir, "krb5kdc.out"))
	if err != nil {
		return fail(err)
	}
	defer out.Close()
	cmd := exec.Command(kdcBin, "-n", "-r", k.Realm, "-P", filepath.Join(runDir, "krb5kdc.pid"))
	cmd.Env = append(os.Environ(), k.Env()...)
	cmd.Dir = runDir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("start %s: %w", kdcBin, err))
	}
	k.cmd, k.exited = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(k.exited)
	}()
	if err := k.waitReady(ctx); err != nil {
		return fail(err)
	}
	return k, nil
}

// waitReady waits until a kinit against the KDC works.
func (k *KDC) waitReady(ctx context.Context) error {
	const probe = "testpeer-probe"
	pw := randomPassword()
	if err := k.AddPrincipal(ctx, probe, pw); err != nil {
		return err
	}
	ccache := filepath.Join(k.RunDir, "probe.ccache")
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := k.Kinit(ctx, probe, pw, ccache, 0)
		if err == nil {
			return os.Remove(ccache)
		}
		select {
		case <-k.exited:
			return fmt.Errorf("krb5kdc exited: %w", err)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the KDC does not answer: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Env returns the environment that points MIT Kerberos's programs, and
// servers such as ganesha, at this realm.
func (k *KDC) Env() []string {
	return []string{"KRB5_CONFIG=" + k.Config, "KRB5_KDC_PROFILE=" + k.KDCProfile, "KRB5RCACHETYPE=none"}
}

// run runs one of Kerberos's programs with the realm's environment.
func (k *KDC) run(ctx context.Context, name string, args ...string) (string, error) {
	return k.runInput(ctx, "", name, args...)
}

func (k *KDC) runInput(ctx context.Context, stdin, name string, args ...string) (string, error) {
	bin, err := kdcBinary(name)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), k.Env()...)
	cmd.Dir = k.RunDir
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// kadmin runs one kadmin.local query on the realm's database.
func (k *KDC) kadmin(ctx context.Context, query string) error {
	out, err := k.run(ctx, "kadmin.local", "-r", k.Realm, "-q", query)
	if err != nil {
		return err
	}
	// kadmin.local exits 0 whatever the query did; its errors are
	// printed, "add_principal: Principal or policy already exists while
	// creating ...".
	if strings.Contains(out, " while ") {
		return fmt.Errorf("kadmin.local %q: %s", query, strings.TrimSpace(out))
	}
	return nil
}

// AddPrincipal adds a principal with a password (a user).
func (k *KDC) AddPrincipal(ctx context.Context, name, password string) error {
	return k.kadmin(ctx, fmt.Sprintf("addprinc -pw %s %s", password, name))
}

// AddService adds a principal with a random key (a service or a
// machine, "nfs/localhost", "host/localhost") and writes its keys to the
// keytab at path, which is created or added to.
func (k *KDC) AddService(ctx context.Context, name, keytab string) error {
	if err := k.kadmin(ctx, "addprinc -randkey "+name); err != nil {
		return err
	}
	return k.kadmin(ctx, fmt.Sprintf("ktadd -k %s %s", keytab, name))
}

// Kinit gets principal a ticket-granting ticket into the FILE ticket
// cache ccache, as the user would with kinit; lifetime 0 is the realm's
// default.
func (k *KDC) Kinit(ctx context.Context, principal, password, ccache string, lifetime time.Duration) error {
	args := []string{"-c", "FILE:" + ccache}
	if lifetime > 0 {
		args = append(args, "-l", fmt.Sprintf("%ds", int(lifetime.Seconds())))
	}
	args = append(args, principal)
	_, err := k.runInput(ctx, password+"\n", "kinit", args...)
	return err
}

// LogTail returns the last lines of the KDC's log and output.
func (k *KDC) LogTail() string {
	return tail(30, filepath.Join(k.RunDir, "kdc.log"), filepath.Join(k.RunDir, "krb5kdc.out"))
}

// Stop kills krb5kdc and removes the run directory unless
// RDMAFS_TESTPEER_KEEP=1. It is idempotent.
func (k *KDC) Stop() error {
	k.stopOnce.Do(func() { k.stopErr = k.stop(!keepRunDirs()) })
	return k.stopErr
}

func (k *KDC) stop(removeRunDir bool) error {
	var err error
	if k.cmd != nil && k.cmd.Process != nil {
		if kerr := killAndWait(k.cmd.Process.Pid, 5*time.Second, k.exited); kerr != nil {
			err = fmt.Errorf("testpeer: kdc stop: %w", kerr)
		}
	}
	if err == nil && removeRunDir {
		_ = os.RemoveAll(k.RunDir)
	}
	return err
}

// randomPassword returns a password nobody needs to know.
func randomPassword() string {
	return rand.Text()
}
