// grpo_passk and opo CUDA kernels: one block walks the responses in the order of a stable sort of their group
// ids (equal ids become runs, each headed by the group's first member), as group_advantages' sorted walk does
// (advantages.cu). Each response's group is named by the sorted position of its run's head (a running max,
// carried between chunks). Each group's statistics accumulate there with atomics (in double whatever the
// scores' dtype: atomics add in no fixed order, which fp32 running sums would depend on), one walk per pass
// that needs the previous pass complete (a barrier between walks; the statistics read past L1), then a walk
// writes each response's advantage (rlkernels/outcome_estimators.h): one launch after the sort. CUDA has no
// float atomicMax: the best and second-best scores are kept as ordered integer keys (key(a) < key(b) iff
// a < b), whose atomicMax is the float max.
#include <limits>

#include "block_reduce.cuh"
#include "common.cuh"
#include "last_block.cuh"
#include "outcome_estimators.h"
#include "rlkernels/outcome_estimators.h"

namespace rlk {
namespace cuda {
namespace {

// Flipping the magnitude bits of a negative float makes its two's-complement bits ordered like its value.
__device__ __forceinline__ long long ordered_key(float x) {
  const int bits = __float_as_int(x);
  return (long long)(bits ^ ((bits >> 31) & 0x7fffffff));
}
__device__ __forceinline__ long long ordered_key(double x) {
  const long long bits = __double_as_longlong(x);
  return bits ^ ((bits >> 63) & 0x7fffffffffffffffLL);
}
template <typename T>
__device__ __forceinline__ T from_key(long long key);
template <>
__device__ __forceinline__ float from_key<float>(long long key) {
  const int k = int(key);
  return __int_as_float(k ^ ((k >> 31) & 0x7fffffff));
}
template <>
__device__ __forceinline__ double from_key<double>(long long key) {
  return __longlong_as_double(key ^ ((key >> 63) & 0x7fffffffffffffffLL));
}

// One block of 8 warps walks the sorted responses, 4 consecutive positions a thread per chunk.
constexpr int kWalkThreads = 256;
constexpr int kWalkItems = 4;
constexpr int kWalkWarps = kWalkThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ long long later(long long a, long long b) { return a > b ? a : b; }

// head [b]: each sorted position's group head, the last position at or before it whose id differs from the
// one before (a running max over the chunk's positions, then over the warps, after the chunks before).
template <typename I>
__device__ void head_positions(const I* __restrict__ ids, long long* __restrict__ head, int64_t b) {
  __shared__ long long warp_max[kWalkWarps];
  __shared__ long long carry;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) carry = -1;
  __syncthreads();
  for (int64_t c0 = 0; c0 < b; c0 += int64_t(kWalkThreads) * kWalkItems) {
    const int64_t first = c0 + int64_t(tid) * kWalkItems;
    long long inc[kWalkItems];
    long long run = -1;
#pragma unroll
    for (int k = 0; k < kWalkItems; ++k) {
      const int64_t p = first + k;
      if (p < b && (p == 0 || ids[p] != ids[p - 1])) run = p;
      inc[k] = run;
    }
    long long total = run;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const long long other = __shfl_up_sync(kFullMask, total, d);
      if (lane >= d) total = later(total, other);
    }
    long long left = __shfl_up_sync(kFullMask, total, 1);  // lanes [0, lane)
    if (lane == 0) left = -1;
    if (lane == 31) warp_max[warp] = total;
    __syncthreads();
    long long prefix = later(carry, left);
    for (int w = 0; w < warp; ++w) prefix = later(prefix, warp_max[w]);
#pragma unroll
    for (int k = 0; k < kWalkItems; ++k) {
      if (first + k < b) head[first + k] = later(prefix, inc[k]);
    }
    __syncthreads();  // every thread read the carry and the warp maxima
    if (tid == kWalkThreads - 1) carry = later(prefix, inc[kWalkItems - 1]);
    __syncthreads();
  }
}

// ok = no non-finite value among the `bad` counts of the block's threads.
__device__ __forceinline__ void store_ok(double bad, bool* ok) {
  __shared__ double smem[kWalkWarps];
  double count[1] = {bad};
  block_sum<kWalkThreads>(count, smem);
  if (threadIdx.x == 0) *ok = count[0] == 0.0;
}

#define RLK_WALK(p, b) for (int64_t p = threadIdx.x; p < (b); p += kWalkThreads)

template <typename T, typename I>
__global__ void __launch_bounds__(kWalkThreads)
    passk_kernel(const T* __restrict__ s,           // [b] scores
                 const I* __restrict__ ids,         // [b] sorted group ids
                 const int64_t* __restrict__ perm,  // [b] their original indices
                 long long* __restrict__ head,      // [b] scratch: each sorted position's head
                 double* __restrict__ stats,        // [4, b] scratch at the heads: count, Σ (s - pivot), m2, ties
                 long long* __restrict__ keys,      // [2, b] scratch at the heads: best, second best
                 T* __restrict__ out,               // [b]
                 bool* __restrict__ ok,             // [] every score finite
                 int64_t b, double eps, bool norm_by_std) {
  RLK_WALK(p, b) {
    for (int k = 0; k < 4; ++k) stats[k * b + p] = 0.0;
    keys[p] = keys[b + p] = std::numeric_limits<long long>::min();
  }
  head_positions(ids, head, b);
  double bad = 0.0;
  RLK_WALK(p, b) {  // 1. count, Σ (s - pivot) around the group's first score, best
    const int64_t g = head[p];
    const T x = s[perm[p]];
    bad += (double(x) - double(x)) != 0.0;
    atomicAdd(stats + g, 1.0);
    atomicAdd(stats + b + g, double(x) - double(s[perm[g]]));
    atomicMax(keys + g, ordered_key(x));
  }
  store_ok(bad, ok);
  __syncthreads();
  RLK_WALK(p, b) {  // 2. centered sum of squares, ties of the best, second best
    const int64_t g = head[p];
    const T x = s[perm[p]];
    const double d = double(x) - (double(s[perm[g]]) + load_partial(stats + b + g) / load_partial(stats + g));
    atomicAdd(stats + 2 * b + g, d * d);
    if (x == from_key<T>(load_partial(keys + g))) {
      atomicAdd(stats + 3 * b + g, 1.0);
    } else {
      atomicMax(keys + b + g, ordered_key(x));
    }
  }
  __syncthreads();
  RLK_WALK(p, b) {  // 3. the advantages
    const int64_t g = head[p], i = perm[p];
    out[i] = T(passk_advantage<double>(s[i], load_partial(stats + g), from_key<T>(load_partial(keys + g)),
                                       load_partial(stats + 3 * b + g), from_key<T>(load_partial(keys + b + g)),
                                       load_partial(stats + 2 * b + g), eps, norm_by_std));
  }
}

template <typename T, typename I>
__global__ void __launch_bounds__(kWalkThreads)
    opo_kernel(const T* __restrict__ s,           // [b] scores
               const T* __restrict__ len,         // [b] lengths
               const I* __restrict__ ids,         // [b] sorted group ids
               const int64_t* __restrict__ perm,  // [b] their original indices
               long long* __restrict__ head,      // [b] scratch: each sorted position's head
               double* __restrict__ stats,        // [3, b] scratch at the heads: count, Σ L, Σ L (s - pivot)
               T* __restrict__ out,               // [b]
               bool* __restrict__ ok,             // [] every score finite
               int64_t b) {
  RLK_WALK(p, b) {
    for (int k = 0; k < 3; ++k) stats[k * b + p] = 0.0;
  }
  head_positions(ids, head, b);
  double bad = 0.0;
  RLK_WALK(p, b) {  // 1. count, Σ L, Σ L (s - pivot)
    const int64_t g = head[p], i = perm[p];
    const double x = double(s[i]);
    bad += (x - x) != 0.0;
    atomicAdd(stats + g, 1.0);
    atomicAdd(stats + b + g, double(len[i]));
    atomicAdd(stats + 2 * b + g, double(len[i]) * (x - double(s[perm[g]])));
  }
  store_ok(bad, ok);
  __syncthreads();
  RLK_WALK(p, b) {  // 2. the advantages
    const int64_t g = head[p], i = perm[p];
    out[i] = T(opo_advantage<double>(s[i], load_partial(stats + g), s[perm[g]], load_partial(stats + 2 * b + g),
                                     load_partial(stats + b + g)));
  }
}

#undef RLK_WALK

template <typename T>
cudaError_t passk_launch(const void* scores, const void* sorted_ids, bool ids_int64, const int64_t* perm,
                         int64_t* head, void* stats, int64_t* keys, void* out, bool* ok, int64_t b, double eps,
                         bool norm_by_std, cudaStream_t stream) {
  const T* s = static_cast<const T*>(scores);
  auto* h = reinterpret_cast<long long*>(head);
  auto* k = reinterpret_cast<long long*>(keys);
  auto* st = static_cast<double*>(stats);
  if (ids_int64) {
    passk_kernel<T, int64_t><<<1, kWalkThreads, 0, stream>>>(s, static_cast<const int64_t*>(sorted_ids), perm, h,
                                                             st, k, static_cast<T*>(out), ok, b, eps, norm_by_std);
  } else {
    passk_kernel<T, int32_t><<<1, kWalkThreads, 0, stream>>>(s, static_cast<const int32_t*>(sorted_ids), perm, h,
                                                             st, k, static_cast<T*>(out), ok, b, eps, norm_by_std);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t opo_launch(const void* scores, const void* lengths, const void* sorted_ids, bool ids_int64,
                       const int64_t* perm, int64_t* head, void* stats, void* out, bool* ok, int64_t b,
                       cudaStream_t stream) {
  const T* s = static_cast<const T*>(scores);
  const T* len = static_cast<const T*>(lengths);
  auto* h = reinterpret_cast<long long*>(head);
  auto* st = static_cast<double*>(stats);
  if (ids_int64) {
    opo_kernel<T, int64_t><<<1, kWalkThreads, 0, stream>>>(s, len, static_cast<const int64_t*>(sorted_ids), perm, h,
                                                           st, static_cast<T*>(out), ok, b);
  } else {
    opo_kernel<T, int32_t><<<1, kWalkThreads, 0, stream>>>(s, len, static_cast<const int32_t*>(sorted_ids), perm, h,
                                                           st, static_cast<T*>(out), ok, b);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t grpo_passk_sorted(DType dtype, const void* scores, const void* sorted_ids, bool ids_int64,
                              const int64_t* perm, int64_t* head, void* stats, int64_t* keys, void* out, bool* ok,
                              int64_t b, double eps, bool norm_by_std, cudaStream_t stream) {
  if (b == 0) return cudaSuccess;
  if (dtype == DType::Float64) {
    return passk_launch<double>(scores, sorted_ids, ids_int64, perm, head, stats, keys, out, ok, b, eps, norm_by_std,
                                stream);
  }
  if (dtype == DType::Float32) {
    return passk_launch<float>(scores, sorted_ids, ids_int64, perm, head, stats, keys, out, ok, b, eps, norm_by_std,
                               stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t opo_sorted(DType dtype, const void* scores, const void* lengths, const void* sorted_ids, bool ids_int64,
                       const int64_t* perm, int64_t* head, void* stats, void* out, bool* ok, int64_t b,
                       cudaStream_t stream) {
  if (b == 0) return cudaSuccess;
  if (dtype == DType::Float64) {
    return opo_launch<double>(scores, lengths, sorted_ids, ids_int64, perm, head, stats, out, ok, b, stream);
  }
  if (dtype == DType::Float32) {
    return opo_launch<float>(scores, lengths, sorted_ids, ids_int64, perm, head, stats, out, ok, b, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace rlk
