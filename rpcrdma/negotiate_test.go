package rpcrdma

import "testing"

// reply classifies and commits a reply as conn.receiveReply does for one
// that passes its checks (reply.go), so that a test walks the state
// machine without a connection.
func (n *negotiation) reply(h *Header, isProbe bool) verdict {
	v := n.classify(h, isProbe)
	if v != dropReply {
		n.commit(h, v)
	}
	return v
}

// TestNegotiationReplies walks the requester's version state machine
// through the cases of v2 draft s5 (checklist V2-5.*).
func TestNegotiationReplies(t *testing.T) {
	probe := func() negotiation {
		return negotiation{st: negProbe, sendSize: probeMaxSend, privSend: 4096, recvMax: 8192, inlineMax: 8192, peer: DefaultChars}
	}
	tests := []struct {
		name     string
		n        negotiation
		h        Header
		isProbe  bool
		want     verdict
		wantSt   negState
		wantSend int
	}{
		{"V2-5.2-a ERR_VERS 1..1 falls back", probe(), Header{Vers: 2, Proc: ProcError, ErrCode: ErrVers, VersLow: 1, VersHigh: 1}, true, resendV1, negV1, 4096},
		{"RFC 8166 s7 ERR_VERS with vers word 1", probe(), Header{Vers: 1, Proc: ProcError, ErrCode: ErrVers, VersLow: 1, VersHigh: 1}, true, resendV1, negV1, 4096},
		{"V2-5.2-e no common version", probe(), Header{Vers: 2, Proc: ProcError, ErrCode: ErrVers, VersLow: 3, VersHigh: 4}, true, versionMismatch, negProbe, probeMaxSend},
		{"V2-5.1-b non-error v2 reply confirms", probe(), Header{Vers: 2, Proc: ProcMsg}, true, confirmedV2, negV2, 4096},
		{"V2-5.3-a v1 reply to the v2 probe is dropped", probe(), Header{Vers: 1, Proc: ProcMsg}, true, dropReply, negProbe, probeMaxSend},
		{"v2 ERR_CHUNK to the probe is delivered, not a confirmation", probe(), Header{Vers: 2, Proc: ProcError, ErrCode: ErrChunk}, true, deliverReply, negProbe, probeMaxSend},
		{"V2-5.3-a v2 reply on a v1 connection is dropped", negotiation{st: negV1}, Header{Vers: 2, Proc: ProcMsg}, false, dropReply, negV1, 0},
		{"V2-5.3-a v1 reply on a v2 connection is dropped", negotiation{st: negV2}, Header{Vers: 1, Proc: ProcMsg}, false, dropReply, negV2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := tt.n
			if got := n.reply(&tt.h, tt.isProbe); got != tt.want {
				t.Fatalf("verdict %d, want %d", got, tt.want)
			}
			if n.st != tt.wantSt || n.sendSize != tt.wantSend {
				t.Fatalf("state %d send %d, want %d %d", n.st, n.sendSize, tt.wantSt, tt.wantSend)
			}
		})
	}
	// Strict version 2 never falls back.
	n := probe()
	n.strict = true
	if v := n.reply(&Header{Vers: 2, Proc: ProcError, ErrCode: ErrVers, VersLow: 1, VersHigh: 1}, true); v != versionMismatch {
		t.Fatalf("strict: verdict %d", v)
	}
	// V2-5.2-b: lost while probing, or after falling back with no reply.
	n = probe()
	n.probeSent = true
	if !n.lostDuringNegotiation() {
		t.Fatal("loss during the probe not noticed")
	}
	n.reply(&Header{Vers: 2, Proc: ProcError, ErrCode: ErrVers, VersLow: 1, VersHigh: 1}, true)
	if !n.lostDuringNegotiation() {
		t.Fatal("loss right after ERR_VERS not noticed")
	}
	n.reply(&Header{Vers: 1, Proc: ProcMsg}, false)
	if n.lostDuringNegotiation() {
		t.Fatal("loss after a version-1 reply counted as a negotiation failure")
	}
	// v2 draft s5: the probe's reply limit is 1024; version 2 uses 4096
	// even after our INITXCH announced more (xcharext s4.1: the peer may
	// not have taken note); version 1 uses RFC 8797 private data.
	n = probe()
	if n.replyLimit(8192) != 1024 {
		t.Fatal("probe reply limit")
	}
	n.st = negV2
	if n.replyLimit(8192) != 4096 {
		t.Fatal("v2 reply limit before INITXCH")
	}
	n.initSent = true
	if n.replyLimit(8192) != 4096 {
		t.Fatal("v2 reply limit trusts our INITXCH")
	}
	n = negotiation{st: negV1, privReply: 1024, recvMax: 4096}
	if n.replyLimit(4096) != 1024 {
		t.Fatal("v1 reply limit ignores the peer's inline send size")
	}
}
