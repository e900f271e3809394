#!/usr/bin/env bash
# bench/clients/run.sh [OUTDIR] [--reps N] [--quick] [--only LIST] [--append]: real programs under
# each allocator they offer, sop (through sop-run) beside the others, in one run on one GPU:
#   PyTorch  torch_gpt.py     native caching allocator | backend:cudaMallocAsync on the driver's
#                             pool | the same under sop-run
#   CuPy     cupy_streams.py  MemoryPool | MemoryAsyncPool | MemoryAsyncPool under sop-run | none
#   JAX      jax_matmul.py    BFC | cuda_async | cuda_async under sop-run
#   serve    torch_serve.py   PyTorch inference, 4 worker threads on streams of their own: native
#                             caching allocator | cudaMallocAsync | the same under sop-run
#   tasks    cupy_tasks.py    CuPy, 4 and 8 threads whose tasks each make and drop a stream:
#                             MemoryPool | MemoryAsyncPool | MemoryAsyncPool under sop-run
#   passthrough (bench/passthrough.c): the cost the interposer adds to calls it passes on, and
#                             the pair of cuMemAllocAsync and cuMemFreeAsync it serves
# Each mode runs --reps times (default 3), a fresh process each, in turn (mode A, B, C, A, B,
# C, ...), so that drift hits every mode alike; report.py takes medians and writes summary.md
# and clients.png. A framework that is not installed is left out; without a GPU this exits 77.
# --only torch,cupy,jax,serve,tasks,passthrough runs those alone; --append adds to OUTDIR's runs rather than
# starting afresh (a long run in parts, each within a time limit).
set -u
cd "$(dirname "$0")/../.."
out=bench/results/$(date -u +%Y-%m-%d)-clients
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then out=$1; shift; fi
reps=3 quick=0 only=torch,cupy,jax,serve,tasks,passthrough append=0
while [ $# -gt 0 ]; do
	case $1 in
	--reps) reps=$2; shift ;;
	--quick) quick=1 ;;
	--only) only=$2; shift ;;
	--append) append=1 ;;
	*) echo "unknown option $1" >&2; exit 2 ;;
	esac
	shift
done
nvidia-smi >/dev/null 2>&1 || { echo "no GPU here: nothing measured"; exit 77; }
build=${SOP_BENCH_BUILD:-build-bench}
if [ ! -f "$build/build.ninja" ]; then
	. bench/lto-cc.sh
	meson setup "$build" --buildtype=release -Dtests=false >/dev/null
fi
ninja -C "$build" >/dev/null || exit 1
run=$build/sop-run
mkdir -p "$out"
res=$out/clients.jsonl
if [ $append = 0 ]; then
	: >"$res"
	{
		echo "commit: $(git describe --always --dirty 2>/dev/null || echo unknown)"
		nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
		python3 -c 'import torch; print("torch", torch.__version__)' 2>/dev/null
		python3 -c 'import cupy; print("cupy", cupy.__version__)' 2>/dev/null
		python3 -c 'import jax; print("jax", jax.__version__)' 2>/dev/null
	} >"$out/machine.txt"
fi

steps=80 citers=3000 jiters=400 requests=400 tasks=40
[ $quick = 1 ] && steps=30 citers=600 jiters=100 requests=100 tasks=10

# one LABEL CMD...: run, tag the JSON line with the label and the rep, keep stderr in the log.
one() {
	local label=$1 rep=$2; shift 2
	local line
	line=$("$@" 2>>"$out/log.txt" | tail -n 1)
	if [ "${line#\{}" != "$line" ]; then
		echo "{\"label\": \"$label\", \"rep\": $rep, ${line#\{}" >>"$res"
		echo "$label #$rep: $line" >&2
	else
		echo "{\"label\": \"$label\", \"rep\": $rep, \"failed\": true}" >>"$res"
		echo "$label #$rep: FAILED (see log.txt)" >&2
	fi
}

want() { case ",$only," in *",$1,"*) return 0 ;; esac; return 1; }

py=bench/clients
for rep in $(seq 1 "$reps"); do
	if want torch && python3 -c 'import torch' 2>/dev/null; then
		one torch-native "$rep" python3 $py/torch_gpt.py --steps $steps
		one torch-driver "$rep" env PYTORCH_ALLOC_CONF=backend:cudaMallocAsync python3 $py/torch_gpt.py --steps $steps
		one torch-sop "$rep" env PYTORCH_ALLOC_CONF=backend:cudaMallocAsync "$run" python3 $py/torch_gpt.py --steps $steps
	fi
	if want cupy && python3 -c 'import cupy' 2>/dev/null; then
		one cupy-default "$rep" python3 $py/cupy_streams.py --pool default --iters $citers
		one cupy-driver "$rep" python3 $py/cupy_streams.py --pool async --iters $citers
		one cupy-sop "$rep" "$run" python3 $py/cupy_streams.py --pool async --iters $citers
		one cupy-none "$rep" python3 $py/cupy_streams.py --pool none --iters $citers
	fi
	if want jax && python3 -c 'import jax' 2>/dev/null; then
		one jax-bfc "$rep" env XLA_PYTHON_CLIENT_PREALLOCATE=false python3 $py/jax_matmul.py --iters $jiters
		one jax-driver "$rep" env XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async XLA_PYTHON_CLIENT_PREALLOCATE=false python3 $py/jax_matmul.py --iters $jiters
		one jax-sop "$rep" env XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async XLA_PYTHON_CLIENT_PREALLOCATE=false "$run" python3 $py/jax_matmul.py --iters $jiters
	fi
	if want serve && python3 -c 'import torch' 2>/dev/null; then
		one serve-native "$rep" python3 $py/torch_serve.py --requests $requests
		one serve-driver "$rep" env PYTORCH_ALLOC_CONF=backend:cudaMallocAsync python3 $py/torch_serve.py --requests $requests
		one serve-sop "$rep" env PYTORCH_ALLOC_CONF=backend:cudaMallocAsync "$run" python3 $py/torch_serve.py --requests $requests
	fi
	if want tasks && python3 -c 'import cupy' 2>/dev/null; then
		for t in 4 8; do
			one tasks-default-$t "$rep" python3 $py/cupy_tasks.py --pool default --threads $t --tasks $tasks
			one tasks-driver-$t "$rep" python3 $py/cupy_tasks.py --pool async --threads $t --tasks $tasks
			one tasks-sop-$t "$rep" "$run" python3 $py/cupy_tasks.py --pool async --threads $t --tasks $tasks
		done
	fi
	if want passthrough; then
		one passthrough-driver "$rep" "$build/bench/sop-passthrough"
		one passthrough-sop "$rep" "$run" "$build/bench/sop-passthrough"
	fi
done
python3 $py/report.py "$out"
