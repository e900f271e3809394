// kernels.cu - device code for the GPU tests. Built to PTX by test/gen-kernels.sh, which writes
// test/kernels.ptx.h; the tests load it with cuModuleLoadData, so the build needs no nvcc.

// Fill n words with v.
extern "C" __global__ void sop_fill(unsigned *p, unsigned long long n, unsigned v)
{
	for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
	     i += (unsigned long long)gridDim.x * blockDim.x)
		p[i] = v;
}

// Count the words of n that are not v into *bad.
extern "C" __global__ void sop_check(const unsigned *p, unsigned long long n, unsigned v,
				     unsigned *bad)
{
	unsigned local = 0;
	for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
	     i += (unsigned long long)gridDim.x * blockDim.x)
		local += p[i] != v;
	if (local)
		atomicAdd(bad, local);
}

// Spin for about `cycles` clock cycles, then fill n words with v: a kernel that is still
// running when the host frees its memory.
extern "C" __global__ void sop_spin_fill(unsigned *p, unsigned long long n, unsigned v,
					 long long cycles)
{
	long long t0 = clock64();
	while (clock64() - t0 < cycles)
		;
	for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
	     i += (unsigned long long)gridDim.x * blockDim.x)
		p[i] = v;
}
