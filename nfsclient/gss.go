package nfsclient

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rdmafs/rdmafs/internal/lru"
	"github.com/rdmafs/rdmafs/oncrpc"
)

// Security is the flavor calls on files are made with: nfs(5)'s sec=.
type Security int

// The flavors of nfs(5) sec= that rdmafs speaks.
const (
	SecSys   Security = iota // AUTH_SYS: the server believes the uid sent
	SecKrb5                  // RPCSEC_GSS Kerberos V5, authentication only
	SecKrb5i                 // and a checksum of every call and reply
	SecKrb5p                 // and every call and reply encrypted
)

// ParseSecurity parses a sec= value: sys, krb5, krb5i or krb5p.
func ParseSecurity(s string) (Security, error) {
	for sec, name := range securityNames {
		if s == name {
			return Security(sec), nil
		}
	}
	return 0, fmt.Errorf("sec=%s: want sys, krb5, krb5i or krb5p", s)
}

var securityNames = [...]string{SecSys: "sys", SecKrb5: "krb5", SecKrb5i: "krb5i", SecKrb5p: "krb5p"}

func (s Security) String() string {
	if s >= 0 && int(s) < len(securityNames) {
		return securityNames[s]
	}
	return fmt.Sprintf("Security(%d)", int(s))
}

// service is the RPCSEC_GSS service of a Kerberos flavor (RFC 7530
// s3.2.1.1: krb5 is rpc_gss_svc_none, krb5i integrity, krb5p privacy).
func (s Security) service() oncrpc.GSSService {
	switch s {
	case SecKrb5i:
		return oncrpc.GSSIntegrity
	case SecKrb5p:
		return oncrpc.GSSPrivacy
	}
	return oncrpc.GSSNone
}

// GSSSource gives the GSS-API mechanism that authenticates a user to the
// server, what rpc.gssd does for the Linux client: a user's Kerberos
// credential cache, the machine's keytab for root. An error means the
// user has no usable credentials; calls for them fail with EACCES.
type GSSSource interface {
	Mechanism(ctx context.Context, uid uint32) (oncrpc.GSSMechanism, error)
}

// ErrNoCredentials is returned for a call whose user has no Kerberos
// credentials the GSSSource could use (errno EACCES, as the Linux client
// returns when rpc.gssd finds none).
var ErrNoCredentials = errors.New("nfsclient: no Kerberos credentials")

// maxGSSUsers bounds the contexts kept: one per user of the mount.
const maxGSSUsers = 1024

// gssContexts holds an RPCSEC_GSS context per user, each created on the
// first call made for that user and again once the server drops it.
type gssContexts struct {
	src     GSSSource
	service oncrpc.GSSService
	mu      sync.Mutex
	byUID   lru.Cache[uint32, *gssUser] // Max maxGSSUsers
}

// gssUser is one user's context, or the creation of it in progress.
type gssUser struct {
	uid   uint32
	ready chan struct{} // closed once the fields below are set
	g     *oncrpc.GSSContext
	mech  oncrpc.GSSMechanism
	err   error
}

// GSSUser describes one user's RPCSEC_GSS context, for the statistics.
type GSSUser struct {
	UID       uint32
	Principal string // "user@REALM", as the mechanism says; "" if it does not
	Service   oncrpc.GSSService
	Expires   time.Time // when the ticket ends; zero if not known
}

// GSSUsers lists the contexts the client holds, one per user.
func (c *Client) GSSUsers() []GSSUser {
	if c.gss == nil {
		return nil
	}
	var users []GSSUser
	for _, u := range c.gss.byUID.Values() {
		select {
		case <-u.ready:
		default:
			continue
		}
		if u.g == nil {
			continue
		}
		gu := GSSUser{UID: u.uid, Service: u.g.Service()}
		if m, ok := u.mech.(interface{ Principal() string }); ok {
			gu.Principal = m.Principal()
		}
		if m, ok := u.mech.(interface{ Expires() time.Time }); ok {
			gu.Expires = m.Expires()
		}
		users = append(users, gu)
	}
	return users
}

// gssCred is the credential Client.Cred returns under Kerberos: not yet
// bound to a context, it names the user by uid in Body (Client.bind
// makes the credential that goes on the wire).
func gssCred(uid uint32) oncrpc.Credential {
	return oncrpc.Credential{Flavor: oncrpc.FlavorGSS, Body: binary.BigEndian.AppendUint32(nil, uid)}
}

