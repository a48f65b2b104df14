package nfsclient

import (
	"bytes"
	"testing"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// TestCredCacheBounded: as many distinct credentials as a hostile local
// user can make leave at most maxCachedCreds cached, and the cache still
// answers with the right credential, the recently used one kept.
func TestCredCacheBounded(t *testing.T) {
	c := &Client{}
	c.credCache.Max = maxCachedCreds
	c.cfg.Hostname = "h"
	hot := c.Cred(1000, 1000, []uint32{1, 2})
	for i := range uint32(500_000) {
		c.Cred(i+1<<20, i, nil)
		if i%512 == 0 {
			c.Cred(1000, 1000, []uint32{1, 2}) // keep it recent
		}
	}
	if n := c.credCache.Len(); n > maxCachedCreds {
		t.Fatalf("%d credentials cached, want at most %d", n, maxCachedCreds)
	}
	if _, ok := c.credCache.Get("1000:1000,1,2"); !ok {
		t.Errorf("recently used credential was evicted")
	}
	if _, ok := c.credCache.Get("1048576:0"); ok {
		t.Errorf("least recently used credential still cached")
	}
	got := c.Cred(1000, 1000, []uint32{1, 2})
	want := oncrpc.AuthSys{MachineName: "h", UID: 1000, GID: 1000, GIDs: []uint32{1, 2}}.Credential()
	if got.Flavor != want.Flavor || !bytes.Equal(got.Body, want.Body) || !bytes.Equal(hot.Body, want.Body) {
		t.Errorf("Cred = %+v, want %+v", got, want)
	}
}
