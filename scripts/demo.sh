#!/bin/bash
# make demo: start a Linux knfsd (qemu guest with soft-iWARP), mount it
# over RPC-over-RDMA at ./mnt with -v rdma tracing, and show it working.
#   scripts/demo.sh         start and mount
#   scripts/demo.sh stop    unmount and stop the server
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DEMO=$ROOT/.demo
MNT=$ROOT/mnt
BIN=$ROOT/bin/rdmafs
export KPEER_RUN_DIR=$DEMO/kpeer
export KPEER_TCP_PORT=${KPEER_TCP_PORT:-22049} KPEER_RDMA_PORT=${KPEER_RDMA_PORT:-20049} KPEER_SHELL_PORT=${KPEER_SHELL_PORT:-22022}
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

stop() {
  if grep -qs " $MNT " /proc/mounts; then "$BIN" umount "$MNT" || fusermount3 -u -z "$MNT" || true; fi
  test/kpeer/stop.sh || true
}
if [ "${1:-}" = stop ]; then stop; exit 0; fi

say "starting knfsd in a qemu guest (RPC-over-RDMA on 127.0.0.1:$KPEER_RDMA_PORT)"
mkdir -p "$DEMO" "$MNT"
if grep -qs " $MNT " /proc/mounts; then "$BIN" umount "$MNT" || fusermount3 -u -z "$MNT"; fi
if [ -s "$KPEER_RUN_DIR/qemu.pid" ] && kill -0 "$(cat "$KPEER_RUN_DIR/qemu.pid")" 2>/dev/null; then
  echo "knfsd guest already running"
else
  test/kpeer/run.sh
fi

say "mounting 127.0.0.1:/ on ./mnt over proto=rdma (trace: $DEMO/trace.log)"
rm -f "$DEMO/trace.log"
"$BIN" mount -o proto=rdma,port="$KPEER_RDMA_PORT" -v rdma,nfs --log "$DEMO/trace.log" 127.0.0.1:/ "$MNT"
grep " $MNT " /proc/mounts

say "using it"
set -x
echo "hello over RDMA" > mnt/hello.txt
cat mnt/hello.txt
dd if=/dev/urandom of="$DEMO/4m" bs=1M count=4 status=none
cp "$DEMO/4m" mnt/4m
cmp "$DEMO/4m" mnt/4m && echo "4 MiB file: same bytes back"
mkdir -p mnt/dir/sub && ln -sf ../hello.txt mnt/dir/link && ls -la mnt mnt/dir
df -h mnt
set +x

say "what went over the wire (rdma trace lines with chunks)"
grep -E "read\(|write\(|replychunk|negotiate" "$DEMO/trace.log" | head -12 || true
"$BIN" stats "$MNT" || true

cat <<MSG

The mount stays up at ./mnt. When you are done:
  bin/rdmafs umount ./mnt        # unmount (or: make demo-stop, which also stops the server)
  test/kpeer/stop.sh             # with KPEER_RUN_DIR=$KPEER_RUN_DIR: stop the knfsd guest
MSG
