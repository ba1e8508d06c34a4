// Host-side parsing and checks of the rollout_correction_rows op, shared by the CPU kernel and the CUDA
// binding.
#pragma once

#include <ATen/ops/empty.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "rlkernels/rollout_correction.h"
#include "rlkernels/torch_utils.h"

namespace rlk {

constexpr const char* kRolloutOp = "rlkernels::rollout_correction_rows";

// rejection: a REJECTIONS name ("token_k1" ... "seq_max_k3") or None -> (kind 1..3 = k1..k3, RejectionAgg).
inline std::pair<int, int> parse_rejection(const std::optional<c10::string_view>& rejection) {
  if (!rejection.has_value()) return {0, kNoRejection};
  const std::string name(rejection->data(), rejection->size());
  const auto cut = name.rfind('_');
  TORCH_CHECK(cut != std::string::npos, kRolloutOp, ": unknown rejection ", name);
  const std::string agg = name.substr(0, cut), kind = name.substr(cut + 1);
  TORCH_CHECK(kind == "k1" || kind == "k2" || kind == "k3", kRolloutOp, ": unknown rejection ", name);
  TORCH_CHECK(agg == "token" || agg == "seq_sum" || agg == "seq_mean" || agg == "seq_max", kRolloutOp,
              ": unknown rejection ", name);
  const int k = kind[1] - '0';
  return {k, agg == "token" ? kTokenAgg : (agg == "seq_max" ? kMaxAgg : kSumAgg)};
}

// logp_old, logp_rollout [B, T] of one dtype and device, valid [B, T] bool.
inline void check_rollout_inputs(const at::Tensor& logp_old, const at::Tensor& logp_rollout,
                                 const at::Tensor& valid) {
  TORCH_CHECK(logp_old.dim() == 2, kRolloutOp, ": logp_old must be [B, T], got ", logp_old.sizes());
  check_same_layout(kRolloutOp, logp_old, "logp_old", logp_rollout, "logp_rollout");
  TORCH_CHECK(valid.scalar_type() == at::kBool && valid.sizes() == logp_old.sizes(), kRolloutOp,
              ": valid must be a bool tensor of logp_old's shape");
  TORCH_CHECK(valid.device() == logp_old.device(), kRolloutOp, ": valid and logp_old must be on the same device");
}

// The accumulation type of the outputs: fp64 for fp64 log-probs, else fp32.
inline at::ScalarType rollout_acc_type(const at::Tensor& logp_old) {
  return logp_old.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// (w [B, T] or [0], keep [B, T] bool or [0], stats [kNumStats, B]) of the op, uninitialized.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> rollout_outputs(const at::Tensor& logp_old,
                                                                      bool token_weights, int agg) {
  const int64_t B = logp_old.size(0), T = logp_old.size(1);
  const auto opts = logp_old.options().dtype(rollout_acc_type(logp_old));
  const std::vector<int64_t> tokens{B, T}, none{0};
  return {at::empty(token_weights ? tokens : none, opts),
          at::empty(agg == kTokenAgg ? tokens : none, opts.dtype(at::kBool)), at::empty({kNumStats, B}, opts)};
}

}  // namespace rlk
