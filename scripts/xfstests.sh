#!/bin/bash
# make xfstests: run xfstests (fstests) against an rdmafs mount, with the
# server started here by the test harness (test/testpeer, through
# test/peer) and stopped at the end.
#
#   XFSTESTS_DIR=/path/to/xfstests scripts/xfstests.sh generic/091
#   XFSTESTS_DIR=... SERVER=knfsd-rdma scripts/xfstests.sh -g quick
#   make xfstests XFSTESTS_DIR=... TESTS='-g quick' SERVER=ganesha
#
# The arguments are ./check's (default: -g quick). xfstests is not part of
# rdmafs: build it yourself (its README: ./configure is run by make) and
# point XFSTESTS_DIR at the built tree. Settings (environment):
#   XFSTESTS_DIR   the built xfstests tree (required)
#   SERVER         ganesha (NFS over TCP, the default), knfsd-rdma or
#                  knfsd-tcp (Linux knfsd in the qemu guest, test/kpeer;
#                  needs KPEER_BUILD_DIR's guest cache, scripts/deps.sh)
#   RDMAFS_BIN     the rdmafs binary to mount with (default: build bin/rdmafs
#                  here); e.g. another worktree's bin/rdmafs
#   MOUNT_OPTS     more rdmafs mount options, e.g. actimeo=0 or vers=4.2
#   RESULTS        the run's directory (default .xfstests/DATE-SERVER here):
#                  local.config, check.out (check's output), summary.txt,
#                  results/ (xfstests' RESULT_BASE) and the server's log
#   TIME_LIMIT     stop ./check after this long (timeout(1) syntax, e.g. 90m)
#   EXPORT_DIR     ganesha: the host directory to export (default: a fresh
#                  one in /tmp; it is removed at the end)
#   KNFSD_EXPORT_SIZE  knfsd: the size of the guest's export, kpeer.exportsize (default 1g)
#   KNFSD_EXPORT_FS    knfsd: the guest export's file system, kpeer.exportfs
#                  (ext4, the default, or xfs)
#
# Needs root (ganesha.nfsd and xfstests do). It installs, if missing, the
# mount(8) helper /sbin/mount.fuse.rdmafs, a three-line script that runs
# $RDMAFS_BIN (so each run mounts with its own binary), and the users and
# group xfstests' README asks for (fsgqa, fsgqa2, 123456-fsgqa); set
# XFSTESTS_NO_SETUP=1 to only be told what is missing.
#
# The mounts: TEST_DEV is 127.0.0.1:/EXPORT/test-PID and SCRATCH_DEV
# 127.0.0.1:/EXPORT/scratch-PID (two directories of the one export), mounted
# -t fuse.rdmafs with allow_other (xfstests runs some steps as fsgqa) and
# the server's port. The summary (pass / fail / not run, and every not-run
# reason with its count) is printed at the end and kept in summary.txt;
# the exit status is 0 only if no test failed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export PATH=$PATH:/usr/local/go/bin

die() { echo "xfstests: $*" >&2; exit 1; }
say() { echo "xfstests: $*" >&2; }

