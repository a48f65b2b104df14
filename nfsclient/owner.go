package nfsclient

import (
	"os/user"
	"strconv"
	"strings"
	"sync"
	"time"
)

// nobody is the id an unmappable owner maps to.
const nobody = 65534

// Owner names that are not numbers go through the user and group
// database, which can be slow (NSS: files, LDAP, sssd), and a READDIR
// brings the same few owners over and over: a 1000-entry page asked
// 2000 times. The answers are cached, as the Linux client keeps its
// idmapper's (nfs.idmap_cache_timeout, 600 seconds by default).
const (
	ownerCacheTTL  = 10 * time.Minute
	ownerCacheSize = 4096 // names; a full cache starts afresh
)

// ownerKey is an owner or owner_group name, without its @domain.
type ownerKey struct {
	name  string
	group bool
}

type ownerEntry struct {
	id      uint32
	expires time.Time
}

// ownerCache maps owner names to ids through lookup, remembering each
// answer (a name the database does not know too, as nobody) for
// ownerCacheTTL.
type ownerCache struct {
	lookup func(name string, group bool) uint32
	now    func() time.Time

	mu      sync.Mutex
	entries map[ownerKey]ownerEntry
}

func newOwnerCache(lookup func(name string, group bool) uint32) *ownerCache {
	return &ownerCache{lookup: lookup, now: time.Now, entries: make(map[ownerKey]ownerEntry)}
}

// owners is the process's cache: the user database is the process's.
var owners = newOwnerCache(lookupUserDB)

// id returns the id of name (a user, or with group a group).
func (c *ownerCache) id(name string, group bool) uint32 {
	k := ownerKey{name, group}
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[k]
	c.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.id
	}
	// Not under mu: a lookup may block on the network, and two racing
	// ones for the same name only ask twice.
	id := c.lookup(name, group)
	c.mu.Lock()
	if len(c.entries) >= ownerCacheSize {
		clear(c.entries)
	}
	c.entries[k] = ownerEntry{id: id, expires: now.Add(ownerCacheTTL)}
	c.mu.Unlock()
	return id
}

// mapOwner maps an owner or owner_group string to a number: numeric
// strings directly (RFC 8881 s5.9 allows them with AUTH_SYS), "name@domain"
// through the local user and group database (cached).
func mapOwner(s string, group bool) uint32 {
	if isDigits(s) {
		if v, err := strconv.ParseUint(s, 10, 32); err == nil {
			return uint32(v)
		}
	}
	name, _, _ := strings.Cut(s, "@")
	return owners.id(name, group)
}

// isDigits reports whether s is a decimal number: a name is not tried
// with ParseUint, whose error allocates.
func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// lookupUserDB looks name up in the user or group database; nobody if it
// is not there.
func lookupUserDB(name string, group bool) uint32 {
	if group {
		if g, err := user.LookupGroup(name); err == nil {
			if v, err := strconv.ParseUint(g.Gid, 10, 32); err == nil {
				return uint32(v)
			}
		}
		return nobody
	}
	if u, err := user.Lookup(name); err == nil {
		if v, err := strconv.ParseUint(u.Uid, 10, 32); err == nil {
			return uint32(v)
		}
	}
	return nobody
}
