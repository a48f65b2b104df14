package nfsclient

import (
	"math/bits"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Stats counts COMPOUNDs per main operation, like the per-op section of
// Linux's /proc/self/mountstats.
type Stats struct {
	mu         sync.Mutex
	ops        map[string]*opStats
	recoveries atomic.Int64

	reclaimedOpens, reclaimedLocks, lostOpens atomic.Uint64
	copied                                    atomic.Uint64 // READ data bytes copied from replies into destinations
}

// BytesCopied returns how many READ data bytes the client copied from
// replies into destinations.
func (c *Client) BytesCopied() uint64 { return c.stats.BytesCopied() }

// BytesCopied returns how many READ data bytes were copied from a reply
// into the destination (data that came inline; data placed by an RDMA
// Write chunk is not copied).
func (s *Stats) BytesCopied() uint64 { return s.copied.Load() }

type opStats struct {
	count, errors uint64
	bytesSent     uint64
	total         time.Duration
	// hist[i] counts calls that took [2^i, 2^(i+1)) microseconds.
	hist [32]uint64
}

func (s *Stats) init() { s.ops = make(map[string]*opStats) }

// mainOp names a COMPOUND by its first operation that is not SEQUENCE or
// a file handle operation.
func mainOp(ops []uint32) string { return opName(mainOpCode(ops)) }

func mainOpCode(ops []uint32) uint32 {
	for _, op := range ops {
		switch op {
		case opSequence, opPutFH, opPutRootFH, opSaveFH, opRestoreFH:
			continue
		}
		return op
	}
	if len(ops) == 1 {
		return ops[0]
	}
	return opSequence
}

// Slots reports the current session's fore channel slots and the calls
// on them; ok is false when there is no session.
func (c *Client) Slots() (st SlotState, ok bool) {
	s := c.sess.Load()
	if s == nil {
		return st, false
	}
	return s.slots.state(), true
}

func (s *Stats) record(ops []uint32, d time.Duration, sent int, err error) {
	name := mainOp(ops)
	us := max(uint64(d/time.Microsecond), 1)
	s.mu.Lock()
	o := s.ops[name]
	if o == nil {
		o = &opStats{}
		s.ops[name] = o
	}
	o.count++
	if err != nil {
		o.errors++
	}
	o.bytesSent += uint64(sent)
	o.total += d
	o.hist[min(bits.Len64(us)-1, 31)]++
	s.mu.Unlock()
}

// OpStats is a snapshot of one operation's counters.
type OpStats struct {
	Op        string
	Count     uint64
	Errors    uint64
	BytesSent uint64
	Avg       time.Duration
	P99       time.Duration // upper bound of the bucket holding the 99th percentile
}

// Snapshot returns the per-operation counters, sorted by operation name,
// and the number of session or client ID recoveries.
func (c *Client) Snapshot() (ops []OpStats, recoveries int64) {
	s := &c.stats
	s.mu.Lock()
	for name, o := range s.ops {
		st := OpStats{Op: name, Count: o.count, Errors: o.errors, BytesSent: o.bytesSent}
		if o.count > 0 {
			st.Avg = o.total / time.Duration(o.count)
			want := (o.count*99 + 99) / 100
			var seen uint64
			for i, n := range o.hist {
				seen += n
				if seen >= want {
					st.P99 = time.Duration(uint64(2)<<i) * time.Microsecond
					break
				}
			}
		}
		ops = append(ops, st)
	}
	s.mu.Unlock()
	sort.Slice(ops, func(i, j int) bool { return ops[i].Op < ops[j].Op })
	return ops, s.recoveries.Load()
}