[ "$(id -u)" = 0 ] || die "run as root (ganesha.nfsd and xfstests need it)"
XFSTESTS_DIR=${XFSTESTS_DIR:-}
[ -n "$XFSTESTS_DIR" ] || die "set XFSTESTS_DIR to a built xfstests tree (see docs/xfstests.md)"
XFSTESTS_DIR=$(cd "$XFSTESTS_DIR" && pwd) || die "XFSTESTS_DIR: no such directory"
[ -x "$XFSTESTS_DIR/check" ] || die "$XFSTESTS_DIR/check missing: not an xfstests tree"
[ -x "$XFSTESTS_DIR/ltp/fsx" ] || die "$XFSTESTS_DIR is not built (no ltp/fsx): run make there"
SERVER=${SERVER:-ganesha}
case "$SERVER" in
ganesha | knfsd-rdma | knfsd-tcp) ;;
*) die "SERVER=$SERVER: want ganesha, knfsd-rdma or knfsd-tcp" ;;
esac
[ $# -gt 0 ] || set -- -g quick

# The binaries: rdmafs (unless given) and the server starter.
if [ -z "${RDMAFS_BIN:-}" ]; then
	go build -o bin/rdmafs ./cmd/rdmafs || die "building bin/rdmafs failed"
	RDMAFS_BIN=$ROOT/bin/rdmafs
fi
RDMAFS_BIN=$(readlink -f "$RDMAFS_BIN")
[ -x "$RDMAFS_BIN" ] || die "RDMAFS_BIN=$RDMAFS_BIN is not executable"
export RDMAFS_BIN

# mount -t fuse.rdmafs runs /sbin/mount.fuse.rdmafs (util-linux looks only
# in /sbin, /sbin/fs.d and /sbin/fs); ours runs $RDMAFS_BIN, which mount(8)
# passes on to it in the environment.
HELPER=/sbin/mount.fuse.rdmafs
HELPER_TEXT='#!/bin/bash
# mount(8) helper for fuse.rdmafs, installed by rdmafs scripts/xfstests.sh
exec -a mount.fuse.rdmafs "${RDMAFS_BIN:-rdmafs}" "$@"'
missing=()
if [ -e "$HELPER" ] && ! grep -qs 'installed by rdmafs scripts/xfstests.sh' "$HELPER"; then
	# Someone's own helper, e.g. make install's symlink to rdmafs: fine if
	# it is the binary asked for.
	[ "$(readlink -f "$HELPER")" = "$RDMAFS_BIN" ] ||
		die "$HELPER is not ours and not RDMAFS_BIN=$RDMAFS_BIN: move it away (ours runs \$RDMAFS_BIN)"
elif [ "$(cat "$HELPER" 2>/dev/null)" != "$HELPER_TEXT" ]; then
	missing+=(helper)
fi
getent passwd fsgqa >/dev/null || missing+=(user:fsgqa)
getent passwd fsgqa2 >/dev/null || missing+=(user:fsgqa2)
getent passwd 123456-fsgqa >/dev/null || missing+=(user:123456-fsgqa)
getent group fsgqa >/dev/null || missing+=(group:fsgqa)
if [ ${#missing[@]} -gt 0 ]; then
	[ "${XFSTESTS_NO_SETUP:-0}" = 1 ] && die "missing: ${missing[*]} (run without XFSTESTS_NO_SETUP=1 to create them)"
	for m in "${missing[@]}"; do
		case "$m" in
		helper) printf '%s\n' "$HELPER_TEXT" >"$HELPER.tmp.$$" && chmod 755 "$HELPER.tmp.$$" && mv "$HELPER.tmp.$$" "$HELPER" ;;
		user:fsgqa) useradd -m fsgqa ;;
		user:*) useradd "${m#user:}" ;;
		group:*) getent group "${m#group:}" >/dev/null || groupadd "${m#group:}" ;;
		esac
		say "created $m"
	done
fi

# The run directory, and test/peer built into it (so that a run of this
# script from another tree, with RDMAFS_BIN and RESULTS set, writes
# nothing into this one; test/peer finds test/kpeer through
# RDMAFS_REPO_ROOT).
RESULTS=${RESULTS:-$ROOT/.xfstests/$(date -u +%Y%m%d-%H%M%S)-$SERVER}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
go build -o "$RESULTS/peer" ./test/peer || die "building test/peer failed"
# The mounts run a copy of the binary: a rebuild of RDMAFS_BIN during the
# run must not change what the later mounts run.
cp "$RDMAFS_BIN" "$RESULTS/rdmafs"
[ -L "$HELPER" ] || RDMAFS_BIN=$RESULTS/rdmafs
export RDMAFS_REPO_ROOT=$ROOT
TEST_MNT=$RESULTS/mnt/test SCRATCH_MNT=$RESULTS/mnt/scratch
mkdir -p "$TEST_MNT" "$SCRATCH_MNT" "$RESULTS/results"

# Unmount what is left: a FUSE connection whose umount does not finish is
# aborted through fusectl, and a serving process still there a minute
# after its unmount is killed (and named: that is an rdmafs bug).
unmount_all() {
	local m dev pid i
	for m in "$SCRATCH_MNT" "$TEST_MNT"; do
		grep -qs " $m " /proc/mounts || continue
		pid=$(timeout 10 "$RDMAFS_BIN" stats "$m" 2>/dev/null | awk '/^pid:/ { print $2; exit }' || true)
		if ! timeout 60 umount "$m" 2>/dev/null; then
			dev=$(mountpoint -d "$m" 2>/dev/null || true)
			say "umount $m did not finish: aborting its FUSE connection"
			[ -n "$dev" ] && echo 1 >"/sys/fs/fuse/connections/${dev#*:}/abort" 2>/dev/null || true
			umount -l "$m" 2>/dev/null || true
		fi
		[ -n "$pid" ] || continue
		for i in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
		if kill -0 "$pid" 2>/dev/null; then
			say "rdmafs (pid $pid) still runs a minute after unmounting $m: killing it"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	done
}

