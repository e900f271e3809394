// kernels.cu - device code of sop-bench. Built to PTX by test/gen-kernels.sh (bench bench_kernels_ptx), which writes
// bench/kernels.ptx.h; sop-bench loads it with cuModuleLoadData, so the build needs no nvcc.

// RMM's compute_bound_kernel (multi_stream_allocations): spin until clock64() has advanced by
// `cycles`, then write the clock to *out, so that the kernel uses the memory it was given.
// Launched as one block of one thread: many such kernels fit on the GPU side by side, and
// whether they overlap is what the streams workload measures.
extern "C" __global__ void bench_spin(long long *out, long long cycles)
{
	long long t0 = clock64(), t = t0;

	while (t - t0 < cycles)
		t = clock64();
	*out = t;
}

// Fill n words with v (grid-stride): a short kernel that touches every byte it is given.
extern "C" __global__ void bench_fill(unsigned *p, unsigned long long n, unsigned v)
{
	for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
	     i += (unsigned long long)gridDim.x * blockDim.x)
		p[i] = v;
}
