package nfsclient

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// slotTable is the client side of a session's fore channel slot table
// (RFC 8881 s2.10.6.1): each request takes a free slot and carries that
// slot's next sequence ID. The server's target_highest_slotid limits which
// slots may be used.
type slotTable struct {
	mu       sync.Mutex
	seq      []uint32 // next sequence ID to send, per slot
	busy     []bool
	poisoned []bool // outcome unknown: never used again in this session
	target   int    // highest slot ID the server wants used
	highest  int    // highest slot ID in use, for sa_highest_slotid
	wake     chan struct{}

	// use says what each busy slot carries, for "rdmafs stats"; written
	// without the lock (atomics), so that the hot path stays cheap.
	use     []slotUse
	waiting atomic.Int32 // callers waiting for a free slot
}

// slotUse is the call a slot carries: its XID, its main operation and
// when it was sent (UnixNano; 0 when the slot is idle).
type slotUse struct {
	xid   atomic.Uint32
	op    atomic.Uint32
	start atomic.Int64
}

func newSlotTable(n int) *slotTable {
	t := &slotTable{
		seq:      make([]uint32, n),
		busy:     make([]bool, n),
		poisoned: make([]bool, n),
		use:      make([]slotUse, n),
		target:   n - 1,
		wake:     make(chan struct{}),
	}
	for i := range t.seq {
		t.seq[i] = 1 // RFC 8881 s2.10.6.1: the first request on a slot uses 1
	}
	return t
}

// errNoSlots means every slot's state is unknown; the session must be
// replaced.
var errNoSlots = fmt.Errorf("%w: no usable session slots", ErrProtocol)

// acquire waits for a free slot and returns its ID and sequence ID.
func (t *slotTable) acquire(ctx context.Context) (slot int, seq uint32, highest int, err error) {
	for {
		t.mu.Lock()
		usable := false
		for i := 0; i <= t.target && i < len(t.busy); i++ {
			if t.poisoned[i] {
				continue
			}
			usable = true
			if !t.busy[i] {
				t.busy[i] = true
				t.highest = max(t.highest, i)
				h := t.highest
				s := t.seq[i]
				t.mu.Unlock()
				return i, s, h, nil
			}
		}
		wake := t.wake
		t.mu.Unlock()
		if !usable {
			return 0, 0, 0, errNoSlots
		}
		t.waiting.Add(1)
		select {
		case <-wake:
			t.waiting.Add(-1)
		case <-ctx.Done():
			t.waiting.Add(-1)
			return 0, 0, 0, ctx.Err()
		}
	}
}

// slotOutcome is what became of the SEQUENCE sent on a slot, as far as
// the client knows.
type slotOutcome int

const (
	// slotUnused: the server did not process the SEQUENCE (the call was
	// never sent, was refused at the RPC level, or SEQUENCE failed with
	// an error that does not consume the slot), so its sequence ID stays.
	slotUnused slotOutcome = iota
	// slotProcessed: the server processed it; the sequence ID advances.
	slotProcessed
	// slotUnknown: the outcome is not known, so the slot is retired
	// (RFC 8881 s2.10.6.1.2: reusing it risks a false retry).
	slotUnknown
)

// release frees slot after a call whose outcome is o. target is the
// server's sr_target_highest_slotid from a processed SEQUENCE, or -1.
func (t *slotTable) release(slot int, o slotOutcome, target int) {
	t.use[slot].start.Store(0)
	t.mu.Lock()
	t.busy[slot] = false
	switch o {
	case slotProcessed:
		t.seq[slot]++
	case slotUnknown:
		t.poisoned[slot] = true
	}
	if target >= 0 {
		t.target = min(target, len(t.busy)-1)
	}
	for t.highest > 0 && !t.busy[t.highest] {
		t.highest--
	}
	close(t.wake)
	t.wake = make(chan struct{})
	t.mu.Unlock()
}

// noteSent records the call now on slot.
func (t *slotTable) noteSent(slot int, xid, op uint32, start time.Time) {
	u := &t.use[slot]
	u.xid.Store(xid)
	u.op.Store(op)
	u.start.Store(start.UnixNano())
}

// InFlight is one COMPOUND the server has not answered yet.
type InFlight struct {
	Slot int
	XID  uint32
	Op   string // the compound's main operation, as in the per-op statistics
	Age  time.Duration
}

// SlotState is what the fore channel's slot table holds at one moment.
type SlotState struct {
	Slots    int // slots the session has
	Target   int // the server's target_highest_slotid
	Poisoned int // slots retired because a call's outcome was unknown
	Waiting  int // calls waiting for a free slot
	InFlight []InFlight
}

func (t *slotTable) state() SlotState {
	st := SlotState{Slots: len(t.busy), Waiting: int(t.waiting.Load())}
	t.mu.Lock()
	st.Target = t.target
	for i := range t.busy {
		if t.poisoned[i] {
			st.Poisoned++
		}
	}
	t.mu.Unlock()
	now := time.Now()
	for i := range t.use {
		u := &t.use[i]
		start := u.start.Load()
		if start == 0 {
			continue
		}
		st.InFlight = append(st.InFlight, InFlight{Slot: i, XID: u.xid.Load(), Op: opName(u.op.Load()), Age: now.Sub(time.Unix(0, start))})
	}
	return st
}
