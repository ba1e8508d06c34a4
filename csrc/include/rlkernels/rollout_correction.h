// rollout_correction's fused pass: the names shared by the CPU kernel, the CUDA kernel and their bindings
// (formulas: rlkernels/reference/rollout_correction.py). Torch-free, host and device.
#pragma once

#include <type_traits>

namespace rlk {

// The rows of the [kNumStats, B] output, in rlkernels.reference.rollout_correction.ROW_SUMS order.
enum RolloutStat { kCount, kSumD, kSumK3, kSumAbs, kMaxAbs, kSumW, kMinW, kMaxW, kHigh, kLow, kOob, kRejection, kNumStats };
// The rejection statistic's aggregation (rlkernels.triton.rollout_correction.REJECTION_AGGS, + none).
enum RejectionAgg { kNoRejection, kTokenAgg, kSumAgg, kMaxAgg };

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
