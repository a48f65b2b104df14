#!/bin/bash
# make bench-v42: what NFSv4.2 buys through an rdmafs mount, measured A
# against B on the same mount, in one run, alternating (A then B in odd
# rounds, B then A in even ones), reporting each round and the median of
# the ratios (issue 21's "Done when" figures):
#
#  copy   knfsd in the qemu guest (the server with COPY; ganesha 4.3 has
#         none), EXPORTFS export (ext4, or xfs: knfsd's COPY then clones
#         extents) on a RAM disk of EXPORTSIZE: cp(1) of a
#         SIZE MiB file to the same export (coreutils cp uses
#         copy_file_range, which the mount sends as NFSv4.2 COPY) against
#         the same copy with read/write (dd bs=1M), each followed by an
#         fsync of the copy (cp: sync FILE; dd: conv=fsync). Before each
#         copy the host's and the guest's page caches are dropped, so the
#         read/write copy really READs. Ratio dd/cp; target >= 10.
#  sparse ganesha over TCP on this host (export in /dev/shm) and, with
#         KNFSD_SPARSE=1, knfsd: reading a SIZE MiB file holding 1 MiB of
#         data in its middle with cp --sparse=always (SEEK_DATA/SEEK_HOLE,
#         NFSv4.2 SEEK) into a tmpfs file, against reading a dense SIZE MiB
#         file the same way. Page cache dropped before each. Ratio
#         sparse/dense; target <= 0.1.
#
# Each timed step also records the NFS operations it sent (rdmafs stats,
# before and after): COPY, SEEK, READ, WRITE counts.
#
# The knfsd guest runs under TCG when this machine has no KVM: its absolute
# figures mean little (emulated CPU, slirp network); the ratios are the point.
#
#   scripts/bench-v42.sh                      # everything, SIZE=1024 ROUNDS=5
#   SIZE=256 ROUNDS=3 PROTOS=tcp scripts/bench-v42.sh
#   COPY=0 scripts/bench-v42.sh               # only the sparse read on ganesha
# Knobs: SIZE (MiB, default 1024), ROUNDS (5), PROTOS ("tcp rdma": the
# knfsd copy mounts), COPY=0 (skip knfsd copy), GANESHA=0 (skip ganesha
# sparse), KNFSD_SPARSE=1 (sparse read on knfsd too, over each of PROTOS),
# EXPORTSIZE (knfsd export, default 3g), EXPORTFS (ext4, the default, or xfs), KPEER_MEM (guest MiB, default 4096),
# VERIFY=1 (compare whole copies, not three MiB of them), KNFSD_PORTS="T R S"
# (use a knfsd guest already running with TCP, RDMA and shell ports T R S).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export PATH=$PATH:/usr/local/go/bin
SIZE=${SIZE:-1024}
ROUNDS=${ROUNDS:-5}
PROTOS=${PROTOS:-tcp rdma}
EXPORTSIZE=${EXPORTSIZE:-3g}
EXPORTFS=${EXPORTFS:-ext4}
BIN=$ROOT/bin/rdmafs
[ "$(id -u)" = 0 ] || { echo "bench-v42: needs root (drop_caches, ganesha)" >&2; exit 1; }
make -s build

W=$(mktemp -d /dev/shm/bench-v42.XXXXXX)
MNTS=()
GPID=
KRUN=
cleanup() {
  set +e
  for m in "${MNTS[@]}"; do
    grep -qs " $m " /proc/mounts && { timeout 120 "$BIN" umount "$m" || "$BIN" umount --lazy "$m"; }
  done
  [ -n "$GPID" ] && kill "$GPID" 2>/dev/null && wait "$GPID" 2>/dev/null
  [ -n "$KRUN" ] && [ "$KRUN" != external ] && KPEER_RUN_DIR=$KRUN test/kpeer/stop.sh >/dev/null 2>&1
  # Never recurse into a mount that is still there.
  if grep -qs " $W/" /proc/mounts; then echo "bench-v42: left $W (still mounted)" >&2; else rm -rf "$W"; fi
}
trap cleanup EXIT

