// grpo_passk and opo CUDA kernels: one block walks the responses in the order of a stable sort of their group
// ids (equal ids become runs, each headed by the group's first member), as group_advantages' sorted walk does
// (advantages.cu). Each response's group is named by the sorted position of its run's head (a running max,
// carried between chunks). Each group's statistics accumulate there with atomics (in double whatever the
// scores' dtype: atomics add in no fixed order, which fp32 running sums would depend on), one walk per pass
// that needs the previous pass complete (a barrier between walks; the statistics read past L1), then a walk
// writes each response's advantage (rlkernels/outcome_estimators.h): one launch after the sort. CUDA has no
// float atomicMax: the best and second-best scores are kept as ordered integer keys (key(a) < key(b) iff
// a < b), whose atomicMax is the float max. Past one chunk of responses each pass is a launch of its own over
// every position, after one that finds each position's head by a binary search of the sorted ids.
#include <limits>

#include "block_reduce.cuh"
#include "common.cuh"
#include "last_block.cuh"
#include "outcome_estimators.h"
#include "rlkernels/gae.h"  // mask_weight
#include "rlkernels/outcome_estimators.h"

namespace rlk {
namespace cuda {
namespace {

// What the kernels check: the message of their device-side asserts (common.cuh RLK_REQUIRE_VALUES).
__device__ const char kBadScores[] = "rlkernels grpo_passk / opo: a score is NaN or inf";

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
  if (threadIdx.x == 0) {
    *ok = count[0] == 0.0;
    RLK_REQUIRE_VALUES(*ok, kBadScores);
  }
}

#define RLK_WALK(p, b) for (int64_t p = threadIdx.x; p < (b); p += kWalkThreads)

// The passes of grpo_passk (outcome_estimators.h), one sorted position p each; step 1 returns whether its
// score is not finite.
template <typename T>
struct PasskArgs {
  const T* s;            // [b] scores
  const int64_t* perm;   // [b] the sorted ids' original indices
  const long long* head; // [b] each sorted position's head
  double* stats;         // [4, b] at the heads: count, Σ (s - pivot), m2, ties
  long long* keys;       // [2, b] at the heads: best, second best
  T* out;                // [b]
  int64_t b;
  double eps;
  bool norm_by_std;
};

template <typename T>
__device__ __forceinline__ double passk_step1(const PasskArgs<T>& a, int64_t p) {  // count, Σ (s - pivot), best
  const int64_t g = a.head[p];
  const T x = a.s[a.perm[p]];
  atomicAdd(a.stats + g, 1.0);
  atomicAdd(a.stats + a.b + g, double(x) - double(a.s[a.perm[g]]));
  atomicMax(a.keys + g, ordered_key(x));
  return (double(x) - double(x)) != 0.0;
}

template <typename T>
__device__ __forceinline__ void passk_step2(const PasskArgs<T>& a, int64_t p) {  // m2, ties, second best
  const int64_t g = a.head[p], b = a.b;
  const T x = a.s[a.perm[p]];
  const double d = double(x) - (double(a.s[a.perm[g]]) + load_partial(a.stats + b + g) / load_partial(a.stats + g));
  atomicAdd(a.stats + 2 * b + g, d * d);
  if (x == from_key<T>(load_partial(a.keys + g))) {
    atomicAdd(a.stats + 3 * b + g, 1.0);
  } else {
    atomicMax(a.keys + b + g, ordered_key(x));
  }
}

template <typename T>
__device__ __forceinline__ void passk_step3(const PasskArgs<T>& a, int64_t p) {  // the advantage
  const int64_t g = a.head[p], i = a.perm[p], b = a.b;
  a.out[i] = T(passk_advantage<double>(a.s[i], load_partial(a.stats + g), from_key<T>(load_partial(a.keys + g)),
                                       load_partial(a.stats + 3 * b + g), from_key<T>(load_partial(a.keys + b + g)),
                                       load_partial(a.stats + 2 * b + g), a.eps, a.norm_by_std));
}

template <typename T, typename I>
__global__ void __launch_bounds__(kWalkThreads)
    passk_kernel(PasskArgs<T> a, const I* __restrict__ ids, long long* head, bool* __restrict__ ok) {  // head: a.head
  const int64_t b = a.b;
  RLK_WALK(p, b) {
    for (int k = 0; k < 4; ++k) a.stats[k * b + p] = 0.0;
    a.keys[p] = a.keys[b + p] = std::numeric_limits<long long>::min();
  }
  head_positions(ids, head, b);
  double bad = 0.0;
  RLK_WALK(p, b) bad += passk_step1(a, p);
  store_ok(bad, ok);
  __syncthreads();
  RLK_WALK(p, b) passk_step2(a, p);
  __syncthreads();
  RLK_WALK(p, b) passk_step3(a, p);
}

// The passes of opo, one sorted position each; step 1 returns whether its score is not finite.
template <typename T>
struct OpoArgs {
  const T* s;            // [b] scores
  double* len;           // [b] lengths Σ_t m, summed from the mask in the launch's own blocks
  const int64_t* perm;   // [b]
  const long long* head; // [b]
  double* stats;         // [3, b] at the heads: count, Σ L, Σ L (s - pivot)
  T* out;                // [b]
  int64_t b;
  const void* mask;      // [b, t] bool / int64 / T's accumulation type (mask_kind 0 / 1 / 2)
  int mask_kind;
  int64_t t;
};

// len[row] = Σ_t mask[row, t] (bool / int64: nonzero counts 1; T: the weights), by this block's threads.
template <typename T, typename M>
__device__ __forceinline__ void store_row_sum(const M* __restrict__ mask, double* len, int64_t row, int64_t t) {
  __shared__ double smem[kWalkWarps];
  double sum[1] = {0.0};
  for (int64_t j = threadIdx.x; j < t; j += kWalkThreads) sum[0] += mask_weight<double>(mask[row * t + j]);
  block_sum<kWalkThreads>(sum, smem);
  if (threadIdx.x == 0) len[row] = sum[0];
}

template <typename T>
__device__ void store_row_sum(const OpoArgs<T>& a, int64_t row) {
  if (a.mask_kind == 0) {
    store_row_sum<T>(static_cast<const bool*>(a.mask), a.len, row, a.t);
  } else if (a.mask_kind == 1) {
    store_row_sum<T>(static_cast<const int64_t*>(a.mask), a.len, row, a.t);
  } else {
    store_row_sum<T>(static_cast<const typename Acc<T>::type*>(a.mask), a.len, row, a.t);
  }
}

template <typename T>
__device__ __forceinline__ double opo_step1(const OpoArgs<T>& a, int64_t p) {  // count, Σ L, Σ L (s - pivot)
  const int64_t g = a.head[p], i = a.perm[p];
  const double x = double(a.s[i]), len = load_partial(a.len + i);  // another block's
  atomicAdd(a.stats + g, 1.0);
  atomicAdd(a.stats + a.b + g, len);
  atomicAdd(a.stats + 2 * a.b + g, len * (x - double(a.s[a.perm[g]])));
  return (x - x) != 0.0;
}

template <typename T>
__device__ __forceinline__ void opo_step2(const OpoArgs<T>& a, int64_t p) {  // the advantage
  const int64_t g = a.head[p], i = a.perm[p], b = a.b;
  a.out[i] = T(opo_advantage<double>(a.s[i], load_partial(a.stats + g), a.s[a.perm[g]],
                                     load_partial(a.stats + 2 * b + g), load_partial(a.stats + b + g)));
}

// A block per response sums its mask row into a.len; the last block to finish walks.
template <typename T, typename I>
__global__ void __launch_bounds__(kWalkThreads)
    opo_kernel(OpoArgs<T> a, const I* __restrict__ ids, long long* head, bool* __restrict__ ok,  // head: a.head
               unsigned int* __restrict__ counter) {
  store_row_sum(a, blockIdx.x);
  if (!last_block(counter, gridDim.x)) return;
  const int64_t b = a.b;
  RLK_WALK(p, b) {
    for (int k = 0; k < 3; ++k) a.stats[k * b + p] = 0.0;
  }
  head_positions(ids, head, b);
  double bad = 0.0;
  RLK_WALK(p, b) bad += opo_step1(a, p);
  store_ok(bad, ok);
  __syncthreads();
  RLK_WALK(p, b) opo_step2(a, p);
}

// The chunk-parallel path (more than one chunk of responses): each pass a launch of its own over every
// position, each position's head by a binary search of the sorted ids in place of the walk's carried running
// max. The non-finite scores add into one double (zeroed by the heads' launch) that the next pass reads.
constexpr int64_t kChunk = int64_t(kWalkThreads) * kWalkItems;

#define RLK_GRID(p, b) \
  for (int64_t p = int64_t(blockIdx.x) * kWalkThreads + threadIdx.x; p < (b); p += int64_t(gridDim.x) * kWalkThreads)

// heads, the statistics' rows filled (stats with 0, keys with the lowest key), bad zeroed (a position a thread,
// head_blocks blocks); opo: then a block per mask row, its length.
template <typename I, typename T>
__global__ void __launch_bounds__(kWalkThreads)
    chunk_heads_kernel(const I* __restrict__ ids, long long* __restrict__ head, double* __restrict__ stats,
                       int stat_rows, long long* __restrict__ keys, int key_rows, double* __restrict__ bad, int64_t b,
                       unsigned int head_blocks, OpoArgs<T> lengths) {
  if (blockIdx.x >= head_blocks) {  // only with lengths (opo)
    store_row_sum(lengths, blockIdx.x - head_blocks);
    return;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *bad = 0.0;
  for (int64_t p = int64_t(blockIdx.x) * kWalkThreads + threadIdx.x; p < b; p += int64_t(head_blocks) * kWalkThreads) {
    const I key = ids[p];
    int64_t lo = 0, hi = p;  // the first position holding ids[p], in [lo, hi]
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (ids[mid] < key) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    head[p] = lo;
    for (int k = 0; k < stat_rows; ++k) stats[k * b + p] = 0.0;
    for (int k = 0; k < key_rows; ++k) keys[k * b + p] = std::numeric_limits<long long>::min();
  }
}

// The non-finite count of this block's positions added to *bad.
__device__ __forceinline__ void add_bad(double bad, double* total) {
  __shared__ double smem[kWalkWarps];
  double count[1] = {bad};
  block_sum<kWalkThreads>(count, smem);
  if (threadIdx.x == 0 && count[0] != 0.0) atomicAdd(total, count[0]);
}

template <typename T, int kPass>
__global__ void __launch_bounds__(kWalkThreads) passk_chunk_kernel(PasskArgs<T> a, double* bad, bool* ok) {
  if (kPass == 1) {
    double mine = 0.0;
    RLK_GRID(p, a.b) mine += passk_step1(a, p);
    add_bad(mine, bad);
  } else if (kPass == 2) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      *ok = *bad == 0.0;
      RLK_REQUIRE_VALUES(*ok, kBadScores);
    }
    RLK_GRID(p, a.b) passk_step2(a, p);
  } else {
    RLK_GRID(p, a.b) passk_step3(a, p);
  }
}

template <typename T, int kPass>
__global__ void __launch_bounds__(kWalkThreads) opo_chunk_kernel(OpoArgs<T> a, double* bad, bool* ok) {
  if (kPass == 1) {
    double mine = 0.0;
    RLK_GRID(p, a.b) mine += opo_step1(a, p);
    add_bad(mine, bad);
  } else {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      *ok = *bad == 0.0;
      RLK_REQUIRE_VALUES(*ok, kBadScores);
    }
    RLK_GRID(p, a.b) opo_step2(a, p);
  }
}

