#!/bin/bash
# kpeer: boot a stock Debian kernel in qemu as an NFSv4.1 server with a TCP
# listener (guest 2049 -> host 127.0.0.1:$KPEER_TCP_PORT) and an RPC-over-RDMA
# listener on soft-iWARP (siw, guest 20049 -> host 127.0.0.1:$KPEER_RDMA_PORT).
#
# Needs only Debian apt.  Debian's kernels are built without CONFIG_RDMA_SIW,
# so siw.ko is compiled out of tree from Debian's linux-source-X.Y package
# against the matching linux-headers package (same version as the image).
#
# Environment knobs:
#   KPEER_TCP_PORT=N           host port for nfsd TCP (default 22049)
#   KPEER_RDMA_PORT=N          host port for nfsd RDMA/siw (default 20049)
#   KPEER_SHELL_PORT=N         host port for the guest control shell (default 22022)
#   KPEER_RUN_DIR=DIR          per-instance dir: qemu.pid, serial.log, initrd (default test/kpeer/run)
#   KPEER_BUILD_DIR=DIR        shared build cache (default test/kpeer/build); safe for
#                              concurrent run.sh invocations (flock on DIR/.lock)
#   KPEER_BUILD_ONLY=1         install host packages, build the cache, then exit (no boot)
#   KPEER_ACCEL=auto|kvm|tcg   (default auto: KVM if /dev/kvm is usable, else TCG at once)
#   KPEER_KVM_START_PROBE=S    seconds a bare KVM vCPU must keep running in the probe
#                              that tells a usable /dev/kvm (default 2; see kvm_usable)
#   KPEER_MEM=MiB              (default 1024)
#   KPEER_SMP=N                (default 1)
#   KPEER_TIMEOUT=S            seconds to wait for READY (default 300)
#   KPEER_KVM_PROBE=S          seconds a KVM guest gets to reach /init (default 20)
#   KPEER_KVM_CPU=model        -cpu for the KVM attempt (default host; TCG uses max)
#   KPEER_APPEND="..."         extra kernel cmdline (e.g. "kpeer.debug=1 kpeer.threads=8
#                              kpeer.siw=mpa_crc_required=1")
#   KPEER_KVER=6.1.0-56-amd64  kernel ABI (default: what linux-image-amd64 depends on)
#   KPEER_SIW_PARAMS=1|0       patch siw's compile-time consts into module params
#                              (default 1; defaults are unchanged)
#   KPEER_REBUILD=1            force rebuilding the build cache
#   KPEER_EXTRA_MODS="m ..."   more kernel modules (with their dependencies) from the
#                              guest kernel's package, loaded by /init after the base
#                              set (e.g. "rdma_rxe ib_uverbs rdma_ucm fuse"); cached in
#                              the build dir, one cpio per module list
#   KPEER_EXTRA="file ..."     host executables copied to the guest's /usr/local/bin,
#                              with their shared libraries (ldd) in /lib/x86_64-linux-gnu
#   KPEER_EXTRA_RDMA_USER=1    also copy the host's rdma-core userspace: libibverbs,
#                              librdmacm, the rxe/siw provider libraries, /etc/libibverbs.d
#   KPEER_WATCH_PID=PID        kill the qemu when process PID exits (used by the Go
#                              harness so a killed test binary leaves no qemu behind)
#   KPEER_NET=user|passt       the guest's network (default user): user is qemu's
#                              built-in slirp (1500-byte frames, 1460-byte TCP segments);
#                              passt is the passt daemon (Debian package passt, no root
#                              network setup, loopback-only forwards) with 65520-byte
#                              frames: siw's FPDUs are bounded by the work request
#                              (~20 KiB for knfsd's RDMA Writes) instead of 1456 bytes;
#                              see README "slirp or passt" for what that does and does not change
#   KPEER_NIC=e1000|virtio     the guest's network card (default e1000): qemu's Intel
#                              82540EM emulation, or virtio-net-pci, whose transmit
#                              queue qemu 7.2 under TCG stalls for good now and then
#                              (README "Network reset"); both drivers are in the guest
#   KPEER_PCAP=FILE            record the guest's Ethernet frames (both directions) to
#                              FILE, a pcap (qemu filter-dump); tools/mpastat.py reads it
set -euo pipefail
T0=$(date +%s.%N)
HERE=$(cd "$(dirname "$0")" && pwd)
BASE=${KPEER_BUILD_DIR:-$HERE/build}
R=${KPEER_RUN_DIR:-$HERE/run}
BUILD_ONLY=${KPEER_BUILD_ONLY:-0}
mkdir -p "$BASE"
BASE=$(cd "$BASE" && pwd)
if [ "$BUILD_ONLY" != 1 ]; then mkdir -p "$R"; R=$(cd "$R" && pwd); fi
TCP_PORT=${KPEER_TCP_PORT:-22049}
RDMA_PORT=${KPEER_RDMA_PORT:-20049}
SHELL_PORT=${KPEER_SHELL_PORT:-22022}
ACCEL=${KPEER_ACCEL:-auto}
MEM=${KPEER_MEM:-1024}
SMP=${KPEER_SMP:-1}
TIMEOUT=${KPEER_TIMEOUT:-300}
KVM_PROBE=${KPEER_KVM_PROBE:-20}
SIW_PARAMS=${KPEER_SIW_PARAMS:-1}
REBUILD=${KPEER_REBUILD:-0}
NET=${KPEER_NET:-user}
NIC=${KPEER_NIC:-e1000}
case "$NIC" in
  e1000) NICDEV=e1000 ;;
  virtio) NICDEV=virtio-net-pci ;;
  *) echo "kpeer: KPEER_NIC=$NIC: want e1000 or virtio" >&2; exit 1 ;;
