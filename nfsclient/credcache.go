package nfsclient

import (
	"container/list"
	"sync"

	"github.com/rdmafs/rdmafs/oncrpc"
)

// maxCachedCreds bounds the credentials Client.Cred keeps encoded: a
// mount shared by many users (allow_other) sees as many credentials as
// they care to make, so the least recently used is dropped beyond it.
const maxCachedCreds = 1024

// credLRU is a cache of encoded AUTH_SYS credentials by their key, of at
// most max entries (maxCachedCreds when 0), evicting the least recently
// used. The zero value is an empty cache.
type credLRU struct {
	mu    sync.Mutex
	max   int
	order list.List // of *credEntry, most recently used first
	byKey map[string]*list.Element
}

type credEntry struct {
	key  string
	cred oncrpc.Credential
}

// get returns the credential cached for key and marks it used.
func (l *credLRU) get(key string) (oncrpc.Credential, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	el, ok := l.byKey[key]
	if !ok {
		return oncrpc.Credential{}, false
	}
	l.order.MoveToFront(el)
	return el.Value.(*credEntry).cred, true
}

// put caches cred for key, evicting the least recently used credential
// when the cache is full.
func (l *credLRU) put(key string, cred oncrpc.Credential) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if el, ok := l.byKey[key]; ok {
		el.Value.(*credEntry).cred = cred
		l.order.MoveToFront(el)
		return
	}
	if l.byKey == nil {
		l.byKey = make(map[string]*list.Element)
	}
	l.byKey[key] = l.order.PushFront(&credEntry{key: key, cred: cred})
	limit := l.max
	if limit <= 0 {
		limit = maxCachedCreds
	}
	for l.order.Len() > limit {
		old := l.order.Back()
		l.order.Remove(old)
		delete(l.byKey, old.Value.(*credEntry).key)
	}
}

// len returns the number of credentials cached.
func (l *credLRU) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.order.Len()
}