#undef RLK_GRID
#undef RLK_WALK

// The blocks of the chunk path's launches: a position a thread.
inline unsigned int chunk_blocks(int64_t b) { return static_cast<unsigned int>((b + kWalkThreads - 1) / kWalkThreads); }

template <typename T, typename I>
void passk_run(const PasskArgs<T>& a, const I* ids, long long* head, bool* ok, cudaStream_t stream) {
  if (a.b <= kChunk) {
    passk_kernel<T, I><<<1, kWalkThreads, 0, stream>>>(a, ids, head, ok);
    return;
  }
  double* bad = a.stats + 4 * a.b;  // the scratch's last double (outcome_estimators.h)
  const unsigned int blocks = chunk_blocks(a.b);
  chunk_heads_kernel<I, T><<<blocks, kWalkThreads, 0, stream>>>(ids, head, a.stats, 4, a.keys, 2, bad, a.b, blocks,
                                                                 OpoArgs<T>{});
  passk_chunk_kernel<T, 1><<<blocks, kWalkThreads, 0, stream>>>(a, bad, ok);
  passk_chunk_kernel<T, 2><<<blocks, kWalkThreads, 0, stream>>>(a, bad, ok);
  passk_chunk_kernel<T, 3><<<blocks, kWalkThreads, 0, stream>>>(a, bad, ok);
}

