# guest-bench.sh DEV|tcp: 1 MiB O_DIRECT dd write then read of 64 MiB through rdmafs,
# then 2048 O_DIRECT 4 KiB reads (one READ each).
# Times come from /proc/uptime (10 ms; busybox date has no %N).
export PATH=/usr/local/bin:$PATH
D=$1; M=/mnt/b$D; mkdir -p $M
if [ "$D" = tcp ]; then o=proto=tcp; else o=proto=rdma,rdmadev=$D; fi
RDMAFS_IBVERBS_WINDOWS=1 rdmafs mount -o $o 10.0.2.15:/ $M || exit 1
t0=$(cut -d' ' -f1 /proc/uptime); dd if=/dev/zero of=$M/bench$D bs=1M count=64 oflag=direct 2>/dev/null || echo "write failed"; t1=$(cut -d' ' -f1 /proc/uptime)
echo 3 > /proc/sys/vm/drop_caches
t2=$(cut -d' ' -f1 /proc/uptime); dd if=$M/bench$D of=/dev/null bs=1M iflag=direct 2>/dev/null || echo "read failed"; t3=$(cut -d' ' -f1 /proc/uptime)
echo 3 > /proc/sys/vm/drop_caches
t4=$(cut -d' ' -f1 /proc/uptime); dd if=$M/bench$D of=/dev/null bs=4k count=2048 iflag=direct 2>/dev/null || echo "read4k failed"; t5=$(cut -d' ' -f1 /proc/uptime)
if [ "$D" = rxe0 ]; then
  # 4 KiB O_DIRECT reads with memory windows ($M) against per-call
  # registration (the first mount is made with RDMAFS_IBVERBS_WINDOWS), 5
  # alternating rounds of 512 reads each.
  P=/mnt/p$D; mkdir -p $P
  rdmafs mount -o $o 10.0.2.15:/ $P || echo "per-call mount failed"
  r=""
  for i in 1 2 3 4 5; do
    a=$(cut -d' ' -f1 /proc/uptime); dd if=$M/bench$D of=/dev/null bs=4k count=512 skip=$((i*512)) iflag=direct 2>/dev/null || echo "read4k failed"
    b=$(cut -d' ' -f1 /proc/uptime); dd if=$P/bench$D of=/dev/null bs=4k count=512 skip=$((i*512)) iflag=direct 2>/dev/null || echo "read4k failed"
    c=$(cut -d' ' -f1 /proc/uptime); r="$r $a $b $c"
  done
  rdmafs umount $P
  echo $r | awk 'function med(v, n,  i, j, t) {for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) {t = v[i]; v[i] = v[j]; v[j] = t}; return v[int(n / 2)]}
    {n = 0; for (i = 1; i <= NF; i += 3) {w[n] = 512 / ($(i+1) - $i); p[n] = 512 / ($(i+2) - $(i+1)); q[n] = w[n] / p[n]; n++}
    printf "BENCH rxe0 4k-read windows %.0f IOPS per-call %.0f IOPS (medians of 5 rounds of 512, windows/per-call ratio median %.2f)\n", med(w, n), med(p, n), med(q, n)}'
fi
rm -f $M/bench$D; rdmafs umount $M
awk -v d=$D -v a=$t0 -v b=$t1 -v c=$t2 -v e=$t3 -v f=$t4 -v g=$t5 'BEGIN{printf "BENCH %s write %.1f MB/s read %.1f MB/s 4k-read %.0f IOPS\n", d, 64*1.048576/(b-a), 64*1.048576/(e-c), 2048/(g-f)}'
