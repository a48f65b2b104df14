# bench-kernel-guest.sh TRANSPORT ROUNDS SIZE [OPS]: runs inside the knfsd
# guest (scripts/bench-kernel.sh pushes it there). Mounts the guest's own
# knfsd twice over TRANSPORT (tcp, siw0 or rxe0): with the Linux kernel
# NFS client (NFSv4.2) and with rdmafs (the rdma-core provider on the same
# device), then runs each workload on both, alternating (kernel first in
# odd rounds, rdmafs first in even ones), and prints one line per run:
#
#   RESULT transport round workload client seconds rpcs entries
#
# git-clone clones a local repository of the tar-x tree (git clone
# --no-local, one pack) into the mount; its entries are the tree's.
# rpcs counts the RPCs (COMPOUNDs, and the kernel's other calls) the
# client sent for the step: the kernel's per-op counts in
# /proc/self/mountstats, rdmafs's in "rdmafs stats". Times come from
# /proc/uptime (10 ms; busybox date has no %N).
export PATH=/usr/local/bin:$PATH
T=$1; ROUNDS=$2; SIZE=$3; OPS=$4
S=10.0.2.15
case $T in
  tcp) KO="vers=4.2,proto=tcp,addr=$S"; RO="proto=tcp" ;;
  *) KO="vers=4.2,proto=rdma,port=20049,addr=$S"; RO="proto=rdma,rdmadev=$T" ;;
esac
K=/mnt/kernel-$T; R=/mnt/rdmafs-$T
mkdir -p $K $R
mount -t nfs4 -o $KO $S:/ $K || { echo "FAILED: kernel mount -o $KO"; exit 1; }
# A CPU profile of the rdmafs daemon for the whole run (the guest has no
# perf); bench-kernel.sh prints its top.
RDMAFS_CPUPROFILE=/tmp/rdmafs-$T.prof rdmafs mount -o $RO $S:/ $R || { echo "FAILED: rdmafs mount -o $RO"; umount $K; exit 1; }
echo "MOUNTS $(grep " $K " /proc/mounts | cut -d' ' -f4) | rdmafs $RO"

now() { cut -d' ' -f1 /proc/uptime; }
# rpcs MNT: RPCs sent so far by the client of MNT.
rpcs() {
  if [ "$1" = $K ]; then
    awk -v m=" $K " 'index($0, "mounted on") { f = index($0, m) > 0; p = 0; next }
      f && /per-op statistics/ { p = 1; next }
      f && p && $1 ~ /^[A-Z_0-9]+:$/ { s += $2 } END { print s + 0 }' /proc/self/mountstats
  else
    rdmafs stats $1 | awk '/^per-op statistics/ { p = 1; next } p && $1 != "op" && NF >= 6 { s += $2 } END { print s + 0 }'
  fi
}
# ops MNT: "OP count" lines, the calls per operation sent so far.
ops() {
  if [ "$1" = $K ]; then
    awk -v m=" $K " 'index($0, "mounted on") { f = index($0, m) > 0; p = 0; next }
      f && /per-op statistics/ { p = 1; next }
      f && p && $1 ~ /^[A-Z_0-9]+:$/ { sub(":", "", $1); print $1, $2 }' /proc/self/mountstats
  else
    rdmafs stats $1 | awk '/^per-op statistics/ { p = 1; next } p && $1 != "op" && NF >= 6 { print $1, $2 }'
  fi
}
dropcaches() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# The tree tar x unpacks: 500 files of 1 KiB in 10 directories.
if [ ! -s /tmp/small.tar ]; then
  mkdir -p /tmp/small && cd /tmp/small
  d=0; while [ $d -lt 10 ]; do
    mkdir -p d$d; f=0
    while [ $f -lt 50 ]; do head -c 1024 /dev/urandom > d$d/f$f; f=$((f+1)); done
    d=$((d+1))
  done
  tar cf /tmp/small.tar . && cd / && rm -rf /tmp/small
fi

# The repository git clone copies: that tree committed, in one pack
# (git is the host's binary, copied in by bench-kernel.sh).
if [ ! -d /tmp/gsrc/.git ]; then
  mkdir -p /tmp/gsrc && tar xf /tmp/small.tar -C /tmp/gsrc && cd /tmp/gsrc &&
    git -c init.defaultBranch=main init -q . && git add . &&
    git -c user.email=bench@kpeer -c user.name=bench commit -q -m tree &&
    git repack -a -d -q || { echo "FAILED: making the repository to clone"; exit 1; }
  cd /