# The server: test/peer prints its addresses, then READY, and runs until
# its standard input (our coprocess pipe) closes.
# The directories' names carry this script's PID: xfstests finds and
# unmounts its file systems by source (findmnt -S, umount SOURCE), so two
# runs at the same time must not share one.
TEST_NAME=test-$$ SCRATCH_NAME=scratch-$$
peer_args=(-logs "$RESULTS" -dirs "$TEST_NAME,$SCRATCH_NAME")
case "$SERVER" in
ganesha) peer_args+=(-server ganesha ${EXPORT_DIR:+-export-dir "$EXPORT_DIR"}) ;;
knfsd-*) peer_args+=(-server knfsd -append "kpeer.exportsize=${KNFSD_EXPORT_SIZE:-1g} kpeer.exportfs=${KNFSD_EXPORT_FS:-ext4}" -env KPEER_MEM=2048) ;;
esac
say "starting $SERVER (log: $RESULTS/peer.log)"
coproc PEER { exec "$RESULTS/peer" "${peer_args[@]}" 2>"$RESULTS/peer.log"; }
PEER_IN=${PEER[1]}
stop_peer() {
	unmount_all
	if [ -n "${PEER_PID:-}" ]; then
		exec {PEER_IN}>&-
		wait "$PEER_PID" 2>/dev/null || true
		PEER_PID=
	fi
}
trap stop_peer EXIT
trap 'exit 130' INT TERM
PEER_TCP='' PEER_RDMA='' PEER_EXPORT='' PEER_DIR='' PEER_LOG=''
while IFS= read -r -u "${PEER[0]}" line; do
	case "$line" in
	READY) break ;;
	PEER_*=*) declare "$line" ;;
	esac
done
[ -n "$PEER_TCP" ] || die "$SERVER did not start: $(tail -20 "$RESULTS/peer.log")"

case "$SERVER" in
knfsd-rdma) opts="proto=rdma,port=${PEER_RDMA##*:}" ;;
*) opts="port=${PEER_TCP##*:}" ;;
esac
opts="allow_other,$opts${MOUNT_OPTS:+,$MOUNT_OPTS}"
export_path=${PEER_EXPORT%/}
cat >"$RESULTS/local.config" <<EOF
# written by rdmafs scripts/xfstests.sh for SERVER=$SERVER
export FSTYP=fuse
export FUSE_SUBTYP=.rdmafs
export TEST_DEV=127.0.0.1:$export_path/$TEST_NAME
export TEST_DIR=$TEST_MNT
export SCRATCH_DEV=127.0.0.1:$export_path/$SCRATCH_NAME
export SCRATCH_MNT=$SCRATCH_MNT
# xfstests checks the type df -T shows, fuse.rdmafs, against FSTYP, fuse:
# df through a filter that shows fuse.rdmafs as fuse. Asked about no file
# (xfstests then looks for its device in the list), it looks at this run's
# mounts alone: a plain df stats every mount on the machine and waits as
# long as any FUSE server elsewhere takes to answer.
export DF_PROG="$RESULTS/df -T -P"
export TEST_FS_MOUNT_OPTS="-o $opts"
export MOUNT_OPTIONS="-o $opts"
export RESULT_BASE=$RESULTS/results
export RDMAFS_BIN=$RDMAFS_BIN
EOF
{
	echo '#!/bin/bash'
	echo "mounts=('$TEST_MNT' '$SCRATCH_MNT')"
	cat <<'DF'
set -o pipefail
files=0
for a in "$@"; do case "$a" in -*) ;; *) files=1 ;; esac; done
if [ "$files" = 0 ]; then
	set -- "$@" /
	for m in "${mounts[@]}"; do grep -qs " $m " /proc/mounts && set -- "$@" "$m"; done
fi
df "$@" | sed -E 's/^([^ ]+ +)fuse\.rdmafs /\1fuse /'
DF
} >"$RESULTS/df"
chmod 755 "$RESULTS/df"
say "server $SERVER at $PEER_TCP${PEER_RDMA:+ (rdma $PEER_RDMA)}; mount options $opts"
say "running ./check $* (output: $RESULTS/check.out)"
status=0
(
	cd "$XFSTESTS_DIR"
	export HOST_OPTIONS=$RESULTS/local.config RESULT_BASE=$RESULTS/results
	if [ -n "${TIME_LIMIT:-}" ]; then
		exec timeout -k 120 "$TIME_LIMIT" ./check "$@"
	fi
	exec ./check "$@"
) 2>&1 | tee "$RESULTS/check.out" || status=$?
[ "$status" = 124 ] && say "stopped after TIME_LIMIT=$TIME_LIMIT"
stop_peer

"$ROOT/scripts/xfstests-summary.sh" "$RESULTS" | tee "$RESULTS/summary.txt"
grep -q '^failed 0$' "$RESULTS/summary.txt"
