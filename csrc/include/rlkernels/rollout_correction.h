// rollout_correction's fused pass: the names, options and dispatch shared by the CPU kernel, the CUDA kernel and
// their bindings (formulas: rlkernels/reference/rollout_correction.py). Torch-free.
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

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
