//go:build cgo && linux && !noibverbs

package ibverbs

import (
	"errors"
	"sync"

	"github.com/rdmafs/rdmafs/verbs"
)

// fakeDevice stands in for the device's registration calls where a test
// needs what real hardware will not do on demand: a failing
// ibv_dereg_mr, or siw invalidating a key a peer named.
type fakeDevice struct {
	mu        sync.Mutex
	next      uint32
	live      map[uint32]*hwMR // registered, by key index
	dead      map[uint32]bool  // registered but invalidated by the "peer"
	failDereg bool
}

func newFakeDevice() *fakeDevice {
	return &fakeDevice{live: make(map[uint32]*hwMR), dead: make(map[uint32]bool)}
}

func (d *fakeDevice) regMR(addr uintptr, n int, access verbs.Access, _ bool) (*hwMR, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.next++
	key := d.next<<8 | 0x11
	r := &hwMR{addr: addr, size: uint64(n), lkey: key, rkey: key}
	d.live[key>>8] = r
	return r, nil
}

func (d *fakeDevice) deregMR(r *hwMR) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.live[r.lkey>>8] != r {
		return errors.New("fake device: deregister of an unknown registration")
	}
	if d.failDereg {
		return errors.New("fake device: injected ibv_dereg_mr failure")
	}
	delete(d.live, r.lkey>>8)
	delete(d.dead, r.lkey>>8)
	return nil
}

// invalidate does what siw does with the STag of a Send With Invalidate:
// it kills the registration of that index, whatever it is.
func (d *fakeDevice) invalidate(stag uint32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.live[stag>>8] != nil {
		d.dead[stag>>8] = true
	}
}

// usable reports whether key names a live registration the device
// accepts.
func (d *fakeDevice) usable(key uint32) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.live[key>>8]
	return r != nil && r.lkey == key && !d.dead[key>>8]
}

func (d *fakeDevice) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.live)
}
