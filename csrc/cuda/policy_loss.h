// Launchers of the policy_loss CUDA kernels (csrc/cuda/policy_loss.cu), called by policy_loss_binding.cpp.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "rlkernels/aggregation.h"
#include "rlkernels/dtype.h"
#include "rlkernels/policy_config.h"
#include "rows.h"

namespace rlk {
namespace cuda {

// The tensors of one call, each at its row stride (rows.h): [B, T] (advantages / is_weights [B] when not per
// token); mask of mask_type (float: of the accumulation type); ref / entropy / is_weights may be null.
struct PolicyLossTensors {
  RowsArg logp, old_logp, advantages, mask, ref_logp, entropy, is_weights;
  MaskType mask_type;
  bool adv_per_token, isw_per_token;
  int64_t B, T;
};

// The forward's outputs, of the accumulation type (fp32, fp64 for fp64 inputs) but ok.
struct PolicyLossOutputs {
  void* loss;         // []
  void* stats;        // [kRowStats - kFirstStat] the stat means (policy_config.STAT_KEYS)
  void* row_weights;  // [B] d loss / d row sum
  void* row_stats;    // [B, kRowStats] (RowStat columns)
  void* saved;        // [B, T] m · d L / d logp, or null (not saved)
  bool* ok;           // [] no input value rejected
};

// Accumulation-type elements of the workspace policy_loss_forward needs.
int64_t policy_loss_workspace(int64_t B, int64_t T);

// One launch (two with c.seq_level) computes every output, the aggregation finished by the last block.
// The options `c` and `agg` as the binding parsed them (make_policy_config, make_agg_args); counter: the
// zeroed int32 of aggregation_host.h launch_counter for this device and stream (left at zero).
cudaError_t policy_loss_forward(DType dtype, const PolicyLossTensors& x, const PolicyLossConfig& c,
                                const AggParams& agg, const PolicyLossOutputs& out, void* workspace,
                                unsigned int* counter, cudaStream_t stream);

// One launch: grad_loss [1], row_weights [B] and row_stats [B, kRowStats] of the accumulation type; saved [B, T]
// or null (recompute); grad_logp [B, T] and grad_entropy [B, T] of `dtype`, each null when not wanted.
cudaError_t policy_loss_backward(DType dtype, const PolicyLossTensors& x, const PolicyLossConfig& c,
                                 const void* grad_loss, const void* row_weights, const void* row_stats,
                                 const void* saved, void* grad_logp, void* grad_entropy, cudaStream_t stream);

// One launch: saved [B, T] (fp32 / fp64 `dtype`, the forward's m · d L / d logp, contiguous) scaled in place by
// grad_loss [1] · row_weights[b] into d logp; grad_entropy [B, T] (or null) = -grad_loss · row_weights[b] ·
// entropy_coef · m.
cudaError_t policy_loss_backward_into_saved(DType dtype, MaskType mask_type, int64_t B, int64_t T, void* saved,
                                            RowsArg mask, const void* grad_loss, const void* row_weights,
                                            double entropy_coef, void* grad_entropy, cudaStream_t stream);

}  // namespace cuda
}  // namespace rlk
