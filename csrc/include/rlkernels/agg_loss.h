// agg_loss: verl's `agg_loss` over a given token loss L [B, T] (spec: rlkernels/reference/aggregation.py,
// verl 0.9.1 core_algos.agg_loss). The kernels reduce per row the masked sum Σ m·L, the mask sum Σ m and the
// count of rejected mask values (AggLossPart columns), which aggregation.h finishes into the loss and the rows'
// weights c_b; the gradient is d loss / d L = c_b · m. A masked-out token adds exactly 0, even a NaN there;
// a NaN or inf at a kept token is the loss's, as in verl (agg_loss aggregates, it does not judge the loss).
#pragma once

namespace rlk {

// Columns of the kernels' per-row (and per-chunk) sums; rlkernels/triton/agg_loss.py uses the same.
enum AggLossPart : int { kAggLossSum = 0, kAggLossCount = 1, kAggLossBad = 2, kAggLossParts = 3 };

}  // namespace rlk
