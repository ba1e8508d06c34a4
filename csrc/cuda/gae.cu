// gae / discounted_returns CUDA kernels: one block scans one row right to left, chunk by chunk, so that
// long rows and small batches still spread over the SMs' threads (not one thread looping over T).
//
// Per chunk of kThreads * kItems positions (the row's end first): each thread composes the affine maps
// of its kItems consecutive positions (rlkernels/gae.h), a reverse inclusive warp scan (shuffles) and a
// scan over the warp totals (shared memory) give each thread the composition of everything to its
// right, which applied to the carry from the previous chunk is the state entering the thread's last
// position; the thread then runs verl's step over its positions and writes them. Thread 0's final state
// is the carry into the next chunk. Each thread counts the input values it reads that the op rejects and
// keeps Chan moments of its outputs; the block merges them into its row's partials, and the last block to
// finish (last_block.cuh) merges every row's in a fixed order into the validity flag and the whitening
// coefficients, which one elementwise launch applies (docs/gpu_token_ops.md).
#include <type_traits>

#include "block_reduce.cuh"
#include "common.cuh"
#include "gae.h"
#include "last_block.cuh"
#include "rlkernels/gae.h"

namespace rlk {
namespace cuda {
namespace {

// 8 warps per row: enough to hide load latency per SM with a few rows resident, and a short
// warp-total scan.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Positions per thread per chunk: 4 loads in flight per input, and a 1024-position chunk.
constexpr int kItems = 4;
constexpr int64_t kChunk = int64_t(kThreads) * kItems;
constexpr unsigned kFullMask = 0xffffffffu;
// Columns of a row's partials: its bad-value count and its outputs' whitening moments (w, mean, m2).
constexpr int kParts = 4;

template <typename A>
__device__ __forceinline__ Affine2<A> shfl_down(const Affine2<A>& f, int delta) {
  return {__shfl_down_sync(kFullMask, f.p, delta), __shfl_down_sync(kFullMask, f.q, delta),
          __shfl_down_sync(kFullMask, f.s, delta), __shfl_down_sync(kFullMask, f.b1, delta),
          __shfl_down_sync(kFullMask, f.b2, delta)};
}

template <typename A>
__device__ __forceinline__ Moments<A> shfl_down(const Moments<A>& m, int delta) {
  return {__shfl_down_sync(kFullMask, m.w, delta), __shfl_down_sync(kFullMask, m.mean, delta),
          __shfl_down_sync(kFullMask, m.m2, delta)};
}

// The row's bounds, clamped into [0, numel]; `bad` counts the cu_seqlens entries the op rejects (seen by the
// block of the row they start or end: the first starts at 0, each row's end >= its start, the last ends at
// numel). Rows past `rows` (the one block of an empty packed batch) are empty.
template <typename O>
__device__ __forceinline__ void row_bounds(const ScanRows& rows, int64_t row, int64_t& start, int64_t& end,
                                           int& bad) {
  const bool in_rows = row < rows.rows;
  if (rows.offsets == nullptr) {
    start = row * rows.row_len;
    end = in_rows ? start + rows.row_len : start;
    return;
  }
  const O* off = static_cast<const O*>(rows.offsets);
  const int64_t raw_start = int64_t(off[row]);
  const int64_t raw_end = in_rows ? int64_t(off[row + 1]) : raw_start;
  bad += row == 0 && raw_start != 0;
  bad += raw_end < raw_start;
  bad += row == (rows.rows > 0 ? rows.rows - 1 : 0) && raw_end != rows.numel;
  start = min(max(raw_start, int64_t(0)), rows.numel);
  end = min(max(raw_end, start), rows.numel);
}

template <typename T, typename M, typename O, ScanKind K, bool kWhiten>
__global__ void __launch_bounds__(kThreads)
    scan_kernel(ScanRows rows,
                const T* __restrict__ rewards,   // [numel]
                const T* __restrict__ values,    // [numel] (GAE)
                const M* __restrict__ mask,      // [numel] bool, int64 or T
                const T* __restrict__ baseline,  // [rows] or nullptr (returns: ReMax)
                T* __restrict__ out,             // [numel] advantages (GAE) or returns
                T* __restrict__ second,          // [numel] returns (GAE), returns - b·m (baseline), or nullptr
                typename Acc<T>::type* __restrict__ parts,  // [gridDim.x, kParts]
                unsigned int* __restrict__ counter,         // [1] zero (launch_counter.h)
                typename Acc<T>::type* __restrict__ coef,   // [2] whitening (mean, rstd) (kWhiten)
                bool* __restrict__ ok,                      // [] every input value valid
                typename Acc<T>::type gamma, typename Acc<T>::type gl) {
  using A = typename Acc<T>::type;
  __shared__ Affine2<A> warp_maps[kWarps];
  __shared__ Moments<A> warp_moments[kWarps];
  __shared__ A carry[2];
  __shared__ A smem[2 * kWarps];

  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int bad = 0;
  int64_t start, end;
  row_bounds<O>(rows, row, start, end, bad);
  if (tid != 0) bad = 0;  // each block counts its row's cu_seqlens entries once
  A b = A(0);
  if (baseline != nullptr && row < rows.rows) {
    b = A(to_acc(baseline[row]));
    bad += tid == 0 && !(abs_(b) < A(INFINITY));
  }
  A finite = A(0);  // stays 0 while every value read is finite, NaN after

  A x1 = A(0), x2 = A(0);  // state right of the current chunk (the same in every thread)
  Moments<A> mom{A(0), A(0), A(0)};
  for (int64_t hi = end; hi > start; hi -= kChunk) {
    const int64_t first = hi - kChunk + int64_t(tid) * kItems;  // this thread's first position
    A r[kItems], v[kItems], m[kItems], y[kItems];
    bool in[kItems], on[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t i = first + k;
      in[k] = i >= start;  // i < hi always
      r[k] = in[k] ? A(to_acc(rewards[i])) : A(0);
      v[k] = (K == ScanKind::GAE && in[k]) ? A(to_acc(values[i])) : A(0);
      const auto raw = in[k] ? mask_raw<A>(mask + i) : decltype(mask_raw<A>(mask)){};
      m[k] = mask_weight<A>(raw);
      on[k] = raw != decltype(raw){};
      bad += mask_value_bad<A>(raw);
      finite += (r[k] - r[k]) + (v[k] - v[k]);
    }
    // This thread's positions composed, right to left.
    Affine2<A> agg = affine2_identity<A>();
#pragma unroll
    for (int k = kItems - 1; k >= 0; --k) {
      if (in[k]) agg = affine2_compose(scan_map<A>(K, r[k], v[k], m[k], gamma, gl), agg);
    }
    // Reverse inclusive scan over the warp: lane l ends with lanes [l, 32) composed.
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const Affine2<A> other = shfl_down(agg, d);
      if (lane + d < 32) agg = affine2_compose(agg, other);
    }
    Affine2<A> right_in_warp = shfl_down(agg, 1);  // lanes (l, 32)
    if (lane == 31) right_in_warp = affine2_identity<A>();
    if (lane == 0) warp_maps[warp] = agg;
    __syncthreads();
    Affine2<A> right_warps = affine2_identity<A>();  // warps (warp, kWarps)
    for (int w = kWarps - 1; w > warp; --w) right_warps = affine2_compose(warp_maps[w], right_warps);
    A s1 = x1, s2 = x2;
    affine2_apply(right_warps, s1, s2);
    affine2_apply(right_in_warp, s1, s2);
    // verl's step over this thread's positions.
#pragma unroll
    for (int k = kItems - 1; k >= 0; --k) {
      y[k] = A(0);
      if (!in[k]) continue;
      const int64_t i = first + k;
      if constexpr (!std::is_integral_v<M>) {  // float weights blend; bool and 0 / 1 select
        scan_step<A>(K, r[k], v[k], m[k], gamma, gl, s1, s2);
      } else {
        scan_step<A>(K, r[k], v[k], on[k], gamma, gl, s1, s2);
      }
      y[k] = s2;
      out[i] = from_acc<T>(s2);
      if constexpr (K == ScanKind::GAE) {
        second[i] = from_acc<T>(s2 + v[k]);
      } else if (baseline != nullptr) {
        second[i] = from_acc<T>(s2 - b * m[k]);
      }
    }
    if (tid == 0) {
      carry[0] = s1;
      carry[1] = s2;
    }
    if constexpr (kWhiten) {
      A w = A(0), sum = A(0);
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        w += m[k];
        sum += m[k] * y[k];
      }
      const A mean = w > A(0) ? sum / w : A(0);
      A m2 = A(0);
#pragma unroll
      for (int k = 0; k < kItems; ++k) m2 += m[k] * (y[k] - mean) * (y[k] - mean);
      mom = moments_merge(mom, Moments<A>{w, mean, m2});
    }
    __syncthreads();
    x1 = carry[0];
    x2 = carry[1];
  }
  // The row's partials: its bad-value count (block sum) and its outputs' moments (Chan merges).
  A count[1] = {A(bad) + (finite != A(0) ? A(1) : A(0))};
  block_sum<kThreads>(count, smem);
  if constexpr (kWhiten) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) mom = moments_merge(mom, shfl_down(mom, d));
    if (lane == 0) warp_moments[warp] = mom;
    __syncthreads();
  }
  if (tid == 0) {
    Moments<A> total{A(0), A(0), A(0)};
    if constexpr (kWhiten) {
      total = warp_moments[0];
      for (int w = 1; w < kWarps; ++w) total = moments_merge(total, warp_moments[w]);
    }
    A* p = parts + row * kParts;
    p[0] = count[0];
    p[1] = total.w;
    p[2] = total.mean;
    p[3] = total.m2;
  }
  if (!last_block(counter, gridDim.x)) return;
  // The last block: every row's partials, each thread's rows in order, then fixed trees.
  const int64_t n_rows = gridDim.x;
  A sums[2] = {A(0), A(0)};  // Σ w, Σ w·mean
  A bad_rows[1] = {A(0)};
  for (int64_t i = tid; i < n_rows; i += kThreads) {
    const A w = load_partial(parts + i * kParts + 1);
    sums[0] += w;
    sums[1] += w * load_partial(parts + i * kParts + 2);
    bad_rows[0] += load_partial(parts + i * kParts);
  }
  block_sum<kThreads>(sums, smem);
  __syncthreads();
  block_sum<kThreads>(bad_rows, smem);
  __shared__ A total_mean;
  if (tid == 0) total_mean = sums[0] > A(0) ? sums[1] / sums[0] : A(0);
  __syncthreads();
  const A mean = total_mean;
  A m2[1] = {A(0)};
  for (int64_t i = tid; i < n_rows; i += kThreads) {
    const A w = load_partial(parts + i * kParts + 1);
    const A d = load_partial(parts + i * kParts + 2) - mean;
    m2[0] += load_partial(parts + i * kParts + 3) + w * d * d;
  }
  block_sum<kThreads>(m2, smem);
  if (tid == 0) {
    *ok = bad_rows[0] == A(0);
    RLK_REQUIRE_VALUES(*ok,
                       "rlkernels gae / discounted returns: NaN or inf rewards, values or baselines, a mask value not "
                       "0 / 1 (integer) or finite and >= 0 (float), or cu_seqlens not 0, ..., N non-decreasing");
    if constexpr (kWhiten) whiten_coefficients(sums[0], mean, m2[0], coef[0], coef[1]);
  }
}

