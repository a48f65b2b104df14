package nfsclient

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/internal/xdr"
)

// countingLookup is a user database of alice (uid 1000) and staff (gid
// 50) that counts the lookups.
type countingLookup struct {
	mu sync.Mutex
	n  map[ownerKey]int
}

func (l *countingLookup) lookup(name string, group bool) uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n[ownerKey{name, group}]++
	switch {
	case name == "alice" && !group:
		return 1000
	case name == "staff" && group:
		return 50
	}
	return nobody
}

func (l *countingLookup) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := 0
	for _, n := range l.n {
		t += n
	}
	return t
}

// withOwners makes the package's owner cache ask l for the test.
func withOwners(t testing.TB, l *countingLookup) *ownerCache {
	old := owners
	owners = newOwnerCache(l.lookup)
	t.Cleanup(func() { owners = old })
	return owners
}

// fattrWithOwner encodes a fattr4 of type, owner and owner_group.
func fattrWithOwner(owner, group string) []byte {
	var v xdr.Encoder
	v.Uint32(uint32(TypeReg))
	v.String(owner)
	v.String(group)
	var e xdr.Encoder
	bitmapOf(attrType, attrOwner, attrOwnerGroup).encode(&e)
	e.Opaque(v.Bytes())
	return e.Bytes()
}

// TestOwnerLookupsCached decodes the attributes of a 1000-entry READDIR
// whose entries have the same owner and group: one user and one group
// lookup in all, not one of each per entry.
func TestOwnerLookupsCached(t *testing.T) {
	l := &countingLookup{n: map[ownerKey]int{}}
	withOwners(t, l)
	b := fattrWithOwner("alice@example.org", "staff@example.org")
	for i := range 1000 {
		var a Attr
		d := xdr.NewDecoder(b)
		decodeFattr(d, &a)
		if err := d.Err(); err != nil {
			t.Fatal(err)
		}
		if a.UID != 1000 || a.GID != 50 {
			t.Fatalf("entry %d: uid %d gid %d, want 1000 and 50", i, a.UID, a.GID)
		}
	}
	if n := l.total(); n != 2 {
		t.Errorf("1000 entries looked owners up %d times (%v), want 2", n, l.n)
	}
	// Numeric owners need no lookup; an unknown name is looked up once
	// and stays nobody.
	for range 10 {
		var a Attr
		decodeFattr(xdr.NewDecoder(fattrWithOwner("1001", "nosuch@example.org")), &a)
		if a.UID != 1001 || a.GID != nobody {
			t.Fatalf("uid %d gid %d, want 1001 and nobody", a.UID, a.GID)
		}
	}
	if n := l.n[ownerKey{"nosuch", true}]; n != 1 || l.total() != 3 {
		t.Errorf("an unknown group over 10 decodes: %d lookups (all: %v), want 1", n, l.n)
	}
}

// TestOwnerCacheBounds: an answer is asked again after ownerCacheTTL,
// and the cache holds at most ownerCacheSize names.
func TestOwnerCacheBounds(t *testing.T) {
	l := &countingLookup{n: map[ownerKey]int{}}
	c := newOwnerCache(l.lookup)
	now := time.Unix(1e9, 0)
	c.now = func() time.Time { return now }
	c.id("alice", false)
	now = now.Add(ownerCacheTTL - time.Second)
	c.id("alice", false)
	if n := l.total(); n != 1 {
		t.Errorf("within the TTL: %d lookups, want 1", n)
	}
	now = now.Add(2 * time.Second)
	if id := c.id("alice", false); id != 1000 || l.total() != 2 {
		t.Errorf("after the TTL: id %d after %d lookups, want 1000 after 2", id, l.total())
	}
	for i := range 3 * ownerCacheSize {
		c.id(fmt.Sprint("user", i), false)
		if len(c.entries) > ownerCacheSize {
			t.Fatalf("%d names cached, bound %d", len(c.entries), ownerCacheSize)
		}
	}
}

// BenchmarkDecodeAttrOwner decodes a READDIR entry's attributes with a
// named owner and group (GETATTR of a file owned by root@domain), with
// the cache and, for comparison, with a user database lookup each time.
func BenchmarkDecodeAttrOwner(b *testing.B) {
	buf := fattrWithOwner("root@localdomain", "root@localdomain")
	run := func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var a Attr
			d := xdr.NewDecoder(buf)
			decodeFattr(d, &a)
			if a.UID != 0 || a.GID != 0 {
				b.Fatalf("uid %d gid %d, want root's 0", a.UID, a.GID)
			}
		}
	}
	b.Run("cached", run)
	b.Run("uncached", func(b *testing.B) {
		// A clock that moves past the TTL at each call: every answer
		// has expired when it is asked for again.
		old := owners
		owners = newOwnerCache(lookupUserDB)
		var clock time.Time
		owners.now = func() time.Time { clock = clock.Add(ownerCacheTTL + 1); return clock }
		defer func() { owners = old }()
		run(b)
	})
}
