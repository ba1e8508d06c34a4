// Host-side argument checks of the grpo_passk and opo ops, shared by the CPU kernels and the CUDA bindings.
#pragma once

#include "rlkernels/torch_utils.h"

namespace rlk {

// scores [B] float32/float64 (the estimators compute in these), group_ids [B] int32/int64 on its device.
inline void check_outcome_inputs(const char* op, const at::Tensor& scores, const at::Tensor& group_ids) {
  TORCH_CHECK(scores.dim() == 1, op, ": scores must be 1-D [B], got ", scores.sizes());
  TORCH_CHECK(scores.scalar_type() == at::kFloat || scores.scalar_type() == at::kDouble, op,
              ": scores must be float32 or float64, got ", scores.scalar_type());
  TORCH_CHECK(group_ids.sizes() == scores.sizes(), op, ": group_ids ", group_ids.sizes(), " and scores ",
              scores.sizes(), " must have the same shape");
  TORCH_CHECK(group_ids.scalar_type() == at::kInt || group_ids.scalar_type() == at::kLong, op,
              ": group_ids must be int32 or int64, got ", group_ids.scalar_type());
  TORCH_CHECK(group_ids.device() == scores.device(), op, ": group_ids and scores must be on the same device");
}

}  // namespace rlk