// x = (x - coef[0]) * coef[1], written to out (x itself for GAE), times the mask weight where mask is given.
template <typename T, typename M>
__global__ void whiten_kernel(const T* x,                    // [n]
                              T* out,                        // [n] (may be x)
                              const M* __restrict__ mask,    // [n] or nullptr
                              const typename Acc<T>::type* __restrict__ coef, int64_t n) {
  using A = typename Acc<T>::type;
  const A mean = coef[0], rstd = coef[1];
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    A y = (A(to_acc(x[i])) - mean) * rstd;
    if (mask != nullptr) y *= mask_weight<A>(mask_raw<A>(mask + i));
    out[i] = from_acc<T>(y);
  }
}

template <typename T, typename M, typename O, ScanKind K, bool kWhiten>
void launch_scan(const ScanArgs& a, cudaStream_t stream) {
  using A = typename Acc<T>::type;
  const int64_t grid = a.rows.rows > 0 ? a.rows.rows : 1;
  scan_kernel<T, M, O, K, kWhiten><<<static_cast<unsigned int>(grid), kThreads, 0, stream>>>(
      a.rows, static_cast<const T*>(a.rewards), static_cast<const T*>(a.values), static_cast<const M*>(a.mask),
      static_cast<const T*>(a.baseline), static_cast<T*>(a.out), static_cast<T*>(a.second),
      static_cast<A*>(a.parts), a.counter, static_cast<A*>(a.coef), a.ok, A(a.gamma), A(a.gamma_lam));
  if (kWhiten && a.rows.numel > 0) {
    // GAE whitens its advantages in place; REINFORCE++ writes masked_whiten(returns) * mask beside them.
    const bool gae = K == ScanKind::GAE;
    whiten_kernel<T, M><<<elementwise_blocks(a.rows.numel), kElementwiseThreads, 0, stream>>>(
        static_cast<const T*>(a.out), static_cast<T*>(gae ? a.out : a.second),
        gae ? nullptr : static_cast<const M*>(a.mask), static_cast<const A*>(a.coef), a.rows.numel);
  }
}

