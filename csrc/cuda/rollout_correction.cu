// rollout_correction's one pass over the tokens on CUDA, the twin of csrc/cpu/rollout_correction.cpp and
// rlkernels/triton/rollout_correction.py (formulas: rlkernels/reference/rollout_correction.py). One block per
// row: each thread strides over the row's tokens, writes the token weights and keep mask, and carries its
// partial row sums; fixed-tree block reductions (block_reduce.cuh) make the row sums deterministic.
#include "block_reduce.cuh"
#include "common.cuh"
#include "rlkernels/common.h"
#include "rlkernels/rollout_correction.h"
#include "rollout_correction.h"

namespace rlk {
namespace cuda {
namespace {

// 8 warps per row: rows are a few thousand tokens, a block streams one with 256-wide coalesced loads.
constexpr int kRowThreads = 256;
// The block sums and maxima: 8 sums (count, Σd, Σk3, Σ|d|, Σw, #high, #low, #oob) + the rejection's; 3 maxima
// (max|d|, max w, −min w) + the rejection's.
constexpr int kSums = 9;
constexpr int kMaxes = 4;

template <typename T, typename A, bool kWeights, int kAgg>
__global__ void __launch_bounds__(kRowThreads)
    rows_kernel(const T* __restrict__ old,      // [b, t]
                const T* __restrict__ roll,     // [b, t]
                const bool* __restrict__ valid,  // [b, t]
                A* __restrict__ w,              // [b, t] (kWeights) or nullptr
                bool* __restrict__ keep,        // [b, t] (kAgg == kTokenAgg) or nullptr
                A* __restrict__ stats,          // [kNumStats, b]
                int64_t b, int64_t t, bool mask_mode, RolloutBounds<A> bd, int kind) {
  __shared__ A smem[(kSums > kMaxes ? kSums : kMaxes) * (kRowThreads / 32)];
  const A inf = A(INFINITY);
  const int64_t row = blockIdx.x;
  const int64_t base = row * t;
  // sums: count, Σd, Σ(e^d − d − 1), Σ|d|, Σw, #high, #low, #oob, rejection (token count or Σ stat)
  A sums[kSums] = {};
  // maxima: max|d|, max w, −min w, rejection (max stat)
  A maxes[kMaxes] = {A(0), -inf, -inf, -inf};
  for (int64_t j = threadIdx.x; j < t; j += kRowThreads) {
    const bool in = valid[base + j];
    A d = in ? A(to_acc(old[base + j])) - A(to_acc(roll[base + j])) : A(0);
    d = d != d ? A(0) : d;  // torch.nan_to_num: NaN -> 0, ±inf -> ±max
    d = clamp_value(d, -bd.finite_max, bd.finite_max);
    const A e = exp_(d), ad = abs_(d), v = in ? A(1) : A(0);
    sums[0] += v;
    sums[1] += d;
    sums[2] += in ? e - d - A(1) : A(0);
    sums[3] += ad;
    maxes[0] = ad > maxes[0] ? ad : maxes[0];
    if (kWeights) {
      const A rho = clamp_value(e, bd.rho_min, bd.rho_max);
      const bool low = rho < bd.clip_min, high = rho > bd.clip_max;
      A wt = mask_mode ? (low || high ? A(0) : rho) : (low ? bd.clip_min : (high ? bd.clip_max : rho));
      wt = in ? wt : A(0);
      w[base + j] = wt;
      sums[4] += wt;
      maxes[1] = in && wt > maxes[1] ? wt : maxes[1];
      maxes[2] = in && -wt > maxes[2] ? -wt : maxes[2];
      sums[5] += in && high ? A(1) : A(0);
      sums[6] += in && rho < bd.low_bound ? A(1) : A(0);
      sums[7] += in && (low || high) ? A(1) : A(0);
    }
    if (kAgg != kNoRejection) {
      const A lr = clamp_value(d, -bd.clamp, bd.clamp);
      const A stat = kind == 1 ? -lr : (kind == 2 ? A(0.5) * lr * lr : exp_(lr) - A(1) - lr);
      if (kAgg == kTokenAgg) {
        const bool ok = stat >= bd.rej_low && stat <= bd.rej_high;
        keep[base + j] = in && ok;
        sums[8] += in && !ok ? A(1) : A(0);
      } else if (kAgg == kSumAgg) {
        sums[8] += in ? stat : A(0);
      } else {
        maxes[3] = in && stat > maxes[3] ? stat : maxes[3];
      }
    }
  }
  block_sum<kRowThreads>(sums, smem);
  __syncthreads();  // smem is reused
  block_max<kRowThreads>(maxes, smem, -inf);
  if (threadIdx.x == 0) {
    stats[kCount * b + row] = sums[0];
    stats[kSumD * b + row] = sums[1];
    stats[kSumK3 * b + row] = sums[2];
    stats[kSumAbs * b + row] = sums[3];
    stats[kMaxAbs * b + row] = maxes[0];
    stats[kSumW * b + row] = sums[4];
    stats[kMinW * b + row] = -maxes[2];
    stats[kMaxW * b + row] = maxes[1];
    stats[kHigh * b + row] = sums[5];
    stats[kLow * b + row] = sums[6];
    stats[kOob * b + row] = sums[7];
    stats[kRejection * b + row] = kAgg == kMaxAgg ? maxes[3] : sums[8];
  }
}

template <typename T, typename A, bool kWeights, int kAgg>
void launch(const void* old, const void* roll, const bool* valid, void* w, bool* keep, void* stats, int64_t b,
            int64_t t, bool mask_mode, const RolloutBounds<double>& r, int kind, cudaStream_t stream) {
  rows_kernel<T, A, kWeights, kAgg><<<static_cast<unsigned int>(b), kRowThreads, 0, stream>>>(
      static_cast<const T*>(old), static_cast<const T*>(roll), valid, static_cast<A*>(w), keep,
      static_cast<A*>(stats), b, t, mask_mode, r.to<A>(), kind);
}

template <typename T, typename A>
void dispatch_options(const void* old, const void* roll, const bool* valid, void* w, bool* keep, void* stats,
                      int64_t b, int64_t t, bool token_weights, bool mask_mode, const RolloutBounds<double>& r,
                      int kind, int agg, cudaStream_t stream) {
  dispatch_bool(token_weights, [&](auto kWeights) {
    dispatch_agg(agg, [&](auto kAgg) {
      launch<T, A, kWeights.value, kAgg.value>(old, roll, valid, w, keep, stats, b, t, mask_mode, r, kind, stream);
    });
  });
}

}  // namespace

cudaError_t rollout_correction_rows(DType dtype, const void* logp_old, const void* logp_rollout, const bool* valid,
                                   void* w, bool* keep, void* stats, int64_t b, int64_t t, bool token_weights,
                                   bool mask_mode, const RolloutBounds<double>& bounds, int kind, int agg,
                                   cudaStream_t stream) {
  if (b == 0) return cudaSuccess;
  if (b > 0x7fffffff) return cudaErrorInvalidConfiguration;  // one block per row
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    dispatch_options<T, A>(logp_old, logp_rollout, valid, w, keep, stats, b, t, token_weights, mask_mode, bounds,
                           kind, agg, stream);
  });
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rlk
