package lru

import "testing"

func TestCacheEvictsLeastRecentlyUsed(t *testing.T) {
	c := Cache[int, string]{Max: 3}
	c.Put(1, "a")
	c.Put(2, "b")
	c.Put(3, "c")
	if v, ok := c.Get(1); !ok || v != "a" { // 1 is now the most recent
		t.Fatalf("Get(1) = %q, %v", v, ok)
	}
	c.Put(4, "d") // drops 2
	if _, ok := c.Get(2); ok {
		t.Fatal("the least recently used entry was kept")
	}
	for _, k := range []int{1, 3, 4} {
		if _, ok := c.Get(k); !ok {
			t.Fatalf("entry %d dropped", k)
		}
	}
	c.Put(3, "C") // replaces, no growth
	if v, _ := c.Get(3); v != "C" || c.Len() != 3 {
		t.Fatalf("after replacing: %q, len %d", v, c.Len())
	}
	for i := range 100000 {
		c.Put(100+i, "x")
	}
	if c.Len() != 3 {
		t.Fatalf("len %d after 100000 puts, want 3", c.Len())
	}
}
