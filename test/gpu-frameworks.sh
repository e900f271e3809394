#!/bin/sh
# gpu-frameworks.sh SOP-RUN FRAMEWORKS.PY: PyTorch (a training loop, and torch.cuda.graph capture
# and replay), CuPy and JAX, each where it is installed, run the same short program without sop and
# under sop-run: the results must be equal and, under sop-run, the memory sop's. Skips (77) where
# none of them is installed.
run=$1
py=$2
ran=0
for fw in torch torch_graph cupy jax; do
	python3 -c "import ${fw%_graph}" >/dev/null 2>&1 || continue
	case $fw in
	torch | torch_graph) set -- PYTORCH_ALLOC_CONF=backend:cudaMallocAsync ;;
	cupy) set -- SOP_UNUSED=1 ;;
	jax) set -- XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async XLA_PYTHON_CLIENT_PREALLOCATE=false ;;
	esac
	plain=$(env "$@" python3 "$py" $fw 2>/dev/null | grep "^$fw:") || { echo "$fw: failed without sop"; exit 1; }
	sop=$(env "$@" "$run" python3 "$py" $fw 2>/dev/null | grep "^$fw:") || { echo "$fw: failed under sop-run"; exit 1; }
	echo "$plain"
	echo "$sop"
	# The same results, with the ownership column told apart.
	if [ "$(echo "$plain" | sed 's/ sop owns[^:]*: [A-Za-z/]*//g; s/ reserved [0-9]*//')" != "$(echo "$sop" | sed 's/ sop owns[^:]*: [A-Za-z/]*//g; s/ reserved [0-9]*//')" ]; then
		echo "$fw: results differ under sop-run"
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
