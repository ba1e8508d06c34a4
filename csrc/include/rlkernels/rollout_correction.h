// rollout_correction's fused pass: the names, options and dispatch shared by the CPU kernel, the CUDA kernel and
// their bindings (formulas: rlkernels/reference/rollout_correction.py). Torch-free.
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

#include "rlkernels/common.h"

namespace rlk {

// The rows of the [kNumStats, B] output, in rlkernels.reference.rollout_correction.ROW_SUMS order.
enum RolloutStat {
  kCount, kSumD, kSumK3, kSumAbs, kMaxAbs, kSumW, kMinW, kMaxW, kHigh, kLow, kOob, kRejection, kNumStats
};
// The rejection statistic's aggregation (rlkernels.triton.rollout_correction.REJECTION_AGGS, + none).
enum RejectionAgg { kNoRejection, kTokenAgg, kSumAgg, kMaxAgg };

// The options as numbers of a kernel's accumulation type A (open bounds: inf / 0 / -inf).
template <typename A>
struct RolloutBounds {
  A clamp, rho_min, rho_max;  // |log ρ| bound, and e^{∓clamp}: ρ = clamp(e^d, rho_min, rho_max) (reference)
  A clip_min, clip_max, low_bound, rej_low, rej_high;
  A finite_max;  // where torch.nan_to_num puts ±inf

  // The same options in the accumulation type B (host code).
  template <typename B>
  RolloutBounds<B> to() const {
    return {B(clamp),    B(rho_min), B(rho_max),  B(clip_min),
            B(clip_max), B(low_bound), B(rej_low), B(rej_high), std::numeric_limits<B>::max()};
  }
};

// From the op's float options, e^{∓clamp} in double as the reference computes them (host code).
inline RolloutBounds<double> rollout_bounds(double clamp, double clip_min, double clip_max, double low_bound,
                                            double rej_low, double rej_high) {
  return {clamp,     std::exp(-clamp), std::exp(clamp), clip_min, clip_max,
          low_bound, rej_low,          rej_high,        std::numeric_limits<double>::max()};
}

// ---- The batch's finishing (rlkernels/ops/rollout_correction.py; the Triton kernel mirrors it): from every
// row's sums, the metrics, the sequence-level weights, the batch normalization and the rows' rejection. ----

// The metrics, in rlkernels.triton.rollout_correction.METRICS order (the op's [kNumMetrics] output; the
// Python API keeps those the options define).
enum RolloutMetric {
  kMKl, kMK3Kl, kMLogPplDiff, kMSeqKlK1, kMSeqKlK3, kMDiffMean, kMDiffMax, kMFractionHigh, kMFractionLow,
  kMOobRatio, kMIsMean, kMRatioMin, kMRatioMax, kMRatioMean, kMBatchNormFactor, kMRsMaskedFraction,
  kMRsSeqMaskedFraction, kNumMetrics
};
// The batch's totals: sums, and maxima (a minimum kept as the maximum of its negation).
enum RolloutTotal {
  kTCount, kTSumD, kTSumK3, kTSumAbs, kTLogPpl, kTRows, kTSeqK1, kTSeqK3, kTWeightSum, kTHigh, kTLow, kTOob,
  kTSeqWeights, kTRejected, kTRejectedRows, kNumTotals
};
enum RolloutExtreme { kXMaxAbs, kXMaxW, kXNegMinW, kNumExtremes };
// The options' levels (0: no weights).
enum RolloutLevel { kNoLevel = 0, kTokenLevel = 1, kSequenceLevel = 2 };
// verl rollout_is_batch_normalize: a mean below this is not divided by.
constexpr double kBatchNormMin = 1e-8;

template <typename A>
struct RolloutFinish {
  RolloutBounds<A> b;
  A log_upper, log_low;  // log(clip_max), log(low_bound) as the reference compares Σd with them
  int level, agg;        // RolloutLevel, RejectionAgg
  bool mask_mode, seq_mean, batch_normalize;

