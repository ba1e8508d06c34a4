// Host-side argument parsing and checks of the policy_loss / value_loss ops, shared by the CPU kernels
// and the CUDA bindings. The Python API (rlkernels/ops/policy_loss.py) already validates and converts
// its arguments; these checks guard direct torch.ops callers.
#pragma once

#include <ATen/OpMathType.h>

#include "rlkernels/aggregation_host.h"
#include "rlkernels/kl_host.h"
#include "rlkernels/policy_loss.h"
#include "rlkernels/torch_utils.h"

namespace rlk {

inline PGObjective checked_pg_objective(c10::string_view objective) {
  const int code = parse_pg_objective(as_std(objective));
  TORCH_CHECK(code >= 0, "rlkernels: unknown policy objective '", objective, "' (expected one of ", kPGObjectiveNames,
              ")");
  return PGObjective(code);
}

// The options of the policy_loss ops (rlkernels/policy_config.py), parsed and checked.
inline PolicyLossConfig make_policy_config(RLK_POLICY_CONFIG_PARAMS) {
  const PolicyLossConfig c = RLK_POLICY_CONFIG_PARSED;
  TORCH_CHECK(c.clip_low > 0 && c.clip_high > 0, "rlkernels::policy_loss: clip_low and clip_high must be > 0");
  TORCH_CHECK(!c.dual_clip || *c.dual_clip > 1, "rlkernels::policy_loss: dual_clip must be > 1");
  const bool per_row = c.objective == PGObjective::GeoMean || c.objective == PGObjective::Vespo;
  TORCH_CHECK(c.seq_level == per_row || c.objective == PGObjective::Clip,
              "rlkernels::policy_loss: seq_level is clip's level='sequence' (GSPO) and must be set for the per-row "
              "objectives geo_mean and vespo, unset for the others");
  return c;
}

// A [B] per-row or [B, T] per-token tensor of `dtype`; returns whether it is per token.
inline bool check_row_or_token(const char* op, const at::Tensor& x, const char* name, const at::Tensor& like) {
  const bool per_token = x.dim() == 2;
  TORCH_CHECK((per_token && x.sizes() == like.sizes()) || (x.dim() == 1 && x.size(0) == like.size(0)), op, ": ",
              name, " must be [B] or [B, T] = ", like.sizes(), ", got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == like.scalar_type(), op, ": ", name, " must have dtype ", like.scalar_type(),
              ", got ", x.scalar_type());
  TORCH_CHECK(x.device() == like.device(), op, ": ", name, " must be on ", like.device());
  return per_token;
}

// mask: [B, T] bool, integer (uint8, int32, int64: 0 / 1, read as it is) or floating of the accumulation type
// of `like` (fp32, or fp64 for fp64 inputs). Returns how the kernels read it.
inline MaskType check_token_mask(const char* op, const at::Tensor& mask, const at::Tensor& like) {
  TORCH_CHECK(mask.sizes() == like.sizes(), op, ": mask ", mask.sizes(), " must have the shape of logp ",
              like.sizes());
  TORCH_CHECK(mask.device() == like.device(), op, ": mask must be on ", like.device());
  const auto acc = acc_scalar_type(like.scalar_type());
  switch (mask.scalar_type()) {
    case at::kBool:
      return MaskType::Bool;
    case at::kByte:
      return MaskType::UInt8;
    case at::kInt:
      return MaskType::Int32;
    case at::kLong:
      return MaskType::Int64;
    default:
      TORCH_CHECK(mask.scalar_type() == acc, op, ": mask must be bool, uint8, int32, int64 or ", acc, ", got ",
                  mask.scalar_type());
      return MaskType::Float;
  }
}

// Returns how the kernels read the mask.
inline MaskType check_policy_inputs(const char* op, const at::Tensor& logp, const at::Tensor& old_logp,
                                    const at::Tensor& mask, const std::optional<at::Tensor>& ref_logp,
                                    const std::optional<at::Tensor>& entropy) {
  TORCH_CHECK(logp.dim() == 2, op, ": logp must be [B, T], got ", logp.sizes());
  check_same_layout(op, logp, "logp", old_logp, "old_logp");
  if (ref_logp) check_same_layout(op, logp, "logp", *ref_logp, "ref_logp");
  if (entropy) check_same_layout(op, logp, "logp", *entropy, "entropy");
  return check_token_mask(op, mask, logp);
}

// The forward's outputs the backward reads, besides grad_loss and row_weights (check_loss_grad): row_stats
// [B, kRowStats] in the accumulation type and saved_grad empty or [B, T]; all on logp's device.
// Returns whether saved_grad holds d S_b / d logp.
inline bool check_policy_backward_state(const char* op, const at::Tensor& grad_loss, const at::Tensor& row_weights,
                                        const at::Tensor& row_stats, const at::Tensor& saved_grad,
                                        const at::Tensor& logp) {
  const int64_t B = logp.size(0);
  const auto acc_type = acc_scalar_type(logp.scalar_type());
  check_loss_grad(op, grad_loss, row_weights, B, acc_type, logp.device());
  TORCH_CHECK(row_stats.sizes() == at::IntArrayRef({B, kRowStats}) && row_stats.scalar_type() == acc_type, op,
              ": row_stats must be [B, ", int(kRowStats), "] of ", acc_type);
  const bool use_saved = saved_grad.numel() > 0;
  TORCH_CHECK(!use_saved || (saved_grad.sizes() == logp.sizes() && saved_grad.scalar_type() == acc_type), op,
              ": saved_grad must be empty or [B, T] of ", acc_type);
  TORCH_CHECK(row_stats.device() == logp.device() && (!use_saved || saved_grad.device() == logp.device()), op,
              ": row_stats and saved_grad must be on ", logp.device());
  return use_saved;
}

}  // namespace rlk
