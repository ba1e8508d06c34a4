// Launcher of rollout_correction's CUDA kernels (csrc/cuda/rollout_correction.cu), called by
// rollout_correction_binding.cpp.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/dtype.h"
#include "rlkernels/rollout_correction.h"

namespace rlk {
namespace cuda {

// logp_old, logp_rollout [b, t] of `dtype` and mask [b, t] (mask_kind 0 bool, 1 int64, 2 float weights of the
// accumulation type), each with unit column stride and its row stride. Outputs: w [b, t] (token level), [b]
// (sequence level) or nullptr, and metrics [kNumMetrics], in the accumulation type (fp64 for fp64 inputs, else
// fp32); out_mask [b, t] of the mask's type (with a rejection) or nullptr; keep_row [b] (seq_* rejection) and
// parts [max(b, 1), kNumStats + 1] of the accumulation type: scratch; counter the zeroed launch counter
// (launch_counter.h); ok [] bool, every mask value valid. kind 1..3 = k1..k3. One launch (+1 for token weights
// with batch_normalize, or a seq_* rejection's mask).
struct RolloutArgs {
  const void* old;
  int64_t ld_old;
  const void* roll;
  int64_t ld_roll;
  const void* mask;
  int64_t ld_mask;
  void* w;
  void* out_mask;
  uint8_t* keep_row;
  void* parts;
  unsigned int* counter;
  void* metrics;
  bool* ok;
  int64_t b, t;
  RolloutFinish<double> finish;
  int kind;
};

cudaError_t rollout_correction(DType dtype, int mask_kind, const RolloutArgs& args, cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