log() { echo "[bench-v42 $(date -u +%H:%M:%S)] $*" >&2; }
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }
# opcount MNT OP: the per-op count rdmafs stats gives for OP (0 if absent).
opcount() { "$BIN" stats "$1" | awk -v op="$2" '$1==op{print $2; f=1} END{if(!f) print 0}'; }
# ops MNT: "COPY SEEK READ WRITE" counts.
ops() { local o out=(); for o in COPY SEEK READ WRITE; do out+=("$(opcount "$1" "$o")"); done; echo "${out[*]}"; }
# opsdiff "before" "after": "COPY=n SEEK=n READ=n WRITE=n".
opsdiff() {
  local -a a=($1) b=($2) n=(COPY SEEK READ WRITE); local i s=
  for i in 0 1 2 3; do s+="${n[$i]}=$((b[i]-a[i])) "; done; echo "${s% }"
}
median() { sort -g | awk '{v[NR]=$1} END{if(NR%2) print v[(NR+1)/2]; else printf "%.4g\n", (v[NR/2]+v[NR/2+1])/2}'; }
# dropcaches: the host's page cache (the FUSE mount's pages) and, if a
# guest runs, the guest's.
dropcaches() {
  sync; echo 3 >/proc/sys/vm/drop_caches
  if [ -n "$KRUN" ]; then gexec 'sync; echo 3 >/proc/sys/vm/drop_caches' >/dev/null; fi
}
gexec() { KPEER_SHELL_PORT=$KSHELL python3 test/kpeer/tools/gexec.py "$@"; }
mountit() { # mountit NAME OPTS SOURCE: mounts on $W/mnt-NAME, sets m (not in a subshell: MNTS must keep it)
  m=$W/mnt-$1; mkdir -p "$m"
  "$BIN" mount -o "$2" "$3" "$m" >&2
  MNTS+=("$m")
}
RESULTS=$W/results   # lines: kind server proto round a_s b_s ratio
: >"$RESULTS"
SUMMARY=()

# copy_rounds MNT LABEL: cp (copy_file_range) against dd (read/write).
copy_rounds() {
  local m=$1 label=$2 r t0 t1 ta tb s0 s1 ratios=() opsa opsb
  log "$label: writing a $SIZE MiB source file"
  dd if=/dev/urandom of="$m/src" bs=1M count="$SIZE" conv=fsync status=none
  for r in $(seq 1 "$ROUNDS"); do
    local order="cp dd"; [ $((r % 2)) = 0 ] && order="dd cp"
    for step in $order; do
      rm -f "$m/dst"; dropcaches
      s0=$(ops "$m"); t0=$(now)
      if [ "$step" = cp ]; then cp "$m/src" "$m/dst" && sync "$m/dst"
      else dd if="$m/src" of="$m/dst" bs=1M conv=fsync status=none; fi
      t1=$(now); s1=$(ops "$m")
      [ "$(stat -c %s "$m/dst")" = $((SIZE << 20)) ] || { echo "bench-v42: $label $step: $m/dst has the wrong size" >&2; exit 1; }
      if [ "$step" = cp ]; then ta=$(echo "$t1 - $t0" | bc -l); opsa=$(opsdiff "$s0" "$s1")
      else tb=$(echo "$t1 - $t0" | bc -l); opsb=$(opsdiff "$s0" "$s1"); fi
    done
    if [ "$r" = 1 ]; then # the copy holds the same bytes: checked once, and with VERIFY=0 only its first, middle and last MiB (reading 2 GiB takes minutes under TCG)
      dropcaches
      if [ "${VERIFY:-0}" = 1 ]; then cmp "$m/src" "$m/dst" || { echo "bench-v42: $label: copy differs" >&2; exit 1; }
      else
        for off in 0 $((SIZE / 2)) $((SIZE - 1)); do
          [ "$(dd if="$m/src" bs=1M skip="$off" count=1 status=none | md5sum)" = "$(dd if="$m/dst" bs=1M skip="$off" count=1 status=none | md5sum)" ] ||
            { echo "bench-v42: $label: copy differs in MiB $off" >&2; exit 1; }
        done
      fi
    fi
    local ratio; ratio=$(echo "$tb / $ta" | bc -l)
    ratios+=("$ratio")
    printf 'copy %s round %d: cp %.2f s [%s]  dd %.2f s [%s]  dd/cp %.2f\n' "$label" "$r" "$ta" "$opsa" "$tb" "$opsb" "$ratio"
    echo "copy $label $r $ta $tb $ratio" >>"$RESULTS"
  done
  rm -f "$m/dst" "$m/src"
  local med; med=$(printf '%s\n' "${ratios[@]}" | median)
  SUMMARY+=("$(printf 'copy %s: median dd/cp %.2f over %d rounds (target >= 10: %s)' "$label" "$med" "$ROUNDS" \
    "$(awk -v m="$med" 'BEGIN{print (m>=10)?"met":"NOT met"}')")")
}

