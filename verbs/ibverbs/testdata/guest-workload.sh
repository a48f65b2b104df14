set -e
export PATH=/usr/local/bin:$PATH
D=$1; M=/mnt/w$D; L=/tmp/$D.log
mkdir -p $M
rdmafs mount -o proto=rdma,rdmadev=$D -v rdma,verbs --log $L 10.0.2.15:/ $M
mkdir $M/t$D; cd $M/t$D
dd if=/dev/urandom of=/tmp/src$D bs=1M count=16 2>/dev/null
cp /tmp/src$D big
cd /; rdmafs umount $M
rdmafs mount -o proto=rdma,rdmadev=$D -v rdma,verbs --log $L.2 10.0.2.15:/ $M
cd $M/t$D
a=$(md5sum < /tmp/src$D); b=$(md5sum < big)
[ "$a" = "$b" ] || { echo "checksum mismatch $a $b"; exit 1; }
echo checksum ok
mkdir dir; i=0; while [ $i -lt 200 ]; do : > dir/f$i; i=$((i+1)); done
n=$(ls dir | wc -l); [ "$n" = 200 ] || { echo "dir has $n"; exit 1; }
echo dir ok
echo hello > x; mv x y; ln y z; ln -s y s; [ "$(cat z)" = hello ]; [ "$(readlink s)" = y ]; [ "$(cat s)" = hello ]
[ ! -e x ]
echo names ok
cd /; rdmafs umount $M
cat $L $L.2 > /tmp/$D.all
for w in "writes=\[[^]]" "reply=\[[^]]" "read(pos=" "ERR_VERS"; do
  c=$(grep -c "$w" /tmp/$D.all || true); echo "trace $w: $c"
done
echo WORKLOAD-OK
