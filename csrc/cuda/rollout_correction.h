// Launcher of rollout_correction's fused CUDA kernel (csrc/cuda/rollout_correction.cu), called by
// rollout_correction_binding.cpp.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/dtype.h"

namespace rlk {
namespace cuda {

// The options in the accumulation type's precision (open bounds: inf / 0 / -inf).
struct RolloutBounds {
  double clamp, rho_min, rho_max;  // |log ρ| bound, e^{∓clamp}
  double clip_min, clip_max, low_bound, rej_low, rej_high;
};

// logp_old, logp_rollout [b, t] contiguous of `dtype`, valid [b, t] bool. Outputs in the accumulation type
// (fp64 for fp64 inputs, else fp32): w [b, t] (token_weights) or nullptr, keep [b, t] bool (agg kTokenAgg)
// or nullptr, stats [kNumStats, b]. kind 1..3 = k1..k3, agg an rlk::RejectionAgg.
cudaError_t rollout_correction_rows(DType dtype, const void* logp_old, const void* logp_rollout, const bool* valid,
                                   void* w, bool* keep, void* stats, int64_t b, int64_t t, bool token_weights,
                                   bool mask_mode, const RolloutBounds& bounds, int kind, int agg,
                                   cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
