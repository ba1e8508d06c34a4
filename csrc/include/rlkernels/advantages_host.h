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

// advantage_tokens: adv [B] float, mask [B, T] bool, int64 or adv's dtype, ok [] bool.
inline void check_token_inputs(const at::Tensor& adv, const at::Tensor& mask, const at::Tensor& ok) {
  constexpr const char* op = "rlkernels::advantage_tokens";
  to_dtype(adv);
  TORCH_CHECK(adv.dim() == 1, op, ": adv must be 1-D [B], got ", adv.sizes());
  TORCH_CHECK(mask.dim() == 2 && mask.size(0) == adv.size(0), op, ": mask must be [B, T] with B = ", adv.size(0),
              ", got ", mask.sizes());
  TORCH_CHECK(mask.scalar_type() == at::kBool || mask.scalar_type() == at::kLong ||
                  mask.scalar_type() == adv.scalar_type(),
              op, ": mask must be bool, int64 or of adv's dtype, got ", mask.scalar_type());
  TORCH_CHECK(ok.numel() == 1 && ok.scalar_type() == at::kBool, op, ": ok must be one bool");
  TORCH_CHECK(mask.device() == adv.device() && ok.device() == adv.device(), op,
              ": adv, mask and ok must be on the same device");
}

}  // namespace rlk