template <typename T>
cudaError_t passk_launch(const void* scores, const void* sorted_ids, bool ids_int64, const int64_t* perm,
                         int64_t* head, void* stats, int64_t* keys, void* out, bool* ok, int64_t b, double eps,
                         bool norm_by_std, cudaStream_t stream) {
  auto* h = reinterpret_cast<long long*>(head);
  const PasskArgs<T> a{static_cast<const T*>(scores), perm, h, static_cast<double*>(stats),
                       reinterpret_cast<long long*>(keys), static_cast<T*>(out), b, eps, norm_by_std};
  if (ids_int64) {
    passk_run(a, static_cast<const int64_t*>(sorted_ids), h, ok, stream);
  } else {
    passk_run(a, static_cast<const int32_t*>(sorted_ids), h, ok, stream);
  }
  return cudaGetLastError();
}

template <typename T, typename I>
void opo_run(const OpoArgs<T>& a, const I* ids, long long* head, bool* ok, unsigned int* counter,
             cudaStream_t stream) {
  if (a.b <= kChunk) {
    opo_kernel<T, I><<<static_cast<unsigned int>(a.b), kWalkThreads, 0, stream>>>(a, ids, head, ok, counter);
    return;
  }
  double* bad = a.stats + 3 * a.b;  // the scratch's last double (outcome_estimators.h)
  const unsigned int blocks = chunk_blocks(a.b);
  chunk_heads_kernel<I, T><<<blocks + static_cast<unsigned int>(a.b), kWalkThreads, 0, stream>>>(
      ids, head, a.stats, 3, nullptr, 0, bad, a.b, blocks, a);
  opo_chunk_kernel<T, 1><<<blocks, kWalkThreads, 0, stream>>>(a, bad, ok);
  opo_chunk_kernel<T, 2><<<blocks, kWalkThreads, 0, stream>>>(a, bad, ok);
}

template <typename T>
cudaError_t opo_launch(const OpoInputs& in, cudaStream_t stream) {
  auto* h = reinterpret_cast<long long*>(in.head);
  const OpoArgs<T> a{static_cast<const T*>(in.scores), static_cast<double*>(in.lengths), in.perm, h,
                     static_cast<double*>(in.stats), static_cast<T*>(in.out), in.b, in.mask, in.mask_kind, in.t};
  if (in.ids_int64) {
    opo_run(a, static_cast<const int64_t*>(in.sorted_ids), h, in.ok, in.counter, stream);
  } else {
    opo_run(a, static_cast<const int32_t*>(in.sorted_ids), h, in.ok, in.counter, stream);
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

cudaError_t opo_sorted(DType dtype, const OpoInputs& in, cudaStream_t stream) {
  if (in.b == 0) return cudaSuccess;
  if (in.b > 0x7fffffff) return cudaErrorInvalidConfiguration;  // a block per response
  if (dtype == DType::Float64) return opo_launch<double>(in, stream);
  if (dtype == DType::Float32) return opo_launch<float>(in, stream);
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace rlk