// bind returns the credential a call for cred goes out with: cred
// itself, or for a Kerberos user's credential, that user's context.
func (c *Client) bind(ctx context.Context, cred oncrpc.Credential) (oncrpc.Credential, error) {
	if cred.Flavor != oncrpc.FlavorGSS || cred.GSS != nil {
		return cred, nil
	}
	if c.gss == nil || len(cred.Body) != 4 {
		return cred, errors.New("nfsclient: an RPCSEC_GSS credential with no context")
	}
	uid := binary.BigEndian.Uint32(cred.Body)
	g, err := c.gss.context(ctx, c.rpc, uid)
	if err != nil {
		return cred, err
	}
	return g.Credential(), nil
}

// context returns uid's context, creating it if there is none; callers
// for the same user wait for one creation.
func (gc *gssContexts) context(ctx context.Context, rpc *oncrpc.Client, uid uint32) (*oncrpc.GSSContext, error) {
	gc.mu.Lock()
	u, ok := gc.byUID.Get(uid)
	if !ok {
		u = &gssUser{uid: uid, ready: make(chan struct{})}
		gc.byUID.Put(uid, u)
		gc.mu.Unlock()
		u.g, u.mech, u.err = gc.establish(ctx, rpc, uid)
		close(u.ready)
		if u.err != nil {
			gc.forget(uid, u) // the next call tries again
		}
		return u.g, u.err
	}
	gc.mu.Unlock()
	select {
	case <-u.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if u.err == nil && u.expired(time.Now()) {
		// The ticket ended: the server would refuse the context
		// (RFC 2203 s5.3.3.3). A new one, from the credentials the
		// user has now (kinit -R, a new kinit).
		gc.forget(uid, u)
		return gc.context(ctx, rpc, uid)
	}
	return u.g, u.err
}

// expired reports whether the ticket of u's context has ended by now.
func (u *gssUser) expired(now time.Time) bool {
	m, ok := u.mech.(interface{ Expires() time.Time })
	if !ok {
		return false
	}
	end := m.Expires()
	return !end.IsZero() && !now.Before(end)
}

func (gc *gssContexts) establish(ctx context.Context, rpc *oncrpc.Client, uid uint32) (*oncrpc.GSSContext, oncrpc.GSSMechanism, error) {
	mech, err := gc.src.Mechanism(ctx, uid)
	if err != nil {
		return nil, nil, fmt.Errorf("%w for uid %d: %w", ErrNoCredentials, uid, err)
	}
	g, err := oncrpc.EstablishGSS(ctx, rpc, mech, gc.service)
	if err != nil {
		return nil, nil, fmt.Errorf("nfsclient: RPCSEC_GSS context for uid %d: %w", uid, err)
	}
	return g, mech, nil
}

// expired drops uid's context g (the server refused it), so that the
// next call creates a new one.
func (gc *gssContexts) expired(uid uint32, g *oncrpc.GSSContext) {
	gc.mu.Lock()
	defer gc.mu.Unlock()
	if u, ok := gc.byUID.Get(uid); ok && u.g == g {
		gc.byUID.Delete(uid)
	}
}

func (gc *gssContexts) forget(uid uint32, u *gssUser) {
	gc.mu.Lock()
	defer gc.mu.Unlock()
	if cur, ok := gc.byUID.Get(uid); ok && cur == u {
		gc.byUID.Delete(uid)
	}
}

// destroyAll tells the server to forget every context (RFC 2203 s5.4,
// RPCSEC_GSS_DESTROY), at unmount: the server need not keep them until
// they expire. It returns the first error.
func (gc *gssContexts) destroyAll(ctx context.Context, rpc *oncrpc.Client) error {
	var first error
	for _, u := range gc.byUID.Values() {
		select {
		case <-u.ready:
		default:
			continue // still being made; the server expires it
		}
		if u.g == nil {
			continue
		}
		if err := u.g.Destroy(ctx, rpc); err != nil && first == nil {
			first = fmt.Errorf("nfsclient: RPCSEC_GSS_DESTROY: %w", err)
		}
	}
	return first
}
