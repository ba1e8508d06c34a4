// gae / discounted_returns CUDA kernels: one block scans one row right to left, chunk by chunk, so that
// long rows and small batches still spread over the SMs' threads (not one thread looping over T).
//
// Per chunk of kThreads * kItems positions (the row's end first): each thread composes the affine maps
// of its kItems consecutive positions (rlkernels/gae.h), a reverse inclusive warp scan (shuffles) and a
// scan over the warp totals (shared memory) give each thread the composition of everything to its
// right, which applied to the carry from the previous chunk is the state entering the thread's last
// position; the thread then runs verl's step over its positions and writes them. Thread 0's final state
// is the carry into the next chunk. With whitening, each thread keeps Chan moments of its advantages and
// the block merges them into the row's moments.
#include <type_traits>

#include "common.cuh"
#include "gae.h"
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

template <typename M, typename A>
__device__ __forceinline__ A mask_value(M m) {
  if constexpr (std::is_same_v<M, bool>) {
    return m ? A(1) : A(0);
  } else {
    return A(to_acc(m));
  }
}

template <typename O>
__device__ __forceinline__ void row_bounds(const ScanRows& rows, int64_t row, int64_t& start, int64_t& end) {
  if (rows.offsets == nullptr) {
    start = row * rows.row_len;
    end = start + rows.row_len;
    return;
  }
  const O* off = static_cast<const O*>(rows.offsets);
  // Invalid offsets are caught by the API (an async device assert); clamping keeps every access in bounds.
  start = min(max(int64_t(off[row]), int64_t(0)), rows.numel);
  end = min(max(int64_t(off[row + 1]), start), rows.numel);
}

template <typename T, typename M, typename O, ScanKind K, bool kWhiten>
__global__ void __launch_bounds__(kThreads)
    scan_kernel(ScanRows rows,
                const T* __restrict__ rewards,  // [numel]
                const T* __restrict__ values,   // [numel] (GAE)
                const M* __restrict__ mask,     // [numel]
                T* __restrict__ out,            // [numel] advantages (GAE) or returns
                T* __restrict__ ret,            // [numel] returns (GAE)
                typename Acc<T>::type* __restrict__ moments,  // [rows, 3] (kWhiten)
                typename Acc<T>::type gamma, typename Acc<T>::type gl) {
  using A = typename Acc<T>::type;
  __shared__ Affine2<A> warp_maps[kWarps];
  __shared__ Moments<A> warp_moments[kWarps];
  __shared__ A carry[2];

  const int64_t row = blockIdx.x;
  int64_t start, end;
  row_bounds<O>(rows, row, start, end);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  A x1 = A(0), x2 = A(0);  // state right of the current chunk (the same in every thread)
  Moments<A> mom{A(0), A(0), A(0)};
  for (int64_t hi = end; hi > start; hi -= kChunk) {
    const int64_t first = hi - kChunk + int64_t(tid) * kItems;  // this thread's first position
    A r[kItems], v[kItems], m[kItems], y[kItems];
    bool ok[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t i = first + k;
      ok[k] = i >= start;  // i < hi always
      r[k] = ok[k] ? A(to_acc(rewards[i])) : A(0);
      v[k] = (K == ScanKind::GAE && ok[k]) ? A(to_acc(values[i])) : A(0);
      m[k] = ok[k] ? mask_value<M, A>(mask[i]) : A(0);
    }
    // This thread's positions composed, right to left.
    Affine2<A> agg = affine2_identity<A>();
#pragma unroll
    for (int k = kItems - 1; k >= 0; --k) {
      if (ok[k]) agg = affine2_compose(scan_map<A>(K, r[k], v[k], m[k], gamma, gl), agg);
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
      if (!ok[k]) continue;
      const int64_t i = first + k;
      if constexpr (std::is_same_v<M, bool>) {
        scan_step<A>(K, r[k], v[k], m[k] != A(0), gamma, gl, s1, s2);
      } else {
        scan_step<A>(K, r[k], v[k], m[k], gamma, gl, s1, s2);
      }
      y[k] = s2;
      out[i] = from_acc<T>(s2);
      if constexpr (K == ScanKind::GAE) ret[i] = from_acc<T>(s2 + v[k]);
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
  if constexpr (kWhiten) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) mom = moments_merge(mom, shfl_down(mom, d));
    if (lane == 0) warp_moments[warp] = mom;
    __syncthreads();
    if (tid == 0) {
      Moments<A> total = warp_moments[0];
      for (int w = 1; w < kWarps; ++w) total = moments_merge(total, warp_moments[w]);
      moments[row * 3 + 0] = total.w;
      moments[row * 3 + 1] = total.mean;
      moments[row * 3 + 2] = total.m2;
    }
  }
}

