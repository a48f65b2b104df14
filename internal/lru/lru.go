// Package lru is a bounded cache that drops its least recently used
// entry, for what the client keeps on behalf of callers it does not
// control (a shared mount sees as many credentials and processes as its
// users care to make).
package lru

import (
	"container/list"
	"sync"
)

// Cache holds at most Max entries (a Max of 0 or less holds none beyond
// the one just put). It is safe for concurrent use; the zero value with
// Max set is an empty cache.
type Cache[K comparable, V any] struct {
	Max int

	mu    sync.Mutex
	order list.List // of *entry[K, V], most recently used first
	byKey map[K]*list.Element
}

type entry[K comparable, V any] struct {
	key K
	val V
}

// Get returns the value cached for key and marks it used.
func (c *Cache[K, V]) Get(key K) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[key]
	if !ok {
		var zero V
		return zero, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*entry[K, V]).val, true
}

// Put caches val for key, dropping the least recently used entries
// beyond Max.
func (c *Cache[K, V]) Put(key K, val V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[key]; ok {
		el.Value.(*entry[K, V]).val = val
		c.order.MoveToFront(el)
		return
	}
	if c.byKey == nil {
		c.byKey = make(map[K]*list.Element)
	}
	c.byKey[key] = c.order.PushFront(&entry[K, V]{key: key, val: val})
	for c.order.Len() > max(c.Max, 1) {
		old := c.order.Back()
		c.order.Remove(old)
		delete(c.byKey, old.Value.(*entry[K, V]).key)
	}
}

// Len returns the number of entries cached.
func (c *Cache[K, V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

// Delete drops the entry of key, if there is one.
func (c *Cache[K, V]) Delete(key K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[key]; ok {
		c.order.Remove(el)
		delete(c.byKey, key)
	}
}

// Values returns the values cached, the most recently used first.
func (c *Cache[K, V]) Values() []V {
	c.mu.Lock()
	defer c.mu.Unlock()
	vals := make([]V, 0, c.order.Len())
	for el := c.order.Front(); el != nil; el = el.Next() {
		vals = append(vals, el.Value.(*entry[K, V]).val)
	}
	return vals
}
