package krb5

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jcmturner/gokrb5/v8/client"
	"github.com/jcmturner/gokrb5/v8/config"
	"github.com/jcmturner/gokrb5/v8/credentials"
	"github.com/jcmturner/gokrb5/v8/keytab"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// Users finds each user's Kerberos credentials the way rpc.gssd does for
// the Linux client (rpc.gssd(8)): root gets the machine's, from the
// keytab; any other user the ticket cache kinit left, a file named
// krb5cc_UID (or krb5cc_UID_*) in one of CCacheDirs owned by that user.
// It is an nfsclient.GSSSource.
type Users struct {
	// Config is the krb5.conf; "" means $KRB5_CONFIG, else
	// /etc/krb5.conf.
	Config string
	// Keytab holds the machine's keys; "" means $KRB5_KTNAME, else
	// /etc/krb5.keytab.
	Keytab string
	// Hostname is this machine's name in the keytab's principals; ""
	// means os.Hostname.
	Hostname string
	// Service is the server's principal, "nfs/server.example.com".
	Service string
	// CCache, if set, is the ticket cache of every user's calls (a
	// program with one identity: nfs.Options.CCache); the search
	// below is then skipped.
	CCache string
	// Self makes every call use the process's own user's credentials,
	// whoever it is made for: a mount by an ordinary user, who can
	// read no one else's, or a program. Its ticket cache is CCache,
	// else $KRB5CCNAME's FILE cache, else found as for any user.
	Self bool
	// CCacheDirs are searched for users' ticket caches, "UID" in a
	// directory's name standing for the user's (rpc.gssd -d); nil
	// means /tmp and /run/user/UID, rpc.gssd's default.
	CCacheDirs []string
}

// maxCCache bounds a ticket cache read: a few tickets are a few KiB.
const maxCCache = 1 << 20

// Mechanism returns a Kerberos V5 mechanism for uid toward u.Service.
func (u *Users) Mechanism(ctx context.Context, uid uint32) (oncrpc.GSSMechanism, error) {
	cfg, err := config.Load(u.config())
	if err != nil {
		return nil, fmt.Errorf("krb5: %s: %w", u.config(), err)
	}
	var cl *client.Client
	var end time.Time // the ticket-granting ticket's, when a cache says it
	ccache := u.CCache
	if u.Self {
		uid = uint32(os.Getuid())
		if ccache == "" {
			ccache = envCCache()
		}
	}
	switch {
	case ccache != "":
		cl, end, err = u.file(cfg, ccache)
	case uid == 0:
		cl, err = u.machine(cfg)
	default:
		cl, end, err = u.user(cfg, uid)
	}
	if err != nil {
		return nil, err
	}
	m := NewInitiator(cl, u.Service)
	m.notAfter = end
	return m, nil
}

// envCCache is $KRB5CCNAME's FILE ticket cache, or "".
func envCCache() string {
	name := os.Getenv("KRB5CCNAME")
	if path, ok := strings.CutPrefix(name, "FILE:"); ok {
		return path
	}
	if strings.Contains(name, ":") {
		return "" // DIR:, KEYRING:, KCM: are not read
	}
	return name
}

func (u *Users) config() string {
	if u.Config != "" {
		return u.Config
	}
	if p := os.Getenv("KRB5_CONFIG"); p != "" {
		return p
	}
	return "/etc/krb5.conf"
}

