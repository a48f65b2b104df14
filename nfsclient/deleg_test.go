package nfsclient

import (
	"context"
	"testing"
)

// TestCallbackRecallUnknownStateID checks that a CB_RECALL of a stateid
// the client does not hold is answered NFS4ERR_BAD_STATEID (RFC 8881
// s20.2.3) without queueing work, and that a delegation recalled twice
// is queued once.
func TestCallbackRecallUnknownStateID(t *testing.T) {
	s := newTestCallbackServer()
	block := make(chan struct{})
	s.c.SetRecallHandler(func(ctx context.Context, fh []byte) { <-block })
	for i := range 100 {
		unknown := StateID{Seq: 1, Other: [12]byte{byte(i), 9}}
		if st := s.recall(unknown, []byte{1}); st != ErrBadStateID {
			t.Fatalf("recall of an unknown stateid: %v, want NFS4ERR_BAD_STATEID", st)
		}
	}
	s.mu.Lock()
	working, queued := s.delegs.working, len(s.delegs.queue)
	s.mu.Unlock()
	if working || queued != 0 {
		t.Fatalf("unknown stateids queued work: worker %v, queue %d", working, queued)
	}
	sid := StateID{Seq: 1, Other: [12]byte{7}}
	s.addDelegation(sid, []byte{1, 2, 3}, true)
	if !s.c.Delegated([]byte{1, 2, 3}) {
		t.Fatal("delegation not found by file handle")
	}
	for range 3 {
		if st := s.recall(sid, []byte{1, 2, 3}); st != StatusOK {
			t.Fatalf("recall: %v", st)
		}
	}
	if s.c.Delegated([]byte{1, 2, 3}) {
		t.Fatal("a recalled delegation still counts for caching")
	}
	if ds := s.c.DelegationStats(); ds.Granted != 1 || ds.Recalled != 1 {
		t.Fatalf("stats %+v, want 1 granted, 1 recalled", ds)
	}
	close(block)
}