esac
case "$NET" in user|passt) ;; *) echo "kpeer: KPEER_NET=$NET: want user or passt" >&2; exit 1 ;; esac
LOG=$R/serial.log
PIDF=$R/qemu.pid
# Bump when the layout of the build cache changes (forces a rebuild).
CACHE_REV=3
APT_OPTS=(-q -o DPkg::Lock::Timeout=300)

msg() { echo "[kpeer $(awk -v t0="$T0" -v t1="$(date +%s.%N)" 'BEGIN{printf "%6.1f", t1-t0}')s] $*" >&2; }
die() { echo "kpeer: $*" >&2; exit 1; }
is_qemu() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null && grep -q qemu-system "/proc/$1/cmdline" 2>/dev/null; }

for p in "$TCP_PORT" "$RDMA_PORT" "$SHELL_PORT"; do
  case "$p" in ''|*[!0-9]*) die "bad port '$p'" ;; esac
done
if [ "$BUILD_ONLY" != 1 ] && [ -s "$PIDF" ] && is_qemu "$(cat "$PIDF")"; then
  die "qemu already running for run dir $R (pid $(cat "$PIDF")); run KPEER_RUN_DIR=$R $HERE/stop.sh first"
fi

# ---------------------------------------------------------------- 1+2. host packages, build cache
# Everything that writes to $BASE (and apt) runs under an exclusive lock, so
# several run.sh invocations sharing one build dir are safe.  fd 9 is closed
# before qemu starts so the daemon does not inherit the lock.
exec 9>"$BASE/.lock"
if ! flock -n 9; then
  msg "waiting for build lock $BASE/.lock"
  flock 9
fi

HOSTPKGS="qemu-system-x86 busybox-static python3 binutils gcc make xz-utils zstd"
[ "$NET" = passt ] && HOSTPKGS="$HOSTPKGS passt"
# Fast path: cache built for the recorded kernel and the boot tools present.
CACHED=0
if [ "$REBUILD" != 1 ] && [ -z "${KPEER_KVER:-}" ] && [ -s "$BASE/kver" ] \
  && [ -e "$BASE/$(cat "$BASE/kver")/.built-$(cat "$BASE/kver")-siwparams$SIW_PARAMS-rev$CACHE_REV" ] \
  && command -v qemu-system-x86_64 busybox >/dev/null \
  && { [ "$NET" != passt ] || command -v passt >/dev/null; }; then
  CACHED=1
  KVER=$(cat "$BASE/kver")
fi
if [ "$CACHED" = 0 ]; then
need_apt_update() { ! apt-cache policy linux-image-amd64 2>/dev/null | awk '/Candidate:/{print $2}' | grep -qv '(none)'; }
if need_apt_update; then msg "apt-get update"; apt-get update "${APT_OPTS[@]}" >&2; fi
if [ -z "${KPEER_KVER:-}" ]; then
  if [ -s "$BASE/kver" ] && [ "$REBUILD" != 1 ]; then KVER=$(cat "$BASE/kver")
  else KVER=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{sub("linux-image-","",$2); print $2; exit}'); fi