fi

# step CLIENT MNT ROUND WORKLOAD ENTRIES: runs WORKLOAD in the client's
# directory and prints its RESULT line.
step() {
  c=$1 m=$2 r=$3 w=$4 e=$5 D=$2/bench-$1-$T
  case $w in read-direct|read-buffered|ls-l) dropcaches ;; esac
  s0=$(rpcs $m); [ -n "$OPS" ] && ops $m > /tmp/ops0; t0=$(now)
  case $w in
    write-direct) dd if=/dev/zero of=$D/big bs=1M count=$SIZE oflag=direct 2>/dev/null || echo "FAILED: $c $w" ;;
    read-direct) dd if=$D/big of=/dev/null bs=1M iflag=direct 2>/dev/null || echo "FAILED: $c $w" ;;
    write-buffered) dd if=/dev/zero of=$D/bigb bs=1M count=$SIZE conv=fsync 2>/dev/null || echo "FAILED: $c $w" ;;
    read-buffered) dd if=$D/bigb of=/dev/null bs=1M 2>/dev/null || echo "FAILED: $c $w" ;;
    read-4k-random)
      i=0; while [ $i -lt $e ]; do
        dd if=$D/big of=/dev/null bs=4k count=1 skip=$(( (i * 7919) % (SIZE * 256) )) iflag=direct 2>/dev/null || echo "FAILED: $c $w"
        i=$((i+1))
      done ;;
    tar-x) mkdir $D/t$r && tar xf /tmp/small.tar -C $D/t$r || echo "FAILED: $c $w" ;;
    ls-l) [ "$(ls -l $D/ls | wc -l)" -gt 1000 ] || echo "FAILED: $c $w" ;;
    rm-rf) rm -rf $D/t$r || echo "FAILED: $c $w" ;;
    # --no-local: the pack goes through upload-pack and index-pack as
    # from a server, then the checkout writes the tree (upload-pack
    # named as a git subcommand: the guest has only the git binary).
    git-clone) git clone -q --no-local -u 'git upload-pack' /tmp/gsrc $D/g$r 2>/tmp/git-$c.err || echo "FAILED: $c $w: $(tail -3 /tmp/git-$c.err)" ;;
  esac
  t1=$(now); s1=$(rpcs $m)
  # OPS=1: the step's calls per operation, "OPS transport round workload
  # client OP=n ...", for breaking an RPC count down.
  [ -n "$OPS" ] && echo "OPS $T $r $w $c $(ops $m | awk 'NR == FNR { b[$1] = $2; next } $2 - b[$1] > 0 { printf "%s=%d ", $1, $2 - b[$1] }' /tmp/ops0 -)"
  [ $w = git-clone ] && rm -rf $D/g$r
  echo "RESULT $T $r $w $c $(awk -v a=$t0 -v b=$t1 'BEGIN { printf "%.2f", b - a }') $((s1 - s0)) $e"
}

for c in kernel rdmafs; do
  m=$K; [ $c = rdmafs ] && m=$R
  D=$m/bench-$c-$T
  rm -rf $D; mkdir -p $D/ls
  i=0; while [ $i -lt 1000 ]; do : > $D/ls/entry-with-a-longer-name-$i; i=$((i+1)); done
done
r=1
while [ $r -le $ROUNDS ]; do
  for w in write-direct read-direct write-buffered read-buffered read-4k-random tar-x ls-l rm-rf git-clone; do
    case $w in read-4k-random) e=128 ;; tar-x|rm-rf|git-clone) e=510 ;; ls-l) e=1000 ;; *) e=$SIZE ;; esac
    if [ $((r % 2)) = 1 ]; then step kernel $K $r $w $e; step rdmafs $R $r $w $e
    else step rdmafs $R $r $w $e; step kernel $K $r $w $e; fi
  done
  r=$((r+1))
done
rm -rf $K/bench-kernel-$T $R/bench-rdmafs-$T
rdmafs umount $R; umount $K
# The daemon writes the profile as it exits.
i=0; while [ ! -s /tmp/rdmafs-$T.prof ] && [ $i -lt 60 ]; do sleep 1; i=$((i+1)); done
echo "DONE $T"
