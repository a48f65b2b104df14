#!/bin/bash
# make bench-kernel: rdmafs against the client a user would otherwise use,
# the Linux kernel NFS client, on the same server over the same transport
# in one run (issue 23's anchor). Both run inside the knfsd guest and
# mount the guest's own knfsd (NFSv4.2): over TCP, over the kernel's
# soft-iWARP device (siw0) and over soft-RoCE (rxe0); rdmafs uses the
# rdma-core provider on the same device the kernel client uses. Each
# workload runs on both clients, alternating (scripts/bench-kernel-guest.sh):
# 1 MiB sequential write and read, O_DIRECT and buffered; 4 KiB reads at
# scattered offsets, one dd each; tar x of 500 files of 1 KiB in 10
# directories; ls -l of 1000 entries (caches dropped first); rm -rf of
# the unpacked tree; git clone --no-local of a repository of that tree.
# It prints, per transport and workload, the median of
# the time ratios rdmafs/kernel, and the RPCs each client sent per entry
# (per MiB for the data workloads): kernel from /proc/self/mountstats,
# rdmafs from "rdmafs stats".
#
# The guest runs under TCG when this machine has no KVM: absolute times
# are emulation-bound (and both clients share the guest's one emulated
# CPU with the server); the ratios and the RPC counts are the point.
#
#   scripts/bench-kernel.sh                        # tcp siw0 rxe0, ROUNDS=5 SIZE=16
#   TRANSPORTS=tcp ROUNDS=3 scripts/bench-kernel.sh
# Knobs: TRANSPORTS ("tcp siw0 rxe0"), ROUNDS (5), SIZE (MiB per data
# workload, 16), KPEER_MEM (guest MiB, 2048), RESULTS (file for the raw
# RESULT lines; default a temporary file), STEP_TIMEOUT (s per transport,
# 7200), PROFILES (directory to keep each transport's rdmafs CPU profile
# and the binary in, for go tool pprof), OPS (1: also print each step's
# calls per operation on both clients, OPS lines).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export PATH=$PATH:/usr/local/go/bin
TRANSPORTS=${TRANSPORTS:-tcp siw0 rxe0}
ROUNDS=${ROUNDS:-5}
SIZE=${SIZE:-16}
[ "$(id -u)" = 0 ] || { echo "bench-kernel: needs root (the guest's harness)" >&2; exit 1; }

W=$(mktemp -d /tmp/bench-kernel.XXXXXX)
KRUN=$W/kpeer
cleanup() {
  KPEER_RUN_DIR=$KRUN test/kpeer/stop.sh >/dev/null 2>&1 || true
  rm -rf "$W"
}
trap cleanup EXIT
log() { echo "[bench-kernel $(date -u +%H:%M:%S)] $*" >&2; }
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
gexec() { KPEER_SHELL_PORT=$KSHELL timeout 120 python3 test/kpeer/tools/gexec.py "$@"; }

log "building rdmafs with the rdma-core provider (cgo)"
CGO_ENABLED=1 go build -o "$W/rdmafs" ./cmd/rdmafs
# Not "ldd | grep -q": under pipefail, grep leaving at the first match
# can fail the pipeline (ldd gets SIGPIPE). Here-strings below likewise.
libs=$(ldd "$W/rdmafs")
grep -q libibverbs <<<"$libs" || { echo "bench-kernel: rdmafs is not linked with libibverbs (libibverbs-dev, librdmacm-dev)" >&2; exit 1; }
FM=$(command -v fusermount3) || { echo "bench-kernel: fusermount3 (fuse3) is needed in the guest" >&2; exit 1; }
GIT=$(command -v git) || { echo "bench-kernel: git is needed in the guest (the git-clone workload): apt-get install git" >&2; exit 1; }

KSHELL=$(freeport)
log "booting the knfsd guest with the kernel NFS client (nfsv4, nfs, rpcrdma) and rxe"
KPEER_RUN_DIR=$KRUN KPEER_TCP_PORT=$(freeport) KPEER_RDMA_PORT=$(freeport) KPEER_SHELL_PORT=$KSHELL \
  KPEER_MEM=${KPEER_MEM:-2048} KPEER_WATCH_PID=$$ \
  KPEER_EXTRA_MODS="nfsv4 nfs rdma_rxe ib_uverbs rdma_ucm fuse crc32_generic" \
  KPEER_EXTRA="$W/rdmafs $FM $GIT" KPEER_EXTRA_RDMA_USER=1 \
  test/kpeer/run.sh >"$W/kpeer.log" 2>&1 || { cat "$W/kpeer.log" >&2; exit 1; }
