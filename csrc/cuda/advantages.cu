// group_advantages CUDA kernels. Contiguous groups: one warp per group, the group's pivot-shifted sum
// and centered sum of squares by warp shuffles, every reward read from L1/L2 after the first pass. Group
// statistics are doubles in every path (lanes and atomics add members in turn; fp32 running sums lose the
// small terms that come after large ones).
// Arbitrary groups: statistics accumulate at each group's representative with atomics (count and
// pivot-shifted sum; then the centered sum of squares), and a last pass writes the advantages.
#include "advantages.h"
#include "common.cuh"
#include "rlkernels/advantages.h"

namespace rlk {
namespace cuda {
namespace {

// 8 warps (8 groups) per block.
constexpr int kGroupThreads = 256;
constexpr int kGroupsPerBlock = kGroupThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;

template <typename A>
__device__ __forceinline__ A warp_sum(A x) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) x += __shfl_xor_sync(kFullMask, x, d);
  return x;
}

template <typename A>
__device__ __forceinline__ A batch_std_or_one(const A* batch_std) {
  return batch_std != nullptr ? *batch_std : A(1);
}

template <typename T>
__global__ void __launch_bounds__(kGroupThreads)
    contiguous_kernel(const T* __restrict__ rewards,  // [num_groups * g]
                      T* __restrict__ out,            // [num_groups * g]
                      const typename Acc<T>::type* __restrict__ batch_std,  // [1] or nullptr
                      int64_t num_groups, int64_t g, GroupMode mode, typename Acc<T>::type eps) {
  using A = typename Acc<T>::type;
  const int64_t grp = int64_t(blockIdx.x) * kGroupsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (grp >= num_groups) return;  // the whole warp: the shuffles below stay warp-uniform
  const T* rg = rewards + grp * g;
  T* og = out + grp * g;
  // Each lane's running sums are doubles, as the representative path's: a lane adds g / 32 members in turn.
  const double pivot = double(to_acc(rg[0]));
  double s = 0.0;
  for (int64_t i = lane; i < g; i += 32) s += double(to_acc(rg[i])) - pivot;
  const double mean = pivot + warp_sum(s) / double(g);
  double q = 0.0;
  for (int64_t i = lane; i < g; i += 32) {
    const double d = double(to_acc(rg[i])) - mean;
    q += d * d;
  }
  const A m2 = A(warp_sum(q));
  const A bstd = batch_std_or_one(batch_std);
  for (int64_t i = lane; i < g; i += 32) {
    og[i] = from_acc<T>(group_advantage<A>(mode, A(to_acc(rg[i])), A(g), A(mean), m2, eps, bstd));
  }
}

// The statistics at the representatives are doubles whatever T: atomics add in no fixed order, and an fp32
// running sum loses the small terms that arrive after large ones (order-dependent error); fp64 atomics are
// native from sm_60.
template <typename T>
__global__ void sums_kernel(const T* __restrict__ rewards,  // [b]
                            const int64_t* __restrict__ rep,  // [b]
                            double* __restrict__ count,       // [b] at representatives
                            double* __restrict__ sum,         // [b] at representatives
                            int64_t b) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < b; i += stride) {
    const int64_t g = rep[i];
    atomicAdd(count + g, 1.0);
    atomicAdd(sum + g, double(to_acc(rewards[i])) - double(to_acc(rewards[g])));
  }
}

template <typename T>
__device__ __forceinline__ double group_mean(const T* rewards, const double* count, const double* sum, int64_t g) {
  return double(to_acc(rewards[g])) + sum[g] / count[g];
}

template <typename T>
__global__ void m2_kernel(const T* __restrict__ rewards,   // [b]
                          const int64_t* __restrict__ rep,   // [b]
                          const double* __restrict__ count,  // [b]
                          const double* __restrict__ sum,    // [b]
                          double* __restrict__ m2,           // [b] at representatives
                          int64_t b) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < b; i += stride) {
    const int64_t g = rep[i];
    const double d = double(to_acc(rewards[i])) - group_mean(rewards, count, sum, g);
    atomicAdd(m2 + g, d * d);
  }
}

template <typename T>
__global__ void finish_kernel(const T* __restrict__ rewards,   // [b]
                              const int64_t* __restrict__ rep,   // [b]
                              const double* __restrict__ count,  // [b]
                              const double* __restrict__ sum,    // [b]
                              const double* __restrict__ m2,     // [b]
                              T* __restrict__ out,               // [b]
                              const typename Acc<T>::type* __restrict__ batch_std,  // [1] or nullptr
                              int64_t b, GroupMode mode, typename Acc<T>::type eps) {
  using A = typename Acc<T>::type;
  const A bstd = batch_std_or_one(batch_std);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < b; i += stride) {
    const int64_t g = rep[i];
    out[i] = from_acc<T>(group_advantage<A>(mode, A(to_acc(rewards[i])), A(count[g]),
                                            A(group_mean(rewards, count, sum, g)), A(m2[g]), eps, bstd));
  }
}

}  // namespace

cudaError_t group_advantages_contiguous(DType dtype, const void* rewards, void* out, const void* batch_std,
                                        int64_t num_groups, int64_t group_size, int mode, double eps,
                                        cudaStream_t stream) {
  if (num_groups == 0) return cudaSuccess;
  const int64_t blocks = (num_groups + kGroupsPerBlock - 1) / kGroupsPerBlock;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    contiguous_kernel<T><<<static_cast<unsigned int>(blocks), kGroupThreads, 0, stream>>>(
        static_cast<const T*>(rewards), static_cast<T*>(out), static_cast<const A*>(batch_std), num_groups,
        group_size, GroupMode(mode), A(eps));
  });
  return cudaGetLastError();
}

cudaError_t group_advantages_by_rep(DType dtype, const void* rewards, const int64_t* rep, void* stats, void* out,
                                    const void* batch_std, int64_t b, int mode, double eps, cudaStream_t stream) {
  if (b == 0) return cudaSuccess;
  const unsigned int blocks = elementwise_blocks(b);
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    const T* r = static_cast<const T*>(rewards);
    double* count = static_cast<double*>(stats);
    double* sum = count + b;
    double* m2 = count + 2 * b;
    sums_kernel<T><<<blocks, kElementwiseThreads, 0, stream>>>(r, rep, count, sum, b);
    m2_kernel<T><<<blocks, kElementwiseThreads, 0, stream>>>(r, rep, count, sum, m2, b);
    finish_kernel<T><<<blocks, kElementwiseThreads, 0, stream>>>(r, rep, count, sum, m2, static_cast<T*>(out),
                                                                 static_cast<const A*>(batch_std), b,
                                                                 GroupMode(mode), A(eps));
  });
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rlk