else KVER=$KPEER_KVER; fi
[ -n "$KVER" ] || die "cannot resolve kernel version"
[ -n "${KPEER_KVER:-}" ] || echo "$KVER" > "$BASE/kver"
B=$BASE/$KVER       # per-kernel build dir
mkdir -p "$B"
KSER=${KVER%%-*}; KSER=$(echo "$KSER" | cut -d. -f1,2)   # e.g. 6.1
missing=()
for p in $HOSTPKGS "linux-headers-$KVER"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  msg "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y "${APT_OPTS[@]}" --no-install-recommends "${missing[@]}" >&2
fi
fi # CACHED
B=$BASE/$KVER
KSER=${KVER%%-*}; KSER=$(echo "$KSER" | cut -d. -f1,2)   # e.g. 6.1

GPKGS="linux-image-$KVER nfs-kernel-server libc6 libcap2 libcom-err2 libkeyutils1 libtirpc3
  libtirpc-common libblkid1 libbsd0 libgssapi-krb5-2 libk5crypto3 libkrb5-3 libkrb5support0
  libmd0 libmnl0 libnsl2 libuuid1 libwrap0 iproute2"
STAMP=$B/.built-$KVER-siwparams$SIW_PARAMS-rev$CACHE_REV
if [ "$REBUILD" = 1 ] || [ ! -e "$STAMP" ]; then
  msg "building guest for $KVER in $B"
  rm -rf "$B/debs" "$B/stage" "$B/siw" "$B/lsrc" "$B/root" "$B/base.cpio" "$B"/.built-*
  mkdir -p "$B/debs" "$B/stage" "$B/lsrc"
  chmod 777 "$B/debs"   # lets apt's _apt sandbox user write there
  KVERSION=$(apt-cache policy "linux-image-$KVER" | awk '/Candidate:/{print $2}')
  # shellcheck disable=SC2086  # GPKGS is a word list
  dl() { ( cd "$B/debs" && apt-get download -q $GPKGS "linux-source-$KSER=$KVERSION" >&2 ); }
  dl || { msg "apt-get download failed; apt-get update and retry"; apt-get update "${APT_OPTS[@]}" >&2; dl; }
  for d in "$B"/debs/*.deb; do
    case "$d" in */linux-source-*) ;; *) dpkg-deb -x "$d" "$B/stage" ;; esac
  done
  msg "extracting siw sources from linux-source-$KSER $KVERSION"
  dpkg-deb --fsys-tarfile "$B"/debs/linux-source-"$KSER"_*.deb \
    | tar -xO "./usr/src/linux-source-$KSER.tar.xz" | xz -dc -T0 \
    | tar -x -C "$B/lsrc" --wildcards "linux-source-$KSER/drivers/infiniband/sw/siw/*"
  cp -r "$B/lsrc/linux-source-$KSER/drivers/infiniband/sw/siw" "$B/siw"
  rm -rf "$B/lsrc"
  if [ "$SIW_PARAMS" = 1 ]; then
    # Stock siw hard-codes these as 'const bool'; make them module parameters
    # (same defaults) so MPA behaviour can be changed at insmod time / via sysfs.
    for v in try_gso mpa_crc_required mpa_crc_strict siw_tcp_nagle peer_to_peer; do
      sed -i "s/^extern const bool $v;/extern bool $v;/" "$B/siw/siw.h"
      sed -i "s/^const bool $v\( = true\)\?;/bool $v\1;\nmodule_param($v, bool, 0644);/" "$B/siw/siw_main.c"
    done
    sed -i 's/^u_char mpa_version = MPA_REVISION_2;/u_char mpa_version = MPA_REVISION_2;\nmodule_param(mpa_version, byte, 0644);/' "$B/siw/siw_main.c"
    grep -c '^module_param' "$B/siw/siw_main.c" | grep -qx 6 || die "siw param patch failed"
  fi
  msg "building siw.ko against /usr/src/linux-headers-$KVER"
  make -s -C "/usr/src/linux-headers-$KVER" M="$B/siw" CONFIG_RDMA_SIW=m modules >"$B/siw-build.log" 2>&1 \
    || { cat "$B/siw-build.log" >&2; exit 1; }
  strip --strip-debug "$B/siw/siw.ko"
  rm -f "$B"/debs/linux-source-*.deb    # 140 MB; only siw/ was needed from it

  # Base initramfs: kernel modules, nfs-utils binaries and their libraries.
  # guest/{init,exports,...} are packed per run into a second cpio archive
  # (the kernel unpacks concatenated archives in order), so edits to guest/
  # take effect without a rebuild and nothing per-run is written here.
  msg "packing base initramfs"
  ROOT=$B/root
  mkdir -p "$ROOT"/{bin,sbin,etc/kpeer,lib/x86_64-linux-gnu,usr/sbin,usr/bin,var/lib/nfs,proc,sys,dev,lib64}
  ln -s /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$ROOT/lib64/ld-linux-x86-64.so.2"
  cp "$(command -v busybox)" "$ROOT/bin/busybox"
  MODROOT=$B/stage/lib/modules/$KVER
  MODS=$(python3 "$HERE/tools/closure.py" mods "$MODROOT" virtio_pci virtio_net e1000 crc32c_generic crc32c_intel nfsd rpcrdma "$B/siw/siw.ko")
  mkdir -p "$ROOT/lib/modules/$KVER"
  : > "$ROOT/etc/kpeer/modules.order"
  for m in $MODS; do
    k=$(basename "$m"); k=${k%.xz}; k=${k%.zst}   # busybox insmod wants plain .ko
    case "$m" in
      *.ko.xz) xz -dc "$m" > "$ROOT/lib/modules/$KVER/$k" ;;
      *.ko.zst) zstd -qdc "$m" > "$ROOT/lib/modules/$KVER/$k" ;;
      *) cp "$m" "$ROOT/lib/modules/$KVER/$k" ;;
    esac
    echo "/lib/modules/$KVER/$k" >> "$ROOT/etc/kpeer/modules.order"
  done
  BINS="usr/sbin/rpc.nfsd usr/sbin/rpc.mountd usr/sbin/exportfs usr/bin/rdma"
  for b in $BINS; do cp "$B/stage/$b" "$ROOT/$b"; done
  # shellcheck disable=SC2086  # BINS is a word list
  LIBS=$(cd "$B/stage" && python3 "$HERE/tools/closure.py" libs . $BINS)
  for l in $LIBS; do
    cp -L "$B/stage/$l" "$ROOT/lib/x86_64-linux-gnu/$(basename "$l")"
  done
  cp "$B/stage/etc/netconfig" "$ROOT/etc/netconfig"
  printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$ROOT/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$ROOT/etc/group"
  : > "$ROOT/etc/nfs.conf"
  ( cd "$ROOT" && find . | LC_ALL=C sort | busybox cpio -o -H newc 2>/dev/null ) > "$B/base.cpio.tmp"
  mv "$B/base.cpio.tmp" "$B/base.cpio"
  rm -rf "$ROOT" "$B/debs"
  # Keep only what boot needs from stage: the kernel image.
  find "$B/stage" -mindepth 1 -maxdepth 1 ! -name boot -exec rm -rf {} +
  touch "$STAMP"
  msg "build done"
