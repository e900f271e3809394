#!/usr/bin/env bash
# As run, on two commands of one lease (one command may take at most ten minutes): the suite,
# then, on a fresh machine, the stress in a process session of its own, collected by a later
# command once it had ended.
export CC=/usr/bin/gcc NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
rm -rf bs && meson setup bs --buildtype=release && ninja -C bs
meson test -C bs --suite gpu --print-errorlogs >gpu-suite.txt 2>&1
setsid nohup bs/test/test-integrity --seconds 600 --threads 16 --seed 1129 >integrity.txt 2>&1 </dev/null &
