#!/bin/bash
# Install everything rdmafs's tests need on a Debian machine (run as root),
# then pre-build the kpeer guest (test/kpeer) so the first test run does not.
# Idempotent: apt-get update runs only when a package is missing, and the
# kpeer build is cached in test/kpeer/build (or $KPEER_BUILD_DIR).
#
#   scripts/deps.sh              # used by `make deps` and CI
#   DEPS_SKIP_KPEER=1 scripts/deps.sh   # packages only
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PKGS=(
  fuse3
  libibverbs-dev librdmacm-dev ibverbs-providers rdma-core   # verbs/ibverbs (cgo) and the guest rxe/siw tests
  nfs-ganesha nfs-ganesha-vfs nfs-ganesha-mem
  qemu-system-x86 busybox-static python3 binutils gcc make xz-utils zstd
  util-linux   # flock; setpriv and unshare (tests as an ordinary user, without /dev/fuse)
  fio          # make bench-mount
  mount coreutils   # mount, mknod, cut in those tests' namespace scripts
  groff-base   # groff: cmd/rdmafs checks that the man page renders without warnings
  krb5-kdc krb5-admin-server krb5-user   # the tests' Kerberos realm: krb5kdc, kdb5_util, kadmin.local, kinit, klist
)

say() { echo "deps: $*"; }
fail() { echo "deps: FAILED: $*" >&2; exit 1; }
trap 'fail "command failed at line $LINENO (see output above)"' ERR

[ "$(id -u)" = 0 ] || fail "must run as root (apt-get install, kpeer guest build)"
command -v apt-get >/dev/null || fail "needs a Debian/Ubuntu system with apt-get"

# The status in a variable: "dpkg-query | grep -q" can fail under pipefail
# when grep leaves before dpkg-query has written.
installed() { local st; st=$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) && [[ $st == *"ok installed"* ]]; }

missing=()
for p in "${PKGS[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  say "missing packages: ${missing[*]}"
  say "apt-get update"
  apt-get update -q -o DPkg::Lock::Timeout=300 || fail "apt-get update"
  say "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=300 \
    --no-install-recommends "${missing[@]}" || fail "apt-get install ${missing[*]}"
else
  say "all packages installed: ${PKGS[*]}"
fi

# The commands the tests run (they fail, not skip, when one is missing):
# check that the packages above really provided them.
TOOLS=(fusermount3 setpriv unshare flock mount mknod cut ganesha.nfsd qemu-system-x86_64 busybox python3 fio groff
  krb5kdc kdb5_util kadmin.local kinit klist)
absent=()
for c in "${TOOLS[@]}"; do
  command -v "$c" >/dev/null || [ -x "/usr/sbin/$c" ] || [ -x "/sbin/$c" ] || absent+=("$c")
done
[ ${#absent[@]} -eq 0 ] || fail "installed, but these commands are still missing: ${absent[*]}"
say "commands present: ${TOOLS[*]}"

# The tests that mount as an ordinary user run as uid 1000 (setpriv);
# fusermount3 refuses a user without a passwd entry.
if ! getent passwd 1000 >/dev/null; then
  say "adding user rdmafs-test (uid 1000) for the tests that mount as an ordinary user"
  # Reuse a group that is already there (a machine may have the group
  # rdmafs-test, or some group with gid 1000, without the user).
  if getent group rdmafs-test >/dev/null; then
    group=(--gid rdmafs-test)
  elif getent group 1000 >/dev/null; then
    group=(--gid 1000)
  else
    group=(--user-group)
  fi
  useradd --uid 1000 "${group[@]}" --no-create-home --home-dir / --shell /usr/sbin/nologin rdmafs-test ||
    fail "useradd rdmafs-test (uid 1000)"
fi

# FUSE over io_uring (the uring mount option; make test mounts over it
# in its second pass): Linux 6.14 and later have it behind a module
# parameter that only root can turn on.
uring=/sys/module/fuse/parameters/enable_uring
[ -e "$uring" ] || modprobe fuse 2>/dev/null || true
[ -e "$uring" ] || fail "the kernel has no FUSE over io_uring ($uring is absent: Linux 6.14 or later built with CONFIG_FUSE_IO_URING)"
if [ "$(cat "$uring")" != Y ]; then
  echo Y > "$uring" || fail "could not turn on FUSE over io_uring ($uring)"
  say "turned on FUSE over io_uring ($uring)"
fi

# The kpeer guest: run.sh installs the matching linux-headers package,
# downloads the guest's Debian packages and builds siw.ko (cached).
if [ "${DEPS_SKIP_KPEER:-0}" = 1 ]; then
  say "DEPS_SKIP_KPEER=1: not building the kpeer guest"
else
  say "building the kpeer guest (test/kpeer/run.sh, KPEER_BUILD_ONLY=1)"
  # With the kernel NFS client's modules, which cmd/rdmafs's
  # TestRelayKernelClient boots a guest with (kernelClientMods there, and
  # bench-kernel.sh: the same list, so one cached cpio).
  KPEER_BUILD_ONLY=1 KPEER_EXTRA_MODS="nfsv4 nfs rdma_rxe ib_uverbs rdma_ucm fuse crc32_generic" \
    "$ROOT/test/kpeer/run.sh" || fail "kpeer guest build (test/kpeer/run.sh)"
fi
say "done"
