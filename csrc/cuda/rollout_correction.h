// Launcher of rollout_correction's fused CUDA kernel (csrc/cuda/rollout_correction.cu), called by
// rollout_correction_binding.cpp.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/dtype.h"
#include "rlkernels/rollout_correction.h"

namespace rlk {
namespace cuda {

// logp_old, logp_rollout [b, t] contiguous of `dtype`, valid [b, t] bool. Outputs in the accumulation type
// (fp64 for fp64 inputs, else fp32): w [b, t] (token_weights) or nullptr, keep [b, t] bool (agg kTokenAgg)
// or nullptr, stats [kNumStats, b]. bounds: rlk::rollout_bounds of the op's options. kind 1..3 = k1..k3,
// agg an rlk::RejectionAgg.
cudaError_t rollout_correction_rows(DType dtype, const void* logp_old, const void* logp_rollout, const bool* valid,
                                   void* w, bool* keep, void* stats, int64_t b, int64_t t, bool token_weights,
                                   bool mask_mode, const RolloutBounds<double>& bounds, int kind, int agg,
                                   cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
