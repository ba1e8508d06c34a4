// rollout_correction's fused pass: the names shared by the CPU kernel, the CUDA kernel and their bindings
// (formulas: rlkernels/reference/rollout_correction.py). Torch-free, host and device.
#pragma once

namespace rlk {

// The rows of the [kNumStats, B] output, in rlkernels.reference.rollout_correction.ROW_SUMS order.
enum RolloutStat { kCount, kSumD, kSumK3, kSumAbs, kMaxAbs, kSumW, kMinW, kMaxW, kHigh, kLow, kOob, kRejection, kNumStats };
// The rejection statistic's aggregation (rlkernels.triton.rollout_correction.REJECTION_AGGS, + none).
enum RejectionAgg { kNoRejection, kTokenAgg, kSumAgg, kMaxAgg };

}  // namespace rlk
