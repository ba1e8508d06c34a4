// Shape, dtype and device checks of rlkernels::optimal_token_baseline, shared by its CPU and CUDA bindings
// (csrc/cpu/optimal_token_baseline.cpp, csrc/cuda/optimal_token_baseline_binding.cpp). Values are the kernels'
// to check (their `ok` flag).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "rlkernels/torch_utils.h"

namespace rlk {

inline void check_otb_inputs(const char* op, const at::Tensor& rewards, const at::Tensor& mask,
                             const at::Tensor& group_ids, const at::Tensor& old_logp,
                             const at::Tensor& sum_pi_squared, const std::optional<at::Tensor>& rollout_is_weights,
                             double eps) {
  TORCH_CHECK(rewards.dim() == 2, op, ": rewards must be [B, T], got ", rewards.sizes());
  TORCH_CHECK(rewards.scalar_type() == at::kFloat || rewards.scalar_type() == at::kDouble, op,
              ": rewards must be float32 or float64, got ", rewards.scalar_type());
  check_same_layout(op, rewards, "rewards", old_logp, "old_logp");
  check_same_layout(op, rewards, "rewards", sum_pi_squared, "sum_pi_squared");
  if (rollout_is_weights.has_value()) {
    check_same_layout(op, rewards, "rewards", *rollout_is_weights, "rollout_is_weights");
  }
  TORCH_CHECK(mask.sizes() == rewards.sizes(), op, ": mask ", mask.sizes(), " must have rewards' shape ",
              rewards.sizes());
  TORCH_CHECK(mask.scalar_type() == at::kBool || mask.scalar_type() == at::kLong ||
                  mask.scalar_type() == rewards.scalar_type(),
              op, ": mask must be bool, int64 (0 / 1) or rewards' dtype, got ", mask.scalar_type());
  TORCH_CHECK(mask.device() == rewards.device(), op, ": mask and rewards must be on the same device");
  TORCH_CHECK(group_ids.dim() == 1 && group_ids.size(0) == rewards.size(0), op, ": group_ids must be [B] = [",
              rewards.size(0), "], got ", group_ids.sizes());
  TORCH_CHECK(group_ids.scalar_type() == at::kInt || group_ids.scalar_type() == at::kLong, op,
              ": group_ids must be int32 or int64, got ", group_ids.scalar_type());
  TORCH_CHECK(group_ids.device() == rewards.device(), op, ": group_ids and rewards must be on the same device");
  TORCH_CHECK(eps >= 0, op, ": eps must be >= 0, got ", eps);
}

}  // namespace rlk
