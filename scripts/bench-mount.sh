#!/bin/bash
# make bench-mount: fio through rdmafs against the FUSE floor (a go-fuse
# loopback of the same directory), and with KNFSD=1 proto=rdma against
# proto=tcp on knfsd. Prints markdown tables (test/benchmount).
# KNFSD_NET=passt gives the guest passt's 65520-byte frames instead of
# qemu's slirp (test/kpeer KPEER_NET); GANESHA=0 skips the ganesha table.
# With KNFSD=1 two more mounts go through this host: "rdma-relay" uses
# proto=rdma to a responder (pure-Go iWARP) that relays each call over TCP
# to the same knfsd, the client's RDMA path without the guest's siw, and
# "tcp-relay" proto=tcp through the same kind of hop (RELAY=0 drops both).
# RELAY=1 also puts the two relays in front of ganesha (no guest needed)
# and prints rdma-relay against tcp-relay: our RDMA stack against our TCP
# stack on this host's CPU alone (GANESHA=0 RELAY=1: that table only).
# Each relay is a process of its own. The CPU columns are the rdmafs
# process's CPU seconds per GiB moved, and the relay process's on its own
# (nanosecond CPU clocks). JOBS='1M direct' runs only the jobs whose name
# matches that regexp. PERF=DIR has perf record and perf stat (context
# switches, system calls) each knfsd or relay variant's rdmafs process and
# relay process during each job, into DIR; PERF_RECORD=0 only counts.
# NCONNECT=1 instead compares nconnect=1, 2 and 4 (4 parallel fio jobs,
# 1 MiB sequential write and read) over tcp to ganesha and proto=rdma
# through a relay process to it (test/benchmount/nconnect.go).
# RPCS=1 counts COMPOUNDs per entry of tar x, ls -l and rm -rf instead.
# URING=1 instead compares rdmafs over FUSE-over-io_uring (-o uring) with
# rdmafs over /dev/fuse and the loopback on ganesha, with 4 KiB random
# reads at queue depth 16 and file creates too.
# ganesha exports a directory in /dev/shm, so that this machine's disk is
# not what is measured; EXPORT=disk puts it on the disk instead.
#   SIZE=1024 ROUNDS=3 KNFSD=1 scripts/bench-mount.sh
#   SIZE=256 ROUNDS=5 RELAY=1 JOBS='1M direct' scripts/bench-mount.sh
#   SIZE=256 ROUNDS=5 NCONNECT=1 scripts/bench-mount.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
command -v fio >/dev/null || { echo "bench-mount: fio missing: run make deps" >&2; exit 1; }
make -s build
args=(-rdmafs bin/rdmafs -size "${SIZE:-1024}" -rounds "${ROUNDS:-1}")
[ "${KNFSD:-0}" = 1 ] && args+=(-knfsd -knfsd-net "${KNFSD_NET:-user}")
[ "${GANESHA:-1}" = 0 ] && args+=(-ganesha=false)
[ "${RPCS:-0}" = 1 ] && args+=(-rpcs)
[ "${NCONNECT:-0}" = 1 ] && args+=(-nconnect)
[ "${RELAY:-}" = 0 ] && args+=(-relay=false)
[ "${RELAY:-}" = 1 ] && args+=(-ganesha-relay)
[ "${URING:-0}" = 1 ] && args+=(-uring)
[ -n "${JOBS:-}" ] && args+=(-jobs "$JOBS")
[ -n "${EXPORT:-}" ] && args+=(-export "$EXPORT")
[ -n "${PERF:-}" ] && args+=(-perf "$PERF")
[ "${PERF_RECORD:-1}" = 0 ] && args+=(-perf-record=false)
exec go run ./test/benchmount "${args[@]}"
