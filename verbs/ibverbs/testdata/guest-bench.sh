# guest-bench.sh DEV|tcp: 1 MiB O_DIRECT dd write then read of 64 MiB through rdmafs.
export PATH=/usr/local/bin:$PATH
D=$1; M=/mnt/b$D; mkdir -p $M
if [ "$D" = tcp ]; then o=proto=tcp; else o=proto=rdma,rdmadev=$D; fi
rdmafs mount -o $o 10.0.2.15:/ $M || exit 1
t0=$(date +%s.%N); dd if=/dev/zero of=$M/bench$D bs=1M count=64 oflag=direct 2>/dev/null || echo "write failed"; t1=$(date +%s.%N)
echo 3 > /proc/sys/vm/drop_caches
t2=$(date +%s.%N); dd if=$M/bench$D of=/dev/null bs=1M iflag=direct 2>/dev/null || echo "read failed"; t3=$(date +%s.%N)
rm -f $M/bench$D; rdmafs umount $M
awk -v d=$D -v a=$t0 -v b=$t1 -v c=$t2 -v e=$t3 'BEGIN{printf "BENCH %s write %.1f MB/s read %.1f MB/s\n", d, 64*1.048576/(b-a), 64*1.048576/(e-c)}'