// machine logs in with the keytab's key of the first principal of this
// host in rpc.gssd's order: HOST$, root/HOST, nfs/HOST, host/HOST.
func (u *Users) machine(cfg *config.Config) (*client.Client, error) {
	path := u.Keytab
	if path == "" {
		path = strings.TrimPrefix(os.Getenv("KRB5_KTNAME"), "FILE:")
	}
	if path == "" {
		path = "/etc/krb5.keytab"
	}
	kt, err := keytab.Load(path)
	if err != nil {
		return nil, fmt.Errorf("krb5: machine keytab %s: %w", path, err)
	}
	host := u.Hostname
	if host == "" {
		if host, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("krb5: hostname: %w", err)
		}
	}
	short, _, _ := strings.Cut(host, ".")
	for _, want := range []string{strings.ToUpper(short) + "$", "root/" + host, "nfs/" + host, "host/" + host} {
		for _, e := range kt.Entries {
			if strings.Join(e.Principal.Components, "/") != want {
				continue
			}
			cl := client.NewWithKeytab(want, e.Principal.Realm, kt, cfg, client.DisablePAFXFAST(true))
			if err := cl.Login(); err != nil {
				return nil, fmt.Errorf("krb5: machine credentials %s@%s: %w", want, e.Principal.Realm, err)
			}
			return cl, nil
		}
	}
	return nil, fmt.Errorf("krb5: keytab %s has no key for %s (as root/, nfs/ or host/%s)", path, host, host)
}

// file reads the ticket cache at path.
func (u *Users) file(cfg *config.Config, path string) (*client.Client, time.Time, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("%w: %w", ErrNoCCache, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCCache+1))
	if err != nil || len(b) > maxCCache {
		return nil, time.Time{}, fmt.Errorf("krb5: ticket cache %s: unreadable or larger than %d bytes (%v)", path, maxCCache, err)
	}
	return fromCCache(cfg, b, path)
}

// user reads uid's newest ticket cache.
func (u *Users) user(cfg *config.Config, uid uint32) (*client.Client, time.Time, error) {
	dirs := u.CCacheDirs
	if dirs == nil {
		dirs = []string{"/tmp", "/run/user/UID"}
	}
	id := strconv.FormatUint(uint64(uid), 10)
	dirs = slices.Clone(dirs) // the caller's stays as it is
	for i, d := range dirs {
		dirs[i] = strings.ReplaceAll(d, "UID", id)
	}
	b, path, err := newestCCache(dirs, uid)
	if err != nil {
		return nil, time.Time{}, err
	}
	return fromCCache(cfg, b, path)
}

// fromCCache returns a client with the credentials in the ticket cache b
// read from path, and when its ticket-granting ticket ends (the tickets
// got from it end no later).
func fromCCache(cfg *config.Config, b []byte, path string) (*client.Client, time.Time, error) {
	cc, err := parseCCache(b)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("krb5: ticket cache %s: %w", path, err)
	}
	cl, err := client.NewFromCCache(cc, cfg, client.DisablePAFXFAST(true))
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("krb5: ticket cache %s: %w", path, err)
	}
	var end time.Time
	for _, c := range cc.Credentials {
		if n := c.Server.PrincipalName.NameString; len(n) > 0 && n[0] == "krbtgt" {
			end = c.EndTime
		}
	}
	return cl, end, nil
}

// ErrNoCCache is returned for a user with no ticket cache of their own.
var ErrNoCCache = errors.New("krb5: no ticket cache")

// newestCCache returns the content of the newest ticket cache of uid in
// dirs. Another user can create files in /tmp: only a regular file
// owned by uid, not a link, is taken, and it is checked on the file
// opened.
func newestCCache(dirs []string, uid uint32) ([]byte, string, error) {
	prefix := "krb5cc_" + strconv.FormatUint(uint64(uid), 10)
	var best []byte
	var bestPath string
	var bestTime int64
	for _, dir := range dirs {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			name := e.Name()
			if name != prefix && !strings.HasPrefix(name, prefix+"_") {
				continue
			}
			path := filepath.Join(dir, name)
			b, mtime, err := readOwned(path, uid)
			if err != nil || mtime <= bestTime {
				continue
			}
			best, bestPath, bestTime = b, path, mtime
		}
	}
	if best == nil {
		return nil, "", fmt.Errorf("%w for uid %d in %s", ErrNoCCache, uid, strings.Join(dirs, ", "))
	}
	return best, bestPath, nil
}