  // The same options in the accumulation type B (host code).
  template <typename B>
  RolloutFinish<B> to() const {
    return {b.template to<B>(), B(log_upper), B(log_low), level, agg, mask_mode, seq_mean, batch_normalize};
  }
};

template <typename A>
RLK_HOST_DEVICE A rollout_clamp(A x, A lo, A hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// The sequence-level weight of a row from its Σd and valid-token count (0 for an empty row).
template <typename A>
RLK_HOST_DEVICE A sequence_weight(A sum_d, A count, const RolloutFinish<A>& f) {
  const A rho = exp_(rollout_clamp(sum_d, -f.b.clamp, f.b.clamp));
  const bool low = rho < f.b.clip_min, high = rho > f.b.clip_max;
  const A w = f.mask_mode ? (low || high ? A(0) : rho) : (low ? f.b.clip_min : (high ? f.b.clip_max : rho));
  return count > A(0) ? w : A(0);
}

// Whether a seq_* rejection keeps the row (its statistic: the rejection column of its sums).
template <typename A>
RLK_HOST_DEVICE bool row_kept(A rejection, A count, const RolloutFinish<A>& f) {
  A value = rejection;
  if (f.seq_mean) value = rejection / (count > A(1) ? count : A(1));
  if (f.agg == kMaxAgg) value = count > A(0) ? rejection : A(0);
  return value >= f.b.rej_low && value <= f.b.rej_high;
}

// Adds one row's sums (row[s] = the RolloutStat column s) to the totals.
template <typename A>
RLK_HOST_DEVICE void add_rollout_row(const A* row, const RolloutFinish<A>& f, A* t, A* x) {
  const A count = row[kCount], sum_d = row[kSumD];
  const bool nonempty = count > A(0);
  t[kTCount] += count;
  t[kTSumD] += sum_d;
  t[kTSumK3] += row[kSumK3];
  t[kTSumAbs] += row[kSumAbs];
  t[kTLogPpl] += -sum_d / (count > A(1) ? count : A(1));
  x[kXMaxAbs] = row[kMaxAbs] > x[kXMaxAbs] ? row[kMaxAbs] : x[kXMaxAbs];
  if (nonempty) {
    const A sc = rollout_clamp(sum_d, -f.b.clamp, f.b.clamp);
    t[kTRows] += A(1);
    t[kTSeqK1] += -sum_d;
    t[kTSeqK3] += exp_(sc) - sc - A(1);
  }
  if (f.level == kTokenLevel) {
    t[kTWeightSum] += row[kSumW];
    t[kTHigh] += row[kHigh];
    t[kTLow] += row[kLow];
    t[kTOob] += row[kOob];
    x[kXMaxW] = row[kMaxW] > x[kXMaxW] ? row[kMaxW] : x[kXMaxW];
    x[kXNegMinW] = -row[kMinW] > x[kXNegMinW] ? -row[kMinW] : x[kXNegMinW];
  } else if (f.level == kSequenceLevel) {
    const A w = sequence_weight(sum_d, count, f);
    const A rho = exp_(rollout_clamp(sum_d, -f.b.clamp, f.b.clamp));
    t[kTWeightSum] += w * count;
    t[kTSeqWeights] += w;
    t[kTHigh] += sum_d > f.log_upper ? A(1) : A(0);  // over every row (verl: an empty row has Σd = 0)
    t[kTLow] += sum_d < f.log_low ? A(1) : A(0);
    t[kTOob] += nonempty && (rho < f.b.clip_min || rho > f.b.clip_max) ? count : A(0);
    x[kXMaxW] = nonempty && w > x[kXMaxW] ? w : x[kXMaxW];
    x[kXNegMinW] = nonempty && -w > x[kXNegMinW] ? -w : x[kXNegMinW];
  }
  if (f.agg != kNoRejection) {
    const A rejected = f.agg == kTokenAgg ? row[kRejection] : (row_kept(row[kRejection], count, f) ? A(0) : count);
    t[kTRejected] += rejected;
    t[kTRejectedRows] += rejected > A(0) ? A(1) : A(0);
  }
}

// The totals before any row: sums 0, maxima -inf (max |d| 0).
template <typename A>
RLK_HOST_DEVICE void rollout_totals_init(A* t, A* x) {
  for (int i = 0; i < kNumTotals; ++i) t[i] = A(0);
  x[kXMaxAbs] = A(0);
  x[kXMaxW] = -A(INFINITY);
  x[kXNegMinW] = -A(INFINITY);
}

// The metrics from the totals of `rows` rows; returns the factor the weights are divided by (1 without
// batch_normalize, or when the mean is below kBatchNormMin).
template <typename A>
RLK_HOST_DEVICE A rollout_metrics(const A* t, const A* x, int64_t rows, const RolloutFinish<A>& f, A* m) {
  const A total = t[kTCount], per_token = total > A(1) ? total : A(1);
  const A nonempty = t[kTRows], per_row = nonempty > A(1) ? nonempty : A(1);
  const A b = A(rows), per_b = rows > 1 ? A(rows) : A(1);
  m[kMKl] = -t[kTSumD] / per_token;
  m[kMK3Kl] = t[kTSumK3] / per_token;
  m[kMLogPplDiff] = rows > 0 ? t[kTLogPpl] / b : A(0);
  m[kMSeqKlK1] = t[kTSeqK1] / per_row;
  m[kMSeqKlK3] = t[kTSeqK3] / per_row;
  m[kMDiffMean] = t[kTSumAbs] / per_token;
  m[kMDiffMax] = rows > 0 ? x[kXMaxAbs] : A(0);
  const A per_count = f.level == kSequenceLevel ? per_b : per_token;  // the sequence fractions count rows
  m[kMFractionHigh] = t[kTHigh] / per_count;
  m[kMFractionLow] = t[kTLow] / per_count;
  m[kMOobRatio] = t[kTOob] / per_token;
  const A mean_w = t[kTWeightSum] / per_token;
  m[kMIsMean] = mean_w;
  m[kMRatioMin] = total > A(0) ? -x[kXNegMinW] : A(0);
  m[kMRatioMax] = total > A(0) ? x[kXMaxW] : A(0);
  const A row_mean = t[kTSeqWeights] / per_row;
  m[kMRatioMean] = f.level == kSequenceLevel ? row_mean : mean_w;
  const A norm = f.level == kSequenceLevel ? row_mean : mean_w;
  const A factor = f.batch_normalize && norm > A(kBatchNormMin) ? norm : A(1);
  m[kMBatchNormFactor] = factor;
  m[kMRsMaskedFraction] = t[kTRejected] / per_token;
  m[kMRsSeqMaskedFraction] = rows > 0 ? t[kTRejectedRows] / b : A(0);
  return factor;
}

// Calls f(std::integral_constant<int, agg>{}) so that a kernel is compiled once per aggregation (host code).
template <typename F>
void dispatch_agg(int agg, F&& f) {
  switch (agg) {
    case kTokenAgg:
      return f(std::integral_constant<int, kTokenAgg>{});
    case kSumAgg:
      return f(std::integral_constant<int, kSumAgg>{});
    case kMaxAgg:
      return f(std::integral_constant<int, kMaxAgg>{});
    default:
      return f(std::integral_constant<int, kNoRejection>{});
  }
}

}  // namespace rlk
