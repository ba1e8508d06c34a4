// The outcome estimators that are not a group_advantages mode, per response from its group's statistics;
// shared by the CPU and CUDA kernels (the Triton kernels mirror them). Semantics:
// rlkernels/reference/advantage_estimators.py (grpo_passk_scores, opo_scores), verl 0.9.1.
#pragma once

#include "rlkernels/advantages.h"  // unbiased_std, scaled

namespace rlk {

// grpo_passk: score r in a group of n whose best score `best` is held by `ties` responses, second best
// `second`, centered sum of squares m2. Only a unique best of a group of two or more learns, from the gap.
template <typename T>
RLK_HOST_DEVICE T passk_advantage(T r, T n, T best, T ties, T second, T m2, T eps, bool norm_by_std) {
  if (!(r == best && ties == T(1) && n > T(1))) return T(0);
  const T gap = best - second;
  return norm_by_std ? scaled(gap, unbiased_std(n, m2, T(1)) + eps) : gap;
}

// opo: score r minus its group's length-weighted mean pivot + Σ L (s − pivot) / Σ L (weight = Σ L); the
// baseline is 0 in a group of one or of empty responses only. The pivot (a member's score) makes a
// constant group's baseline exactly its score.
template <typename T>
RLK_HOST_DEVICE T opo_advantage(T r, T n, T pivot, T weighted_shift, T weight) {
  const T baseline = n > T(1) && weight > T(0) ? pivot + weighted_shift / weight : T(0);
  return r - baseline;
}

}  // namespace rlk