fi
KERNEL=$B/stage/boot/vmlinuz-$KVER
if [ ! -s "$KERNEL" ] || [ ! -s "$B/base.cpio" ]; then die "build cache $B incomplete; rerun with KPEER_REBUILD=1"; fi

# Optional extra kernel modules (KPEER_EXTRA_MODS), in a cpio of their own
# so the base cache stays as it is.
XCPIO=""
if [ -n "${KPEER_EXTRA_MODS:-}" ]; then
  XKEY=$(echo "$KPEER_EXTRA_MODS" | tr ' ' '\n' | grep . | LC_ALL=C sort -u | tr '\n' '+')
  XCPIO=$B/extra-mods-${XKEY%+}.cpio
  if [ "$REBUILD" = 1 ] || [ ! -s "$XCPIO" ]; then
    msg "extra modules: $KPEER_EXTRA_MODS"
    X=$B/xmods
    rm -rf "$X"; mkdir -p "$X/debs" "$X/stage" "$X/root/etc/kpeer" "$X/root/lib/modules/$KVER/extra"
    chmod 777 "$X/debs"
    ( cd "$X/debs" && apt-get download -q "linux-image-$KVER" >&2 ) \
      || { apt-get update "${APT_OPTS[@]}" >&2; ( cd "$X/debs" && apt-get download -q "linux-image-$KVER" >&2 ); }
    dpkg-deb -x "$X"/debs/linux-image-*.deb "$X/stage"
    # shellcheck disable=SC2086  # module list
    XMODS=$(python3 "$HERE/tools/closure.py" mods "$X/stage/lib/modules/$KVER" $KPEER_EXTRA_MODS)
    : > "$X/root/etc/kpeer/extra-modules.order"
    for m in $XMODS; do
      k=$(basename "$m"); k=${k%.xz}; k=${k%.zst}
      case "$m" in
        *.ko.xz) xz -dc "$m" > "$X/root/lib/modules/$KVER/extra/$k" ;;
        *.ko.zst) zstd -qdc "$m" > "$X/root/lib/modules/$KVER/extra/$k" ;;
        *) cp "$m" "$X/root/lib/modules/$KVER/extra/$k" ;;
      esac
      echo "/lib/modules/$KVER/extra/$k" >> "$X/root/etc/kpeer/extra-modules.order"
    done
    ( cd "$X/root" && find . | LC_ALL=C sort | busybox cpio -o -H newc 2>/dev/null ) > "$XCPIO.tmp"
    mv "$XCPIO.tmp" "$XCPIO"
    rm -rf "$X"
  fi
