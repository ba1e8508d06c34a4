// Launchers of the policy_loss CUDA kernels (csrc/cuda/policy_loss.cu), called by policy_loss_binding.cpp.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/dtype.h"
#include "rlkernels/policy_config.h"

namespace rlk {
namespace cuda {

// The tensors of one call: contiguous [B, T] (advantages / is_weights [B] when not per token); mask is
// bool or of the accumulation type; ref / entropy / is_weights may be null.
struct PolicyLossTensors {
  const void* logp;
  const void* old_logp;
  const void* advantages;
  const void* mask;
  const void* ref_logp;
  const void* entropy;
  const void* is_weights;
  bool mask_is_bool, adv_per_token, isw_per_token;
  int64_t B, T;
};

// Accumulation-type elements of the workspace policy_loss_forward needs.
int64_t policy_loss_workspace(int64_t B, int64_t T);

// The options `c` as the binding parsed them (make_policy_config). row_loss [B], row_stats [B, kRowStats]
// (RowStat columns), saved [B, T] (null: not saved), workspace: all of the accumulation type (fp32, fp64 for
// fp64 inputs).
cudaError_t policy_loss_forward(DType dtype, const PolicyLossTensors& x, const PolicyLossConfig& c, void* row_loss,
                                void* row_stats, void* saved, void* workspace, cudaStream_t stream);

// grad_rows [B] and row_stats [B, kRowStats] of the accumulation type; saved [B, T] or null (recompute);
// grad_logp [B, T] and grad_entropy [B, T] of `dtype`, each null when not wanted.
cudaError_t policy_loss_backward(DType dtype, const PolicyLossTensors& x, const PolicyLossConfig& c,
                                 const void* grad_rows, const void* row_stats, const void* saved, void* grad_logp,
                                 void* grad_entropy, cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
