// rollout_correction on CUDA in one launch (+1 where the tokens need the batch's answer), the twin of
// csrc/cpu/rollout_correction.cpp and rlkernels/triton/rollout_correction.py (formulas:
// rlkernels/reference/rollout_correction.py). One block per row: each thread strides over the row's tokens,
// writes the token weights and a token rejection's mask (in the mask's dtype), and carries its partial row
// sums; fixed-tree block reductions (block_reduce.cuh) make the row sums deterministic. The last block to finish
// (last_block.cuh) merges every row's sums into the metrics, the sequence-level weights and each row's seq_*
// rejection (rlkernels/rollout_correction.h), and the mask's validity; tokens_kernel then divides the token
// weights by the batch mean (batch_normalize) or writes a seq_* rejection's mask.
#include <type_traits>

#include "block_reduce.cuh"
#include "common.cuh"
#include "last_block.cuh"
#include "rlkernels/common.h"
#include "rlkernels/rollout_correction.h"
#include "rollout_correction.h"

namespace rlk {
namespace cuda {
namespace {

// 8 warps per row: rows are a few thousand tokens, a block streams one with 256-wide coalesced loads.
constexpr int kRowThreads = 256;
// The block sums and maxima: 8 sums (count, Σd, Σk3, Σ|d|, Σw, #high, #low, #oob), the rejection's, the bad
// mask values; 3 maxima (max|d|, max w, −min w) + the rejection's.
constexpr int kSums = 10;
constexpr int kMaxes = 4;
// Columns of a row's partials: its RolloutStat sums, then its bad mask values.
constexpr int kParts = kNumStats + 1;

// A mask value: bool and int64 as they are, float weights in A; (valid, bad).
template <typename A, typename M>
__device__ __forceinline__ bool mask_valid(M x, bool& bad) {
  if constexpr (std::is_same_v<M, bool>) {
    bad = false;
  } else if constexpr (std::is_same_v<M, int64_t>) {
    bad = x != 0 && x != 1;
  } else {
    bad = !(x >= M(0) && x < M(INFINITY));
  }
  return x != M(0);
}

template <typename T, typename A, typename M, int kAgg>
__global__ void __launch_bounds__(kRowThreads)
    rows_kernel(const T* __restrict__ old, int64_t ld_old,    // [b, t] row stride ld_old
                const T* __restrict__ roll, int64_t ld_roll,  // [b, t]
                const M* __restrict__ mask, int64_t ld_mask,  // [b, t] bool / int64 / A
                A* __restrict__ w,              // [b, t] (token level) or [b] (sequence level) or nullptr
                M* __restrict__ out_mask,       // [b, t] (kAgg == kTokenAgg) or nullptr
                uint8_t* __restrict__ keep_row,  // [b] (kAgg kSumAgg / kMaxAgg) or nullptr
                A* __restrict__ parts,           // [gridDim.x, kParts]
                unsigned int* __restrict__ counter,  // [1] zero (launch_counter.h)
                A* __restrict__ metrics,             // [kNumMetrics]
                bool* __restrict__ ok,               // [] every mask value valid
                int64_t b, int64_t t, RolloutFinish<A> f, int kind) {
  __shared__ A smem[(kNumTotals + 1 > kSums ? kNumTotals + 1 : kSums) * (kRowThreads / 32)];
  __shared__ A factor;
  const RolloutBounds<A>& bd = f.b;
  const A inf = A(INFINITY);
  const int64_t row = blockIdx.x;
  const bool token_weights = f.level == kTokenLevel;
  // sums: count, Σd, Σ(e^d − d − 1), Σ|d|, Σw, #high, #low, #oob, rejection (token count or Σ stat), bad
  A sums[kSums] = {};
  // maxima: max|d|, max w, −min w, rejection (max stat)
  A maxes[kMaxes] = {A(0), -inf, -inf, -inf};
  for (int64_t j = threadIdx.x; row < b && j < t; j += kRowThreads) {
    bool bad;
    const M raw = mask[row * ld_mask + j];
    const bool in = mask_valid<A>(raw, bad);
    A d = in ? A(to_acc(old[row * ld_old + j])) - A(to_acc(roll[row * ld_roll + j])) : A(0);
    d = d != d ? A(0) : d;  // torch.nan_to_num: NaN -> 0, ±inf -> ±max
    d = clamp_value(d, -bd.finite_max, bd.finite_max);
    const A e = exp_(d), ad = abs_(d), v = in ? A(1) : A(0);
    sums[0] += v;
    sums[1] += d;
    sums[2] += in ? e - d - A(1) : A(0);
    sums[3] += ad;
    sums[9] += bad ? A(1) : A(0);
    maxes[0] = ad > maxes[0] ? ad : maxes[0];
    if (token_weights) {
      const A rho = clamp_value(e, bd.rho_min, bd.rho_max);
      const bool low = rho < bd.clip_min, high = rho > bd.clip_max;
      A wt = f.mask_mode ? (low || high ? A(0) : rho) : (low ? bd.clip_min : (high ? bd.clip_max : rho));
      wt = in ? wt : A(0);
      w[row * t + j] = wt;
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
        const bool keep = stat >= bd.rej_low && stat <= bd.rej_high;
        out_mask[row * t + j] = keep ? raw : M(0);  // the mask, its rejected tokens zeroed
        sums[8] += in && !keep ? A(1) : A(0);
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
    A* p = parts + row * kParts;
    p[kCount] = sums[0];
    p[kSumD] = sums[1];
    p[kSumK3] = sums[2];
    p[kSumAbs] = sums[3];
    p[kMaxAbs] = maxes[0];
    p[kSumW] = sums[4];
    p[kMinW] = -maxes[2];
    p[kMaxW] = maxes[1];
    p[kHigh] = sums[5];
    p[kLow] = sums[6];
    p[kOob] = sums[7];
    p[kRejection] = kAgg == kMaxAgg ? maxes[3] : sums[8];
    p[kNumStats] = sums[9];
  }
  if (!last_block(counter, gridDim.x)) return;
  // The last block: every row's sums, each thread's rows in order, then fixed trees (rollout_correction.h).
  A tot[kNumTotals + 1], ext[kNumExtremes];  // tot[kNumTotals]: the bad mask values
  rollout_totals_init(tot, ext);
  tot[kNumTotals] = A(0);
  for (int64_t i = threadIdx.x; i < b; i += kRowThreads) {
    A rs[kNumStats];
    for (int s = 0; s < kNumStats; ++s) rs[s] = load_partial(parts + i * kParts + s);
    add_rollout_row(rs, f, tot, ext);
    tot[kNumTotals] += load_partial(parts + i * kParts + kNumStats);
  }
  __syncthreads();
  block_sum<kRowThreads>(tot, smem);
  __syncthreads();
  block_max<kRowThreads>(ext, smem, -inf);
  if (threadIdx.x == 0) {
    A m[kNumMetrics];
    factor = rollout_metrics(tot, ext, b, f, m);
    for (int i = 0; i < kNumMetrics; ++i) metrics[i] = m[i];
    *ok = tot[kNumTotals] == A(0);
    RLK_REQUIRE_VALUES(*ok,
                       "rlkernels rollout_correction: a mask value not 0 / 1 (integer) or finite and >= 0 (float)");
  }
  __syncthreads();
  if (f.level != kSequenceLevel && (kAgg == kNoRejection || kAgg == kTokenAgg)) return;
  for (int64_t i = threadIdx.x; i < b; i += kRowThreads) {  // the rows' weights and rejection
    const A count = load_partial(parts + i * kParts + kCount);
    if (f.level == kSequenceLevel) w[i] = sequence_weight(load_partial(parts + i * kParts + kSumD), count, f) / factor;
    if (kAgg == kSumAgg || kAgg == kMaxAgg) {
      keep_row[i] = row_kept(load_partial(parts + i * kParts + kRejection), count, f) ? 1 : 0;
    }
  }
}

// After rows_kernel: token weights divided by the batch normalization factor (metrics[kMBatchNormFactor]),
// and a seq_* rejection's mask (the input mask where the row is kept, else 0).
template <typename A, typename M>
__global__ void tokens_kernel(A* __restrict__ w,                   // [b, t] or nullptr
                              const M* __restrict__ mask, int64_t ld_mask,  // [b, t]
                              M* __restrict__ out_mask,            // [b, t] or nullptr
                              const uint8_t* __restrict__ keep_row,  // [b]
                              const A* __restrict__ metrics, int64_t n, int64_t t) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const A factor = metrics[kMBatchNormFactor];
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (w != nullptr) w[i] /= factor;
    if (out_mask != nullptr) {
      const int64_t row = i / t;
      out_mask[i] = keep_row[row] != 0 ? mask[row * ld_mask + i % t] : M(0);
    }
  }
}

template <typename T, typename A, typename M, int kAgg>
void launch(const RolloutArgs& a, cudaStream_t stream) {
  const int64_t grid = a.b > 0 ? a.b : 1;
  const RolloutFinish<A> f = a.finish.to<A>();
  rows_kernel<T, A, M, kAgg><<<static_cast<unsigned int>(grid), kRowThreads, 0, stream>>>(
      static_cast<const T*>(a.old), a.ld_old, static_cast<const T*>(a.roll), a.ld_roll,
      static_cast<const M*>(a.mask), a.ld_mask, static_cast<A*>(a.w), static_cast<M*>(a.out_mask), a.keep_row,
      static_cast<A*>(a.parts), a.counter, static_cast<A*>(a.metrics), a.ok, a.b, a.t, f, a.kind);
  const bool normalize = f.level == kTokenLevel && f.batch_normalize;
  const bool seq_rejection = kAgg == kSumAgg || kAgg == kMaxAgg;
  const int64_t n = a.b * a.t;
  if (n > 0 && (normalize || seq_rejection)) {
    tokens_kernel<A, M><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(
        normalize ? static_cast<A*>(a.w) : nullptr, static_cast<const M*>(a.mask), a.ld_mask,
        seq_rejection ? static_cast<M*>(a.out_mask) : nullptr, a.keep_row, static_cast<const A*>(a.metrics), n,
        a.t);
  }
}

template <typename T, typename A, typename M>
void dispatch(const RolloutArgs& a, cudaStream_t stream) {
  dispatch_agg(a.finish.agg, [&](auto kAgg) { launch<T, A, M, kAgg.value>(a, stream); });
}

}  // namespace

cudaError_t rollout_correction(DType dtype, int mask_kind, const RolloutArgs& args, cudaStream_t stream) {
  if (args.b > 0x7fffffff) return cudaErrorInvalidConfiguration;  // one block per row
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    if (mask_kind == 0) {
      dispatch<T, A, bool>(args, stream);
    } else if (mask_kind == 1) {
      dispatch<T, A, int64_t>(args, stream);
    } else {
      dispatch<T, A, A>(args, stream);
    }
  });
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rlk