# sparse_rounds MNT LABEL [prepared]: cp --sparse=always of a sparse file
# against a dense one, to tmpfs. With prepared, MNT already holds both.
sparse_rounds() {
  local m=$1 label=$2 r t0 t1 ta tb s0 s1 ratios=() opsa opsb
  if [ -z "${3:-}" ]; then
    log "$label: writing a dense $SIZE MiB file and a sparse one with 1 MiB of data"
    dd if=/dev/urandom of="$m/dense" bs=1M count="$SIZE" conv=fsync status=none
    truncate -s "${SIZE}M" "$m/sparse"
    dd if=/dev/urandom of="$m/sparse" bs=1M count=1 seek=$((SIZE / 2)) conv=notrunc,fsync status=none
  fi
  log "$label: sparse file: $(stat -c '%s bytes, %b blocks of %B' "$m/sparse")"
  for r in $(seq 1 "$ROUNDS"); do
    local order="sparse dense"; [ $((r % 2)) = 0 ] && order="dense sparse"
    for step in $order; do
      rm -f "$W/out"; dropcaches
      s0=$(ops "$m"); t0=$(now)
      cp --sparse=always "$m/$step" "$W/out"
      t1=$(now); s1=$(ops "$m")
      [ "$(stat -c %s "$W/out")" = $((SIZE << 20)) ] || { echo "bench-v42: $label $step: copy has the wrong size" >&2; exit 1; }
      if [ "$step" = sparse ]; then
        ta=$(echo "$t1 - $t0" | bc -l); opsa=$(opsdiff "$s0" "$s1")
        [ "$r" = 1 ] && { cmp "$m/sparse" "$W/out" || { echo "bench-v42: $label: sparse copy differs" >&2; exit 1; }; }
      else tb=$(echo "$t1 - $t0" | bc -l); opsb=$(opsdiff "$s0" "$s1"); fi
    done
    rm -f "$W/out"
    local ratio; ratio=$(echo "$ta / $tb" | bc -l)
    ratios+=("$ratio")
    printf 'sparse %s round %d: sparse %.3f s [%s]  dense %.3f s [%s]  sparse/dense %.4f\n' "$label" "$r" "$ta" "$opsa" "$tb" "$opsb" "$ratio"
    echo "sparse $label $r $ta $tb $ratio" >>"$RESULTS"
  done
  local med; med=$(printf '%s\n' "${ratios[@]}" | median)
  SUMMARY+=("$(printf 'sparse %s: median sparse/dense %.4f over %d rounds (target <= 0.1: %s)' "$label" "$med" "$ROUNDS" \
    "$(awk -v m="$med" 'BEGIN{print (m<=0.1)?"met":"NOT met"}')")")
}

echo "bench-v42: $(date -u +%Y-%m-%dT%H:%MZ) commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo +dirty) SIZE=$SIZE MiB ROUNDS=$ROUNDS on $(uname -n) ($(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg))"

if [ "${GANESHA:-1}" = 1 ]; then
  command -v ganesha.nfsd >/dev/null || { echo "bench-v42: ganesha.nfsd missing: run make deps" >&2; exit 1; }
  GPORT=$(freeport)
  mkdir -p "$W/ganesha/export" "$W/ganesha/recovery"
  cat >"$W/ganesha/ganesha.conf" <<EOF
