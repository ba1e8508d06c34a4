// Clipped PPO critic loss per token, shared by the CPU loops and the CUDA kernels (spec:
// rlkernels/reference/value_loss.py, verl compute_value_loss):
//     L = 0.5 · max((v - R)^2, (clip(v, old - c, old + c) - R)^2)
// The kernels reduce per row the masked sums Σ m·L, Σ m, Σ m·clipped and the count of rejected input values
// (ValuePart columns), which aggregation.h finishes into the loss, clipfrac and the rows' weights.
#pragma once

#include "rlkernels/select.h"

namespace rlk {

// Columns of the kernels' per-row (and per-chunk) sums; rlkernels/triton/value_loss.py uses the same.
enum ValuePart : int { kValueLoss = 0, kValueCount = 1, kValueClipped = 2, kValueBad = 3, kValueParts = 4 };

template <typename T>
struct VLToken {
  T loss, dvalue, clipped;
};

// `clip` is +inf for the unclipped loss.
template <typename T>
RLK_HOST_DEVICE VLToken<T> value_token(T v, T old, T ret, T clip) {
  const T lo = old - clip, hi = old + clip;
  const T d1 = v - ret;
  const T d2 = clamp_value(v, lo, hi) - ret;
  const T use2 = one_if<T>(d2 * d2 > d1 * d1);  // 0/1 values: vectorizable selects (select.h)
  VLToken<T> out;
  out.loss = T(0.5) * (use2 > T(0) ? d2 * d2 : d1 * d1);
  out.dvalue = use2 > T(0) ? d2 * one_if<T>((v >= lo) & (v <= hi)) : d1;
  out.clipped = use2;
  return out;
}

}  // namespace rlk
