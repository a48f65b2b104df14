#!/bin/bash
# make soak: the data-verification soak (test/soak, run by
# cmd/rdmafs's TestSoak) against the test servers, each through two rdmafs
# mounts, for DURATION per peer. Settings (environment):
#   DURATION=30m      how long each peer runs
#   PEERS="knfsd knfsd-rdma ganesha ganesha-rdma-v2"   which ones (the default: all)
#   PARALLEL=1        run the peers at the same time (default: one after another)
#   CUT=60s           cut the mounts' transport connections this often
#   RESTART_CMD=...   run once at RESTART_AT (default half way) to restart the
#                     server: "server" uses the test peers' own restart (knfsd:
#                     kpeer-restart-nfsd; ganesha: a ganesha of its own that
#                     keeps a grace period; not through the v2 relay), after
#                     which every open and lock must be reclaimed without an
#                     error; "guest:CMD" runs CMD in the knfsd guest, e.g.
#                     'guest:echo 0 >/proc/fs/nfsd/threads; echo 4 >/proc/fs/nfsd/threads';
#                     anything else runs here with sh -c and gets RDMAFS_SOAK_PEER,
#                     RDMAFS_SOAK_SERVER and, for knfsd, RDMAFS_KNFSD_SHELL
#   SEED=N            the workload's seed (printed by every run)
#   OPLOG=DIR         keep every operation in DIR/PEER.wN
# The log is kept in soak-DATE.log; the summary lines are printed at the end.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
peers=${PEERS:-knfsd knfsd-rdma ganesha ganesha-rdma-v2}
pattern="^TestSoak\$/^($(echo $peers | tr ' ' '|'))\$"
export RDMAFS_SOAK_DURATION=${DURATION:-30m}
export RDMAFS_SOAK_CUT=${CUT:-}
export RDMAFS_SOAK_RESTART_CMD=${RESTART_CMD:-}
export RDMAFS_SOAK_RESTART_AT=${RESTART_AT:-}
export RDMAFS_SOAK_SEED=${SEED:-}
export RDMAFS_SOAK_PARALLEL=${PARALLEL:-0}
export RDMAFS_SOAK_OPLOG=${OPLOG:-}
[ -n "$RDMAFS_SOAK_OPLOG" ] && mkdir -p "$RDMAFS_SOAK_OPLOG"
log=soak-$(date +%Y%m%d-%H%M%S).log
echo "soak: $peers for $RDMAFS_SOAK_DURATION each${CUT:+, cutting connections every $CUT}${RESTART_CMD:+, one server restart}; log in $log"
status=0
parallel=1; [ "$RDMAFS_SOAK_PARALLEL" = 1 ] && parallel=$(echo $peers | wc -w)
go test -count=1 -p 1 -parallel "$parallel" -timeout 0 -v -run "$pattern" ./cmd/rdmafs >"$log" 2>&1 || status=$?
echo "== summary"
grep -E 'seed=[0-9]+ ops=|operations by kind|MISMATCH|stall:|error:|--- (PASS|FAIL)|^(ok|FAIL)' "$log" | grep -v '^\s*soak_test.go:[0-9]*: [^ ]*: soak w[0-9]*: *#' || true
exit $status