NFS_CORE_PARAM { Bind_addr = 127.0.0.1; NFS_Port = $GPORT; NFS_Protocols = 4; Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false; }
NFS_KRB5 { Active_krb5 = false; }
NFSV4 { Minor_Versions = 1, 2; Graceless = true; RecoveryBackend = fs; RecoveryRoot = "$W/ganesha/recovery"; }
EXPORT { Export_Id = 1; Path = "$W/ganesha/export"; Pseudo = /export; Protocols = 4; Transports = TCP;
  Access_Type = RW; Squash = No_Root_Squash; SecType = sys; FSAL { Name = VFS; } }
EOF
  ganesha.nfsd -F -f "$W/ganesha/ganesha.conf" -L "$W/ganesha/ganesha.log" -p "$W/ganesha/ganesha.pid" >"$W/ganesha/out.log" 2>&1 &
  GPID=$!
  for i in $(seq 1 60); do
    m=$("$BIN" mount -o "proto=tcp,port=$GPORT" "127.0.0.1:/export" "$W/probe" 2>&1 >/dev/null) && break
    mkdir -p "$W/probe"; sleep 1
  done
  "$BIN" umount "$W/probe" 2>/dev/null || { echo "bench-v42: ganesha did not come up: $m" >&2; tail "$W/ganesha/ganesha.log" >&2; exit 1; }
  # The files are made on the export directory itself (ganesha's is in /dev/shm), before the mount.
  E=$W/ganesha/export
  dd if=/dev/urandom of="$E/dense" bs=1M count="$SIZE" status=none
  truncate -s "${SIZE}M" "$E/sparse"
  dd if=/dev/urandom of="$E/sparse" bs=1M count=1 seek=$((SIZE / 2)) conv=notrunc status=none
  mountit ganesha-tcp "proto=tcp,port=$GPORT" "127.0.0.1:/export"
  "$BIN" stats "$m" | grep '^server:'
  sparse_rounds "$m" "ganesha/tcp" prepared
  "$BIN" umount "$m"
fi

if [ "${COPY:-1}" = 1 ] || [ "${KNFSD_SPARSE:-0}" = 1 ]; then
  if [ -n "${KNFSD_PORTS:-}" ]; then # a guest already running: "tcp rdma shell" ports
    read -r KTCP KRDMA KSHELL <<<"$KNFSD_PORTS"
    KRUN=external
  else
    KRUN=$W/kpeer KTCP=$(freeport) KRDMA=$(freeport) KSHELL=$(freeport)
    log "booting knfsd (KPEER_MEM=${KPEER_MEM:-4096}, export $EXPORTFS ${EXPORTSIZE})"
    KPEER_RUN_DIR=$KRUN KPEER_TCP_PORT=$KTCP KPEER_RDMA_PORT=$KRDMA KPEER_SHELL_PORT=$KSHELL \
      KPEER_MEM=${KPEER_MEM:-4096} KPEER_APPEND="${KPEER_APPEND:-} kpeer.exportsize=$EXPORTSIZE kpeer.exportfs=$EXPORTFS" KPEER_WATCH_PID=$$ \
      test/kpeer/run.sh >"$W/kpeer.log" 2>&1 || { cat "$W/kpeer.log" >&2; exit 1; }
  fi
  echo "knfsd guest: $(cat "$KRUN/accel" 2>/dev/null || echo '?') accel, export: $(gexec 'df -h /export | tail -1')"
  for proto in $PROTOS; do
    port=$KTCP; [ "$proto" = rdma ] && port=$KRDMA
    mountit "knfsd-$proto" "proto=$proto,port=$port" "127.0.0.1:/"
    "$BIN" stats "$m" | grep '^server:'
    [ "${COPY:-1}" = 1 ] && copy_rounds "$m" "knfsd/$proto"
    if [ "${KNFSD_SPARSE:-0}" = 1 ]; then sparse_rounds "$m" "knfsd/$proto"; rm -f "$m/dense" "$m/sparse"; fi
    "$BIN" umount "$m"
  done
fi

echo
printf '%s\n' "${SUMMARY[@]}"
