#!/bin/bash
# Stop the qemu that run.sh started for one run dir (KPEER_RUN_DIR, default
# test/kpeer/run), by the PID it recorded in qemu.pid.  The PID is killed only
# if it is a qemu-system process; nothing else is touched.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
R=${KPEER_RUN_DIR:-$HERE/run}
PIDF=$R/qemu.pid
if [ ! -s "$PIDF" ]; then echo "kpeer: not running (no $PIDF)"; exit 0; fi
PID=$(cat "$PIDF")
if kill -0 "$PID" 2>/dev/null && grep -q qemu-system "/proc/$PID/cmdline" 2>/dev/null; then
  kill "$PID" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$PID" 2>/dev/null; then kill -9 "$PID" 2>/dev/null || true; fi
  for _ in $(seq 20); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$PID" 2>/dev/null; then echo "kpeer: qemu pid $PID did not exit" >&2; exit 1; fi
  echo "kpeer: stopped qemu pid $PID"
else
  echo "kpeer: pid $PID is not a running qemu; nothing to stop"
fi
rm -f "$PIDF"
# KPEER_NET=passt: passt -1 exits when qemu closes its socket; stop it if not.
PPID_F=$R/passt.pid
if [ -s "$PPID_F" ]; then
  P=$(cat "$PPID_F")
  for _ in $(seq 20); do kill -0 "$P" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$P" 2>/dev/null && grep -q passt "/proc/$P/cmdline" 2>/dev/null; then kill "$P" 2>/dev/null || true; fi
  rm -f "$PPID_F"
fi