template <typename T>
__global__ void whiten_kernel(T* __restrict__ x,  // [n]
                              const typename Acc<T>::type* __restrict__ coef, int64_t n) {
  using A = typename Acc<T>::type;
  const A mean = coef[0], rstd = coef[1];
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    x[i] = from_acc<T>((A(to_acc(x[i])) - mean) * rstd);
  }
}

template <typename T, typename M, typename O, ScanKind K, bool kWhiten>
void launch_scan(const ScanRows& rows, const void* rewards, const void* values, const void* mask, void* out,
                 void* ret, void* moments, double gamma, double gl, cudaStream_t stream) {
  using A = typename Acc<T>::type;
  scan_kernel<T, M, O, K, kWhiten><<<static_cast<unsigned int>(rows.rows), kThreads, 0, stream>>>(
      rows, static_cast<const T*>(rewards), static_cast<const T*>(values), static_cast<const M*>(mask),
      static_cast<T*>(out), static_cast<T*>(ret), static_cast<A*>(moments), A(gamma), A(gl));
}

template <typename T, typename M, typename O>
void dispatch_kind(int kind, bool whiten, const ScanRows& rows, const void* rewards, const void* values,
                   const void* mask, void* out, void* ret, void* moments, double gamma, double gl,
                   cudaStream_t stream) {
  if (kind == int(ScanKind::Returns)) {
    launch_scan<T, M, O, ScanKind::Returns, false>(rows, rewards, values, mask, out, ret, moments, gamma, gl, stream);
  } else if (whiten) {
    launch_scan<T, M, O, ScanKind::GAE, true>(rows, rewards, values, mask, out, ret, moments, gamma, gl, stream);
  } else {
    launch_scan<T, M, O, ScanKind::GAE, false>(rows, rewards, values, mask, out, ret, moments, gamma, gl, stream);
  }
}

}  // namespace

cudaError_t scan_forward(DType dtype, bool mask_is_bool, int kind, const ScanRows& rows, const void* rewards,
                         const void* values, const void* mask, void* out, void* ret, void* moments, double gamma,
                         double gamma_lam, cudaStream_t stream) {
  if (rows.rows == 0) return cudaSuccess;
  if (rows.rows > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const bool whiten = moments != nullptr;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    if (mask_is_bool) {
      if (rows.offsets_int64) {
        dispatch_kind<T, bool, int64_t>(kind, whiten, rows, rewards, values, mask, out, ret, moments, gamma,
                                        gamma_lam, stream);
      } else {
        dispatch_kind<T, bool, int32_t>(kind, whiten, rows, rewards, values, mask, out, ret, moments, gamma,
                                        gamma_lam, stream);
      }
    } else {
      if (rows.offsets_int64) {
        dispatch_kind<T, T, int64_t>(kind, whiten, rows, rewards, values, mask, out, ret, moments, gamma, gamma_lam,
                                     stream);
      } else {
        dispatch_kind<T, T, int32_t>(kind, whiten, rows, rewards, values, mask, out, ret, moments, gamma, gamma_lam,
                                     stream);
      }
    }
  });
  return cudaGetLastError();
}

cudaError_t whiten_apply(DType dtype, void* x, const void* coef, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    whiten_kernel<T><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(static_cast<T*>(x),
                                                                               static_cast<const A*>(coef), n);
  });
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rlk
