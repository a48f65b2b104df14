package nfsclient

import "testing"

// TestIOSizeFromSessionLimits: rsize and wsize come from the session's
// message limits less what a READ reply or WRITE call carries besides the
// data, so a server whose limit is its payload plus a page (knfsd: 256 KiB
// or 512 KiB of payload, by its memory) gets whole power-of-two READs and
// WRITEs, as the Linux client sends it; an allowance of 8 KiB made them
// 252 KiB and 508 KiB, one RPC more per MiB.
func TestIOSizeFromSessionLimits(t *testing.T) {
	for _, tc := range []struct {
		limit, attr uint64
		want        int
	}{
		{266240, 262144, 262144},   // knfsd, 2 GiB guest
		{528384, 524288, 524288},   // knfsd, 4 GiB guest
		{1<<20 + 8192, 0, 1 << 20}, // what rdmafs asks for, granted
		{101376, 0, 98304},         // an odd limit: a multiple of 4 KiB below it
	} {
		if got := clampIO(1<<20, int(tc.limit)-readReplyOverhead, tc.attr); got != tc.want {
			t.Errorf("rsize with a %d-byte reply limit, maxread %d: %d, want %d", tc.limit, tc.attr, got, tc.want)
		}
		if got := clampIO(1<<20, int(tc.limit)-writeCallOverhead, tc.attr); got != tc.want {
			t.Errorf("wsize with a %d-byte call limit, maxwrite %d: %d, want %d", tc.limit, tc.attr, got, tc.want)
		}
	}
}
