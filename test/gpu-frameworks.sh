#!/bin/sh
# gpu-frameworks.sh SOP-RUN FRAMEWORKS.PY: PyTorch (a training loop, a transformer trained on
# sequence lengths that change every step, torch.cuda.graph capture and replay, Hugging Face
# transformers' generation, and, where there are two GPUs, DistributedDataParallel over NCCL),
# CuPy and JAX, each where it is installed, run the same short program without sop and under
# sop-run: the results must be equal (numbers to a relative 1e-5: a library may pick another
# algorithm for another address, and float sums then differ in their last digits) and, under
# sop-run, the memory sop's. Skips (77) where none of them is installed.
run=$1
py=$2
ran=0
for fw in torch torch_train torch_graph torch_generate torch_ddp cupy jax; do
	python3 -c "import ${fw%_*}" >/dev/null 2>&1 || continue
	if [ $fw = torch_generate ]; then
		python3 -c "import transformers" >/dev/null 2>&1 || continue
	fi
	if [ $fw = torch_ddp ]; then
		python3 -c "import torch, sys; sys.exit(torch.cuda.device_count() < 2 or not torch.distributed.is_nccl_available())" \
			>/dev/null 2>&1 || continue
	fi
	case $fw in
	torch*) set -- PYTORCH_ALLOC_CONF=backend:cudaMallocAsync ;;
	cupy) set -- SOP_UNUSED=1 ;;
	jax) set -- XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async XLA_PYTHON_CLIENT_PREALLOCATE=false ;;
	esac
	plain=$(env "$@" python3 "$py" $fw 2>/dev/null | grep "^$fw:") || { echo "$fw: failed without sop"; exit 1; }
	sop=$(env "$@" "$run" python3 "$py" $fw 2>/dev/null | grep "^$fw:") || { echo "$fw: failed under sop-run"; exit 1; }
	echo "$plain"
	echo "$sop"
	# The same results, with the ownership column told apart.
	if ! python3 - "$(echo "$plain" | sed 's/ sop owns[^:]*: [A-Za-z/]*//g; s/ reserved [0-9]*//')" \
		"$(echo "$sop" | sed 's/ sop owns[^:]*: [A-Za-z/]*//g; s/ reserved [0-9]*//')" <<'PY'
import sys
a, b = sys.argv[1].split(), sys.argv[2].split()
def same(x, y):
    try:
        fx, fy = float(x), float(y)
    except ValueError:
        return x == y
    return abs(fx - fy) <= 1e-5 * max(abs(fx), abs(fy), 1e-30)
sys.exit(0 if len(a) == len(b) and all(same(x, y) for x, y in zip(a, b)) else 1)
PY
	then
		echo "$fw: results differ under sop-run"
		exit 1
	fi
	if echo "$plain $sop" | grep -q "stats ok: False"; then
		echo "$fw: torch.cuda.memory_stats() gives no sensible figures"
		exit 1
	fi
	if echo "$plain $sop" | grep -q "ranks in step: False"; then
		echo "$fw: the ranks' parameters differ"
		exit 1
	fi
	if echo "$sop" | grep -q "replay matches: False"; then
		echo "$fw: a replay differs from the computation it captured"
		exit 1
	fi
	if echo "$sop" | grep -q "sop owns[^:]*: \(False\|None\)"; then
		echo "$fw: memory not sop's under sop-run"
		exit 1
	fi
	ran=$((ran + 1))
done
[ "$ran" -gt 0 ] || { echo "skip: no framework installed"; exit 77; }
echo "frameworks: $ran ok"