template <typename T, typename M, typename O>
void dispatch_kind(const ScanArgs& a, cudaStream_t stream) {
  if (a.kind == int(ScanKind::Returns)) {
    if (a.whiten) {
      launch_scan<T, M, O, ScanKind::Returns, true>(a, stream);
    } else {
      launch_scan<T, M, O, ScanKind::Returns, false>(a, stream);
    }
  } else if (a.whiten) {
    launch_scan<T, M, O, ScanKind::GAE, true>(a, stream);
  } else {
    launch_scan<T, M, O, ScanKind::GAE, false>(a, stream);
  }
}

template <typename T, typename M>
void dispatch_offsets(const ScanArgs& a, cudaStream_t stream) {
  if (a.rows.offsets_int64) {
    dispatch_kind<T, M, int64_t>(a, stream);
  } else {
    dispatch_kind<T, M, int32_t>(a, stream);
  }
}

}  // namespace

cudaError_t scan_forward(DType dtype, const ScanArgs& args, cudaStream_t stream) {
  const int64_t grid = args.rows.rows > 0 ? args.rows.rows : 1;
  if (grid > 0x7fffffff) return cudaErrorInvalidConfiguration;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    switch (args.mask_kind) {
      case ScanMask::Bool:
        dispatch_offsets<T, bool>(args, stream);
        break;
      case ScanMask::Int64:
        dispatch_offsets<T, int64_t>(args, stream);
        break;
      default:
        dispatch_offsets<T, typename Acc<T>::type>(args, stream);  // float weights: the accumulation type
    }
  });
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rlk