// readOwned reads the regular file at path if uid owns it, with its
// modification time.
func readOwned(path string, uid uint32) ([]byte, int64, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.Mode().IsRegular() || st.Uid != uid {
		return nil, 0, fmt.Errorf("krb5: %s: not a regular file of uid %d", path, uid)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxCCache+1))
	if err != nil {
		return nil, 0, err
	}
	if len(b) > maxCCache {
		return nil, 0, fmt.Errorf("krb5: %s: larger than %d bytes", path, maxCCache)
	}
	return b, fi.ModTime().UnixNano(), nil
}

// parseCCache decodes a ticket cache file. The user it belongs to wrote
// it, and the mount reads it as root: a cache gokrb5's decoder panics on
// is an error, not the end of the mount.
func parseCCache(b []byte) (cc *credentials.CCache, err error) {
	defer func() {
		if r := recover(); r != nil {
			cc, err = nil, fmt.Errorf("malformed ticket cache (%v)", r)
		}
	}()
	if err := checkCCache(b); err != nil {
		return nil, err
	}
	cc = new(credentials.CCache)
	if err := cc.Unmarshal(b); err != nil {
		return nil, err
	}
	return cc, nil
}

// checkCCache walks a version 4 ticket cache (MIT krb5's ccache file
// format, what kinit writes) checking every length and count against
// the bytes left, so that the decoder, which sizes its lists by the
// counts it reads, allocates no more than the file holds.
func checkCCache(b []byte) error {
	r := ccReader{b: b}
	if r.u8() != 5 || r.u8() != 4 {
		return errors.New("not a version 4 ticket cache")
	}
	// The header's tags (tag, length, value) must fill it exactly, or
	// the decoder, which reads tags while its offset is below the
	// header's length, would go on from elsewhere than checked here.
	h := ccReader{b: r.skip(int(r.u16()))}
	for h.err == nil && len(h.b) > 0 {
		h.skip(2)
		h.skip(int(h.u16()))
	}
	if h.err != nil {
		return fmt.Errorf("ticket cache header: %w", h.err)
	}
	r.principal() // the default principal
	for r.err == nil && len(r.b) > 0 {
		r.principal()       // client
		r.principal()       // server
		r.skip(2)           // key type
		r.data()            // key
		r.skip(4*4 + 1 + 4) // times, is_skey, flags
		for range r.count(6) {
			r.skip(2) // address type
			r.data()
		}
		for range r.count(6) {
			r.skip(2) // authorization data type
			r.data()
		}
		r.data() // ticket
		r.data() // second ticket
	}
	return r.err
}

// ccReader reads a ticket cache's fields; the first short read sets err
// and every read after it yields nothing.
type ccReader struct {
	b   []byte
	err error
}

func (r *ccReader) skip(n int) []byte {
	if r.err != nil || n < 0 || n > len(r.b) {
		if r.err == nil {
			r.err = errors.New("ticket cache truncated or a length past its end")
		}
		return make([]byte, max(n, 0))
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *ccReader) u8() byte    { return r.skip(1)[0] }
func (r *ccReader) u16() uint16 { v := r.skip(2); return uint16(v[0])<<8 | uint16(v[1]) }
func (r *ccReader) u32() uint32 {
	v := r.skip(4)
	return uint32(v[0])<<24 | uint32(v[1])<<16 | uint32(v[2])<<8 | uint32(v[3])
}

// count reads a count of items each at least least bytes long.
func (r *ccReader) count(least int) int {
	n := r.u32()
	if r.err == nil && uint64(n)*uint64(least) > uint64(len(r.b)) {
		r.err = fmt.Errorf("ticket cache: a count of %d past its end", n)
	}
	if r.err != nil {
		return 0
	}
	return int(n)
}

func (r *ccReader) data() { r.skip(r.count(1)) }

func (r *ccReader) principal() {
	r.skip(4) // name type
	n := r.count(4)
	r.data() // realm
	for range n {
		r.data()
	}
}
