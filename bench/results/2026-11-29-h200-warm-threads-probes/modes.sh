#!/bin/bash
# One thread's pair, process by process: with address-space randomization and without, with
# malloc on transparent huge pages, and the driver's two queries alone.
# Run from the repository's root: modes.sh OUT
O=$1; R=$PWD; D=$R/bench/results/2026-11-29-h200-warm-threads-probes
export NCCL_NVLS_ENABLE=0; . bench/lto-cc.sh
rm -rf /tmp/kb && mkdir -p /tmp/kb && cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/kb/
(cd /tmp/kb && meson setup build --buildtype=release -Dtests=false > /tmp/kb.log 2>&1 && ninja -C build >> /tmp/kb.log 2>&1 &&
 cc -O2 -o warm $D/warm.c -Iinclude -I/usr/local/cuda/include -Lbuild -lsop -Wl,-rpath,/tmp/kb/build -lpthread -ldl -lrt) || { tail -30 /tmp/kb.log; exit 1; }
W=/tmp/kb/warm; t() { grep -o '[0-9.]* ns' | tr '\n' ' '; }
{
cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag 2>&1
echo "randomized:    $(for i in $(seq 10); do $W 1 1000000; done | t)"
echo "fixed layout:  $(for i in $(seq 10); do setarch -R $W 1 1000000; done | t)"
echo "malloc on THP: $(for i in $(seq 10); do GLIBC_TUNABLES=glibc.malloc.hugetlb=1 $W 1 1000000; done | t)"
echo "queries:       $(for i in $(seq 10); do QUERIES=1 $W 1 3000000; done | t)"
echo "16 threads:    $(for i in $(seq 4); do $W 16 1000000; done | t)"
echo "16, THP:       $(for i in $(seq 4); do GLIBC_TUNABLES=glibc.malloc.hugetlb=1 $W 16 1000000; done | t)"
} > $O/modes.txt 2>&1
