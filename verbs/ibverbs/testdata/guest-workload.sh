# guest-workload.sh DEV [SERVER PORT]: mount SERVER (default the guest's
# own knfsd) over RPC-over-RDMA on DEV with rdma-core and run the shell
# workload: 16 MiB written and read back after a remount with a checksum,
# a 200-entry directory, rename, link, symlink; against the guest's knfsd
# also a delegation recall (a second mount over TCP writes a file the
# first holds a read delegation on); then unmount and count the trace
# lines of each chunk type and of the version-2 probe's fallback.
# With RDMAFS_IBVERBS_WINDOWS set (rxe) the mounts expose memory through
# memory windows; WTAG then keeps its names apart from the per-call run.
set -e
export PATH=/usr/local/bin:$PATH
D=$1; S=${2:-10.0.2.15}; P=${3:-}${WTAG:-}
M=/mnt/w$D$P; L=/tmp/$D$P.log
o=proto=rdma,rdmadev=$D
[ -z "${3:-}" ] || o=$o,port=$3
mkdir -p $M
rdmafs mount -o $o -v rdma,verbs --log $L $S:/ $M
mkdir $M/t$D$P; cd $M/t$D$P
dd if=/dev/urandom of=/tmp/src$D bs=1M count=16 2>/dev/null
cp /tmp/src$D big
cd /; rdmafs umount $M
rdmafs mount -o $o -v rdma,verbs --log $L.2 $S:/ $M
cd $M/t$D$P
a=$(md5sum < /tmp/src$D); b=$(md5sum < big)
[ "$a" = "$b" ] || { echo "checksum mismatch $a $b"; exit 1; }
echo checksum ok
mkdir dir; i=0; while [ $i -lt 200 ]; do : > dir/f$i; i=$((i+1)); done
n=$(ls dir | wc -l); [ "$n" = 200 ] || { echo "dir has $n"; exit 1; }
echo dir ok
echo hello > x; mv x y; ln y z; ln -s y s; [ "$(cat z)" = hello ]; [ "$(readlink s)" = y ]; [ "$(cat s)" = hello ]
[ ! -e x ]
echo names ok
dstat() { v=$(rdmafs stats $M | sed -n "s/^delegations:.* $1=\([0-9]*\).*/\1/p"); echo "${v:-0}"; }
if [ -z "${3:-}" ]; then
  B=/mnt/d$D; mkdir -p $B
  rdmafs mount -o proto=tcp $S:/ $B
  echo old > deleg
  # knfsd grants a read delegation once it has probed the callback
  # path (the backchannel on this RPC-over-RDMA connection): open for
  # reading until one more is held (other files may have some already;
  # polling, 100 ms apart).
  h0=$(dstat held); i=0
  while :; do
    exec 3< deleg
    [ "$(dstat held)" -le "$h0" ] || break
    exec 3<&-
    i=$((i+1)); [ $i -lt 150 ] || { echo "knfsd granted no read delegation"; rdmafs stats $M; exit 1; }
    usleep 100000
  done
  [ "$(cat <&3)" = old ] || { echo "read under the delegation"; exit 1; }
  echo "read delegation held"
  # Writing through the other mount makes knfsd recall it.
  echo "new data" > $B/t$D$P/deleg
  [ "$(dstat recalled)" -ge 1 ] || { echo "no recall"; rdmafs stats $M; exit 1; }
  [ "$(cat deleg)" = "new data" ] || { echo "stale data after the recall: $(cat deleg)"; exit 1; }
  exec 3<&-
  rdmafs stats $M | grep -E '^(callbacks|delegations):'
  echo recall ok
  rdmafs umount $B
fi
if [ -n "${RDMAFS_IBVERBS_WINDOWS:-}" ]; then
  wb=$(rdmafs stats $M | sed -n 's/^ *mr window binds: *//p')
  [ "${wb:-0}" -gt 0 ] || { echo "no memory-window binds with RDMAFS_IBVERBS_WINDOWS"; rdmafs stats $M; exit 1; }
  echo "window binds: $wb"
fi
cd /; rdmafs umount $M
cat $L $L.2 > /tmp/$D$P.all
for w in "writes=\[[^]]" "reply=\[[^]]" "read(pos=" "ERR_VERS"; do
  c=$(grep -c "$w" /tmp/$D$P.all || true); echo "trace $w: $c"
done
echo WORKLOAD-OK
