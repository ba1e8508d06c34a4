// CUDA's declaration qualifiers for the host compiler (cuda-on-cpu harness). Every function is a host
// function here; kernels are launched through rlk_sim::launch (the preprocessing step rewrites <<<...>>>).
#pragma once

#define __host__
#define __device__
#define __global__
#define __noinline__ __attribute__((noinline))
#define __forceinline__ inline __attribute__((always_inline))
// Register budgets do not exist on the host; what a launch bound promises is not checked.
#define __launch_bounds__(...)
// Block-shared declarations are rewritten into per-block storage by tests/cuda_on_cpu/preprocess.py; one it
// missed stops the build here instead of becoming a variable shared by every block.
#define __shared__ __shared___is_rewritten_by_tests_cuda_on_cpu_preprocess
#define __constant__ __constant___is_not_supported_by_the_cuda_on_cpu_harness
#define __managed__ __managed___is_not_supported_by_the_cuda_on_cpu_harness
