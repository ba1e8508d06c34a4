// Host-side argument checks for group_advantages, shared by the CPU kernels and the CUDA bindings.
#pragma once

#include <optional>

#include "rlkernels/advantages.h"
#include "rlkernels/torch_utils.h"

namespace rlk {

inline GroupMode checked_group_mode(c10::string_view mode, bool has_ids) {
  const int code = parse_group_mode(as_std(mode));
  TORCH_CHECK(code >= 0, "rlkernels::group_advantages: unknown mode '", mode,
              "' (expected grpo, dr_grpo, rloo, batch or gpg, with or without the suffix _trl)");
  TORCH_CHECK(has_ids || !is_gpg_mode(GroupMode(code)), "rlkernels::group_advantages: mode gpg takes group_ids");
  return GroupMode(code);
}

// rewards [B]; either group_ids [B] (int32/int64) or a group_size >= 1 that divides B.
inline void check_group_inputs(const at::Tensor& rewards, const std::optional<at::Tensor>& group_ids,
                               int64_t group_size, double eps) {
  constexpr const char* op = "rlkernels::group_advantages";
  to_dtype(rewards);
  TORCH_CHECK(rewards.dim() == 1, op, ": rewards must be 1-D [B], got ", rewards.sizes());
  TORCH_CHECK(eps >= 0, op, ": eps must be >= 0, got ", eps);
  if (group_ids.has_value()) {
    const at::Tensor& ids = *group_ids;
    TORCH_CHECK(ids.sizes() == rewards.sizes(), op, ": group_ids ", ids.sizes(), " and rewards ", rewards.sizes(),
                " must have the same shape");
    TORCH_CHECK(ids.scalar_type() == at::kInt || ids.scalar_type() == at::kLong, op,
                ": group_ids must be int32 or int64, got ", ids.scalar_type());
    TORCH_CHECK(ids.device() == rewards.device(), op, ": group_ids and rewards must be on the same device");
  } else {
    TORCH_CHECK(group_size >= 1, op, ": group_size must be >= 1 when group_ids is not given, got ", group_size);
    TORCH_CHECK(rewards.size(0) % group_size == 0, op, ": group_size ", group_size,
                " does not divide the number of rewards ", rewards.size(0));
  }
}

// group_advantages_sum: scores [B, K] float32/float64, the groups as check_group_inputs', weights [K] of scores'
// dtype or none; a mode without a batch statistic (grpo, dr_grpo, rloo, with or without _trl). Returns it.
inline GroupMode check_group_sum_inputs(const at::Tensor& scores, const std::optional<at::Tensor>& group_ids,
                                       int64_t group_size, const std::optional<at::Tensor>& weights,
                                       c10::string_view mode, double eps) {
  constexpr const char* op = "rlkernels::group_advantages_sum";
  TORCH_CHECK(scores.dim() == 2, op, ": scores must be 2-D [B, K], got ", scores.sizes());
  TORCH_CHECK(scores.scalar_type() == at::kFloat || scores.scalar_type() == at::kDouble, op,
              ": scores must be float32 or float64, got ", scores.scalar_type());
  TORCH_CHECK(scores.size(1) >= 1, op, ": scores need a column, got ", scores.sizes());
  check_group_inputs(scores.select(1, 0), group_ids, group_size, eps);
  if (weights.has_value()) {
    TORCH_CHECK(weights->dim() == 1 && weights->size(0) == scores.size(1), op, ": weights must be [K] with K = ",
                scores.size(1), ", got ", weights->sizes());
    TORCH_CHECK(weights->scalar_type() == scores.scalar_type() && weights->device() == scores.device(), op,
                ": weights must have scores' dtype and device");
  }
  const GroupMode md = checked_group_mode(mode, group_ids.has_value());
  TORCH_CHECK(!is_batch_mode(md) && !is_gpg_mode(md), op, ": mode ", mode,
              " has a batch statistic of each column; expected grpo, dr_grpo or rloo (with or without _trl)");
  return md;
}

// advantage_tokens: adv [B] float, mask [B, T] bool, int64 or adv's dtype, ok [] bool.
inline void check_token_inputs(const at::Tensor& adv, const at::Tensor& mask, const at::Tensor& ok) {
  constexpr const char* op = "rlkernels::advantage_tokens";
  to_dtype(adv);
  TORCH_CHECK(adv.dim() == 1, op, ": adv must be 1-D [B], got ", adv.sizes());
  check_kernel_mask(op, adv, "adv", mask);
  TORCH_CHECK(ok.numel() == 1 && ok.scalar_type() == at::kBool, op, ": ok must be one bool");
  TORCH_CHECK(ok.device() == adv.device(), op, ": adv and ok must be on the same device");
}

}  // namespace rlk