fi

# The ext4 export (guest/init kpeer.exportfs=ext4, the default): Linux 6.1's
# tmpfs has no user.* extended attributes (RFC 8276 GETXATTR etc. need
# them), ext4 does. ext4 and brd (the RAM disk it is made on) with their
# module dependencies, mke2fs, and getfattr/setfattr for the control shell
# go into a cpio of their own, so the base cache (and its CACHE_REV, shared
# with every run.sh using the build dir) stays as it is. XFS (module and
# mkfs.xfs) comes with it for kpeer.exportfs=xfs: with reflink, knfsd's
# COPY clones extents instead of copying data (vfs_copy_file_range tries
# remap_file_range first). ethtool rides along for guest/init's
# kpeer-netreset (a transmit ring reset, ethtool -G).
FSREV=3
FSCPIO=$B/exportfs-rev$FSREV.cpio
if [ "$REBUILD" = 1 ] || [ ! -s "$FSCPIO" ]; then
  msg "export file systems: ext4, xfs and brd modules, e2fsprogs, xfsprogs, attr"
  X=$B/fsx
  rm -rf "$X"; mkdir -p "$X/debs" "$X/stage" "$X/root/etc/kpeer" "$X/root/lib/modules/$KVER/exportfs" \
    "$X/root/sbin" "$X/root/usr/bin" "$X/root/lib/x86_64-linux-gnu"
  chmod 777 "$X/debs"
  FSPKGS="linux-image-$KVER e2fsprogs libext2fs2 libss2 libcom-err2 libblkid1 libuuid1 libc6 attr libattr1 xfsprogs libinih1 liburcu8 ethtool libmnl0"
  # shellcheck disable=SC2086  # FSPKGS is a word list
  fsdl() { ( cd "$X/debs" && apt-get download -q $FSPKGS >&2 ); }
  fsdl || { apt-get update "${APT_OPTS[@]}" >&2; fsdl; }
  for d in "$X"/debs/*.deb; do dpkg-deb -x "$d" "$X/stage"; done
  # exportfs-modules.order: brd and ext4, loaded for either file system;
  # xfs-modules.order: what xfs needs beyond them.
  for fs in ext4 xfs; do
    if [ $fs = ext4 ]; then
      order=exportfs-modules.order
      FSMODS=$(python3 "$HERE/tools/closure.py" mods "$X/stage/lib/modules/$KVER" ext4 brd)
    else
      order=xfs-modules.order
      FSMODS=$(python3 "$HERE/tools/closure.py" mods "$X/stage/lib/modules/$KVER" xfs)
    fi
    : > "$X/root/etc/kpeer/$order"
    for m in $FSMODS; do
      k=$(basename "$m"); k=${k%.xz}; k=${k%.zst}
      [ -e "$X/root/lib/modules/$KVER/exportfs/$k" ] && continue
      case "$m" in
        *.ko.xz) xz -dc "$m" > "$X/root/lib/modules/$KVER/exportfs/$k" ;;
        *.ko.zst) zstd -qdc "$m" > "$X/root/lib/modules/$KVER/exportfs/$k" ;;
        *) cp "$m" "$X/root/lib/modules/$KVER/exportfs/$k" ;;
      esac
      echo "/lib/modules/$KVER/exportfs/$k" >> "$X/root/etc/kpeer/$order"
    done
  done
  FSBINS="sbin/mke2fs sbin/mkfs.xfs sbin/ethtool usr/bin/getfattr usr/bin/setfattr"
  for b in $FSBINS; do cp "$X/stage/$b" "$X/root/$b"; done
  ln -s mke2fs "$X/root/sbin/mkfs.ext4"
  # shellcheck disable=SC2086  # FSBINS is a word list
  for l in $(cd "$X/stage" && python3 "$HERE/tools/closure.py" libs . $FSBINS); do
    cp -L "$X/stage/$l" "$X/root/lib/x86_64-linux-gnu/$(basename "$l")"
  done
  ( cd "$X/root" && find . | LC_ALL=C sort | busybox cpio -o -H newc 2>/dev/null ) > "$FSCPIO.tmp"
  mv "$FSCPIO.tmp" "$FSCPIO"
  rm -rf "$X"
fi

if [ "$BUILD_ONLY" = 1 ]; then
  exec 9>&-
  msg "build only: cache ready in $B"
  exit 0
fi

# Per-run initrd (in the run dir): base.cpio + an overlay with guest/*.
# Copied while holding the lock so a concurrent KPEER_REBUILD cannot race us.
msg "packing initramfs into $R"
OV=$R/overlay
rm -rf "$OV"
mkdir -p "$OV/etc"
cp "$HERE/guest/exports" "$HERE/guest/hosts" "$HERE/guest/nsswitch.conf" "$OV/etc/"
cp "$HERE/guest/init" "$OV/init"; chmod 755 "$OV/init"
# Host executables and rdma-core userspace (KPEER_EXTRA, KPEER_EXTRA_RDMA_USER).
copy_libs() { # ELF files -> their shared libraries into the overlay
  local l
  for l in $(ldd "$@" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u); do
    cp -L "$l" "$OV/lib/x86_64-linux-gnu/$(basename "$l")"
  done
}
if [ -n "${KPEER_EXTRA:-}" ] || [ "${KPEER_EXTRA_RDMA_USER:-0}" = 1 ]; then
  mkdir -p "$OV/usr/local/bin" "$OV/lib/x86_64-linux-gnu"
  for f in ${KPEER_EXTRA:-}; do
    [ -f "$f" ] || die "KPEER_EXTRA: no file $f"
    cp "$f" "$OV/usr/local/bin/"
    copy_libs "$f"
  done
  if [ "${KPEER_EXTRA_RDMA_USER:-0}" = 1 ]; then
    PDIR=/usr/lib/x86_64-linux-gnu/libibverbs
    [ -d "$PDIR" ] && [ -d /etc/libibverbs.d ] || die "KPEER_EXTRA_RDMA_USER: install ibverbs-providers on the host"
    mkdir -p "$OV$PDIR" "$OV/etc/libibverbs.d"
    cp /etc/libibverbs.d/rxe.driver /etc/libibverbs.d/siw.driver "$OV/etc/libibverbs.d/"
    cp -L "$PDIR"/librxe-rdmav*.so "$PDIR"/libsiw-rdmav*.so "$OV$PDIR/"
    copy_libs "$PDIR"/librxe-rdmav*.so "$PDIR"/libsiw-rdmav*.so \
      /usr/lib/x86_64-linux-gnu/libibverbs.so.1 /usr/lib/x86_64-linux-gnu/librdmacm.so.1
    cp -L /usr/lib/x86_64-linux-gnu/libibverbs.so.1 /usr/lib/x86_64-linux-gnu/librdmacm.so.1 "$OV/lib/x86_64-linux-gnu/"
  fi
fi
cp "$KERNEL" "$R/vmlinuz"
{ cat "$B/base.cpio" "$FSCPIO"; [ -z "$XCPIO" ] || cat "$XCPIO"; ( cd "$OV" && find . | LC_ALL=C sort | busybox cpio -o -H newc 2>/dev/null ); } > "$R/initrd.cpio"
rm -rf "$OV"
exec 9>&-   # release the build lock; qemu must not inherit it

# ---------------------------------------------------------------- 3. boot
APPEND="console=ttyS0 panic=-1 rdinit=/init ${KPEER_APPEND:-}"
# passt carries frames up to 65520 bytes (its default MTU); the guest's
# eth0 takes that MTU, so TCP's MSS grows ~45x and siw's FPDUs (sized to
# the MSS) are bounded by the work request instead.
[ "$NET" = passt ] && APPEND="$APPEND kpeer.mtu=65520"
PASSTPID=$R/passt.pid
stop_passt() {
  local pid
  pid=$(cat "$PASSTPID" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q passt "/proc/$pid/cmdline" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
  fi
  rm -f "$PASSTPID"
}
start_passt() { # passt for one qemu (-1: it exits when qemu closes the socket)
  stop_passt
  rm -f "$R/passt.sock"
  # In the foreground (-f) so that $! is its PID. --runas keeps our own
  # user: as root passt would switch to nobody, who cannot reach the run dir.
  setsid passt -f -q -1 -4 --runas "$(id -u):$(id -g)" -s "$R/passt.sock" \
    -a 10.0.2.15 -n 24 -g 10.0.2.2 -m 65520 --no-dhcp-dns --no-dhcp-search \
    -t "127.0.0.1/$TCP_PORT:2049" -t "127.0.0.1/$RDMA_PORT:20049" -t "127.0.0.1/$SHELL_PORT:22" \
    </dev/null >"$R/passt.log" 2>&1 &
  echo $! > "$PASSTPID"
  for _ in $(seq 50); do
    [ -S "$R/passt.sock" ] && return 0
    kill -0 "$(cat "$PASSTPID")" 2>/dev/null || break
    sleep 0.1
  done
  echo "kpeer: passt did not start:" >&2; grep -v syslog "$R/passt.log" >&2; stop_passt; return 1
}
stop_qemu() {
  local pid
  pid=$(cat "$PIDF" 2>/dev/null || true)
  if is_qemu "$pid"; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$PIDF"
  stop_passt
}
ok=0
cleanup() { [ "$ok" = 1 ] || stop_qemu; }
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

watch() { # kill qemu $1 once process $KPEER_WATCH_PID is gone
  [ -n "${KPEER_WATCH_PID:-}" ] || return 0
  # shellcheck disable=SC2016  # $1/$2 are expanded by the inner sh
  setsid sh -c 'while kill -0 "$1" 2>/dev/null && kill -0 "$2" 2>/dev/null; do sleep 1; done
    if kill -0 "$2" 2>/dev/null && grep -q qemu-system "/proc/$2/cmdline" 2>/dev/null; then kill "$2"; fi' \
    kpeer-watch "$KPEER_WATCH_PID" "$1" </dev/null >/dev/null 2>&1 &
}
boot() { # $1 = kvm|tcg
  local acc=$1 cpu
  if [ "$acc" = kvm ]; then cpu=${KPEER_KVM_CPU:-host}; else cpu=max; fi
  # Under TCG on a loaded host the guest's check of the IO-APIC timer
  # can miss its ticks and panic ("IO-APIC + timer doesn't work!");
  # no_timer_check skips it (Documentation/admin-guide/kernel-parameters).
  local append=$APPEND
  if [ "$acc" = tcg ]; then append="$append no_timer_check"; fi
  local dump=() net
  if [ "$NET" = passt ]; then
    start_passt || return 1
    net="stream,id=n0,server=off,addr.type=unix,addr.path=$R/passt.sock"
  else
    net="user,id=n0,hostfwd=tcp:127.0.0.1:$TCP_PORT-:2049,hostfwd=tcp:127.0.0.1:$RDMA_PORT-:20049,hostfwd=tcp:127.0.0.1:$SHELL_PORT-:22"
  fi
  if [ -n "${KPEER_PCAP:-}" ]; then dump=(-object "filter-dump,id=d0,netdev=n0,file=$KPEER_PCAP"); fi
  rm -f "$LOG" "$PIDF"
  qemu-system-x86_64 -name kpeer -machine q35 -accel "$acc" -cpu "$cpu" -m "$MEM" -smp "$SMP" \
    -kernel "$R/vmlinuz" -initrd "$R/initrd.cpio" -append "$append" \
    -netdev "$net" \
    -device "$NICDEV,netdev=n0" "${dump[@]}" \
    -display none -monitor none -serial "file:$LOG" -no-reboot \
    -daemonize -pidfile "$PIDF" >"$R/qemu.out" 2>&1 || { cat "$R/qemu.out" >&2; rm -f "$PIDF"; stop_passt; return 1; }
  echo "$acc" > "$R/accel"
  watch "$(cat "$PIDF")"
}
# kvm_usable: /dev/kvm is there and ours, and qemu can run a vCPU of the
# KVM model on it. Under some nested hypervisors qemu aborts at the first
# vCPU reset ("failed to set MSR ... Assertion failed"), which should not
# reach the screen of a user who never asked for KVM: a bare guest (no
# disk, no network) that still runs after KPEER_KVM_START_PROBE seconds
# passes; what qemu said is in $R/kvm-probe.out.
kvm_usable() {
  [ -c /dev/kvm ] && [ -r /dev/kvm ] && [ -w /dev/kvm ] || return 1
  local rc=0
  # In a subshell whose stderr is the file (and which does not exec its
  # command, hence the exit): the shell's own "Aborted" report of qemu's
  # death goes there too.
  (timeout "${KPEER_KVM_START_PROBE:-2}" qemu-system-x86_64 -machine q35 -accel kvm -cpu "${KPEER_KVM_CPU:-host}" -m 64 \
    -display none -nodefaults -no-reboot -serial none -monitor none; exit $?) >"$R/kvm-probe.out" 2>&1 || rc=$?
  [ "$rc" = 124 ] # still running when timeout ended it
}
wait_for() { # $1 = regex, $2 = seconds; returns 0 found, 1 timeout, 2 qemu died, 3 guest FAILED
  local end=$(( $(date +%s) + $2 ))
  while [ "$(date +%s)" -lt "$end" ]; do
    grep -qE "$1" "$LOG" 2>/dev/null && return 0
    grep -q 'kpeer: FAILED' "$LOG" 2>/dev/null && return 3
    kill -0 "$(cat "$PIDF" 2>/dev/null)" 2>/dev/null || return 2
    sleep 0.1
  done
  return 1
}

used=""
if [ "$ACCEL" = auto ] || [ "$ACCEL" = kvm ]; then
  if kvm_usable && boot kvm; then
    msg "qemu started with KVM (pid $(cat "$PIDF")), probing ${KVM_PROBE}s for kernel banner"
    set +e; wait_for 'kpeer: uptime .*loading modules' "$KVM_PROBE"; rc=$?; set -e
    if [ $rc = 0 ]; then used=kvm; else
      msg "KVM boot did not reach /init (rc=$rc); serial tail:"; tail -5 "$LOG" >&2 || true
      cp "$LOG" "$R/serial-kvm-failed.log" 2>/dev/null || true
      stop_qemu
      if [ "$ACCEL" = kvm ]; then exit 1; fi
    fi
  else
    if [ "$ACCEL" = kvm ]; then die "KVM unavailable (/dev/kvm), or qemu cannot run a KVM vCPU here ($R/kvm-probe.out), or refused to start with it"; fi
    msg "no usable KVM (no /dev/kvm, or qemu cannot run a KVM vCPU here: $R/kvm-probe.out); using TCG"
  fi
fi
if [ -z "$used" ]; then
  boot tcg || die "qemu failed to start (TCG); ports $TCP_PORT/$RDMA_PORT/$SHELL_PORT busy?"
  used=tcg
  msg "qemu started with TCG (pid $(cat "$PIDF"))"
fi
set +e; wait_for 'kpeer: READY' "$TIMEOUT"; rc=$?; set -e
if [ $rc != 0 ]; then
  msg "guest did not become READY (rc=$rc); see $LOG"; tail -30 "$LOG" >&2 || true
  exit 1
fi
ok=1
msg "$(grep -m1 'kpeer: READY' "$LOG" | tr -d '\r') accel=$used pid=$(cat "$PIDF")"
echo "kpeer: NFS/TCP 127.0.0.1:$TCP_PORT  NFS/RDMA(iWARP siw) 127.0.0.1:$RDMA_PORT  shell 127.0.0.1:$SHELL_PORT  pid $(cat "$PIDF")  log $LOG"
