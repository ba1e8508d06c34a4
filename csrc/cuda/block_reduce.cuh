// Deterministic warp and block reductions (sums, maxima) of several values at once (fixed shuffle trees, no
// atomics), for the per-row reductions of the loss kernels. Torch-free.
#pragma once

#include <cuda_runtime.h>

namespace rlk {
namespace cuda {

struct SumOp {
  template <typename A>
  __device__ __forceinline__ A operator()(A x, A y) const {
    return x + y;
  }
};

struct MaxOp {
  template <typename A>
  __device__ __forceinline__ A operator()(A x, A y) const {
    return y > x ? y : x;
  }
};

template <typename A, typename Op>
__device__ __forceinline__ A warp_reduce(A x, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x = op(x, __shfl_down_sync(0xffffffffu, x, offset));
  return x;
}

// Reduces v[0..N) over the block with `op` (`identity` pads the missing warps); the results are valid in
// thread 0. `smem` holds N * (kThreads / 32) values. Every thread of the block must call it (it synchronizes).
template <int kThreads, typename A, int N, typename Op>
__device__ __forceinline__ void block_reduce(A (&v)[N], A* smem, A identity, Op op) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const A s = warp_reduce(v[k], op);
    if (lane == 0) smem[k * kWarps + warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = warp_reduce(lane < kWarps ? smem[k * kWarps + lane] : identity, op);
  }
}

// Sums of v[0..N) over the block, valid in thread 0.
template <int kThreads, typename A, int N>
__device__ __forceinline__ void block_sum(A (&v)[N], A* smem) {
  block_reduce<kThreads>(v, smem, A(0), SumOp{});
}

// Maxima of v[0..N) over the block (each at least `lowest`), valid in thread 0.
template <int kThreads, typename A, int N>
__device__ __forceinline__ void block_max(A (&v)[N], A* smem, A lowest) {
  block_reduce<kThreads>(v, smem, lowest, MaxOp{});
}

}  // namespace cuda
}  // namespace rlk
