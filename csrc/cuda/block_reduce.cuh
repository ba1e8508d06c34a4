// Deterministic warp and block sums (and maxima) of several values at once (fixed shuffle trees, no atomics), for the
// per-row reductions of the loss kernels. Torch-free.
#pragma once

#include <cuda_runtime.h>

namespace rlk {
namespace cuda {

template <typename A>
__device__ __forceinline__ A warp_sum(A x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_down_sync(0xffffffffu, x, offset);
  return x;
}

// Sums v[0..N) over the block; the totals are valid in thread 0. `smem` holds N * (kThreads / 32) values.
// Every thread of the block must call it (it synchronizes).
template <int kThreads, typename A, int N>
__device__ __forceinline__ void block_sum(A (&v)[N], A* smem) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const A s = warp_sum(v[k]);
    if (lane == 0) smem[k * kWarps + warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = warp_sum(lane < kWarps ? smem[k * kWarps + lane] : A(0));
  }
}

template <typename A>
__device__ __forceinline__ A warp_max(A x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const A y = __shfl_down_sync(0xffffffffu, x, offset);
    x = y > x ? y : x;
  }
  return x;
}

// Maxima of v[0..N) over the block (each at least `lowest`); valid in thread 0, as block_sum.
template <int kThreads, typename A, int N>
__device__ __forceinline__ void block_max(A (&v)[N], A* smem, A lowest) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const A s = warp_max(v[k]);
    if (lane == 0) smem[k * kWarps + warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = warp_max(lane < kWarps ? smem[k * kWarps + lane] : lowest);
  }
}

}  // namespace cuda
}  // namespace rlk