echo "knfsd guest: $(cat "$KRUN/accel" 2>/dev/null || echo '?') accel; rdmafs $(git rev-parse --short HEAD)"
{ echo "cat > /tmp/bench-kernel-guest.sh <<'XEOF'"; cat scripts/bench-kernel-guest.sh; echo "XEOF"; } | gexec "$(cat)" >/dev/null

RES=${RESULTS:-$W/results}
: >"$RES"
for t in $TRANSPORTS; do
  case $t in
    tcp|siw0) ;;
    # RDMA-CM routes 10.0.2.15 through the first device on eth0: siw0
    # goes, rxe0 comes (knfsd's wildcard listener follows the new device).
    rxe0) gexec "rdma link delete siw0 2>/dev/null; rdma link add rxe0 type rxe netdev eth0 && rdma link show" >&2 ;;
    *) echo "bench-kernel: TRANSPORTS: $t: want tcp, siw0 or rxe0" >&2; exit 1 ;;
  esac
  log "$t: $ROUNDS rounds"
  # Detached, with its output in a file the host polls: the control
  # shell gives up on a command silent for 30 s.
  gexec "setsid sh -c 'sh /tmp/bench-kernel-guest.sh $t $ROUNDS $SIZE ${OPS:-} > /tmp/bk-$t.log 2>&1' </dev/null >/dev/null 2>&1 &" >/dev/null
  seen=0 deadline=$(( $(date +%s) + ${STEP_TIMEOUT:-7200} ))
  while :; do
    sleep 5
    out=$(gexec "cat /tmp/bk-$t.log")
    echo "$out" | tail -n +$((seen + 1)) | grep -E '^(MOUNTS|RESULT|OPS|FAILED)' >&2 || true
    seen=$(echo "$out" | wc -l)
    grep -q -E "^(DONE $t|FAILED)" <<<"$out" && break
    [ "$(date +%s)" -lt "$deadline" ] || { echo "bench-kernel: $t: no end after ${STEP_TIMEOUT:-7200} s" >&2; exit 1; }
  done
  if grep -q FAILED <<<"$out"; then
    echo "bench-kernel: $t failed:" >&2; echo "$out" | tail -20 >&2; exit 1
  fi
  echo "$out" | grep '^RESULT' >>"$RES"
  # The rdmafs daemon's CPU profile of the run (RDMAFS_CPUPROFILE).
  if gexec "base64 /tmp/rdmafs-$t.prof" | base64 -d >"$W/rdmafs-$t.prof" 2>/dev/null && [ -s "$W/rdmafs-$t.prof" ]; then
    [ -n "${PROFILES:-}" ] && mkdir -p "$PROFILES" && cp "$W/rdmafs-$t.prof" "$W/rdmafs" "$PROFILES/"
    go tool pprof -top -cum -nodecount=30 "$W/rdmafs" "$W/rdmafs-$t.prof" 2>/dev/null >"$W/top-$t.txt" || true
  else
    log "$t: no CPU profile from the guest"
  fi
done

# The table: per transport and workload, the median ratio of the
# rounds' times rdmafs/kernel and each client's median RPCs per entry.
echo
echo "| transport | workload | rdmafs/kernel time (median of $ROUNDS) | kernel s | rdmafs s | RPCs per entry: kernel | rdmafs |"
echo "|---|---|---|---|---|---|---|"
awk '
  function med(s,   n, v, i, j, t) { n = split(s, v, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] + 0 < v[i] + 0) { t = v[i]; v[i] = v[j]; v[j] = t }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
  { key = $2 SUBSEP $4; if (!(key in seen)) { seen[key] = 1; order[++k] = key }
    t[key, $3, $5] = $6; rp[key, $5] = rp[key, $5] " " ($7 / $8); tm[key, $5] = tm[key, $5] " " $6; rounds[key, $3] = 1 }
  END {
    for (i = 1; i <= k; i++) {
      key = order[i]; split(key, kw, SUBSEP); ratios = ""
      for (rk in rounds) { split(rk, rr, SUBSEP); if (rr[1] SUBSEP rr[2] != key) continue
        a = t[key, rr[3], "rdmafs"]; b = t[key, rr[3], "kernel"]; if (b > 0) ratios = ratios " " a / b }
      printf "| %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f |\n", kw[1], kw[2], med(ratios), med(tm[key, "kernel"]), med(tm[key, "rdmafs"]), med(rp[key, "kernel"]), med(rp[key, "rdmafs"])
    }
  }' "$RES"
for t in $TRANSPORTS; do
  [ -s "$W/top-$t.txt" ] || continue
  echo
  echo "rdmafs daemon CPU profile over $t, the whole run (go tool pprof -top -cum):"
  echo '```'
  cat "$W/top-$t.txt"
  echo '```'
done
