package iwarp

import (
	"testing"
	"time"

	"github.com/rdmafs/rdmafs/verbs"
)

// TestKickSilentPeer: the active side sends zero-length Writes to a peer
// that stays silent after our first message (workaround for the Linux siw
// accept race, see kick.go); the passive side accepts them as no-ops and
// stops being kicked once it speaks.
func TestKickSilentPeer(t *testing.T) {
	ctx := testCtx(t)
	c, s := pair(t, nil, nil)
	postRecv(s, 1, make([]byte, 8))
	c.PostSend(verbs.SendWR{WRID: 1, Opcode: verbs.OpSend, SGL: gather(t, c.PD(), []byte("call"))})
	expect(t, pollOne(t, s.RecvCQ()), 1, verbs.StatusSuccess, verbs.OpRecv)
	for c.kicks.Load() < 2 {
		select {
		case <-ctx.Done():
			t.Fatalf("no kicks: %v", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	postRecv(c, 2, make([]byte, 8))
	s.PostSend(verbs.SendWR{WRID: 2, Opcode: verbs.OpSend, SGL: gather(t, s.PD(), []byte("reply"))})
	expect(t, pollOne(t, c.RecvCQ()), 2, verbs.StatusSuccess, verbs.OpRecv)
	if s.kicks.Load() != 0 || c.Err() != nil || s.Err() != nil {
		t.Fatalf("passive side kicked %d; errors %v %v", s.kicks.Load(), c.Err(), s.Err())
	}
}
