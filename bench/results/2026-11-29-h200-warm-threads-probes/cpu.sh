#!/bin/bash
# The machine's CPUs without sop: cpu.c alone on each CPU, with a second thread on each other CPU,
# and on all sixteen; then warm.c (the library of this tree) with one thread on each CPU in turn.
# Run from the repository's root: cpu.sh OUT
O=$1; R=$PWD; D=$R/bench/results/2026-11-29-h200-warm-threads-probes
export NCCL_NVLS_ENABLE=0; . bench/lto-cc.sh
cc -O2 -o /tmp/cpu $D/cpu.c -lpthread || exit 1
rm -rf /tmp/kb && mkdir -p /tmp/kb && cp -r lib include meson.build meson_options.txt test bench tools examples /tmp/kb/
(cd /tmp/kb && meson setup build --buildtype=release -Dtests=false > /tmp/kb.log 2>&1 && ninja -C build >> /tmp/kb.log 2>&1 &&
 cc -O2 -o warm $D/warm.c -Iinclude -I/usr/local/cuda/include -Lbuild -lsop -Wl,-rpath,/tmp/kb/build -lpthread -ldl -lrt) || { tail -30 /tmp/kb.log; exit 1; }
N=$(nproc); ALL=$(seq -s ' ' 0 $((N - 1)))
{
echo "# alu, one thread on each CPU"; for c in $ALL; do /tmp/cpu alu 100000000 $c; done
echo "# alu, CPU 0 with each other CPU"; for c in $(seq 1 $((N - 1))); do /tmp/cpu alu 100000000 0 $c; done
echo "# alu, CPU 1 with each other CPU"; for c in 0 $(seq 2 $((N - 1))); do /tmp/cpu alu 100000000 1 $c; done
echo "# alu, all"; for r in 1 2 3; do /tmp/cpu alu 100000000 $ALL; done
echo "# mem, one thread on CPU 0, 1, 2"; for c in 0 1 2; do /tmp/cpu mem 30000000 $c; done
echo "# mem, all"; for r in 1 2 3; do /tmp/cpu mem 30000000 $ALL; done
} > $O/cpu.txt 2>&1
{
echo "# warm.c, one thread pinned to each CPU, twice"; for r in 1 2; do for c in $ALL; do echo "cpu $c $(taskset -c $c /tmp/kb/warm 1 1000000)"; done; done
echo "# warm.c, one thread unpinned, five times"; for r in 1 2 3 4 5; do /tmp/kb/warm 1 1000000; done
echo "# queries alone, one thread pinned to CPUs 0-3"; for c in 0 1 2 3; do echo "cpu $c $(QUERIES=1 taskset -c $c /tmp/kb/warm 1 3000000)"; done
} > $O/warm-cpus.txt 2>&1
{
echo "# tput, one thread on CPU 0"; /tmp/cpu tput 50000000 0
echo "# tput, CPU 0 with each other CPU"; for c in $(seq 1 $((N - 1))); do /tmp/cpu tput 50000000 0 $c; done
echo "# tput, CPU 5 with each other CPU"; for c in $(seq 0 4) $(seq 6 $((N - 1))); do /tmp/cpu tput 50000000 5 $c; done
echo "# tput, all"; /tmp/cpu tput 50000000 $ALL
echo "# mem, CPU 0 with each other CPU"; for c in $(seq 1 $((N - 1))); do /tmp/cpu mem 30000000 0 $c; done
} > $O/cpu-pairs.txt 2>&1
