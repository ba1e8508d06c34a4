// Host-side parsing and checks of the rollout_correction op, shared by the CPU kernel and the CUDA binding.
#pragma once

#include <ATen/ops/empty.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "rlkernels/rollout_correction.h"
#include "rlkernels/torch_utils.h"

namespace rlk {

constexpr const char* kRolloutOp = "rlkernels::rollout_correction";

// rejection: a REJECTIONS name ("token_k1" ... "seq_max_k3") or None -> (kind 1..3 = k1..k3, RejectionAgg,
// whether a seq_* statistic is the row's mean).
struct Rejection {
  int kind = 0, agg = kNoRejection;
  bool seq_mean = false;
};

inline Rejection parse_rejection(const std::optional<c10::string_view>& rejection) {
  if (!rejection.has_value()) return {};
  const std::string name(rejection->data(), rejection->size());
  const auto cut = name.rfind('_');
  TORCH_CHECK(cut != std::string::npos, kRolloutOp, ": unknown rejection ", name);
  const std::string agg = name.substr(0, cut), kind = name.substr(cut + 1);
  TORCH_CHECK(kind == "k1" || kind == "k2" || kind == "k3", kRolloutOp, ": unknown rejection ", name);
  TORCH_CHECK(agg == "token" || agg == "seq_sum" || agg == "seq_mean" || agg == "seq_max", kRolloutOp,
              ": unknown rejection ", name);
  return {kind[1] - '0', agg == "token" ? kTokenAgg : (agg == "seq_max" ? kMaxAgg : kSumAgg), agg == "seq_mean"};
}

// logp_old, logp_rollout [B, T] of one dtype and device, unit column stride; mask [B, T] (unit column stride)
// bool, int64 (0 / 1) or float weights of the accumulation type; level 0 / 1 / 2 (RolloutLevel).
inline void check_rollout_inputs(const at::Tensor& logp_old, const at::Tensor& logp_rollout, const at::Tensor& mask,
                                 int64_t level) {
  TORCH_CHECK(logp_old.dim() == 2, kRolloutOp, ": logp_old must be [B, T], got ", logp_old.sizes());
  check_same_layout(kRolloutOp, logp_old, "logp_old", logp_rollout, "logp_rollout");
  TORCH_CHECK(mask.sizes() == logp_old.sizes(), kRolloutOp, ": mask must have logp_old's shape");
  const at::ScalarType m = mask.scalar_type();
  TORCH_CHECK(m == at::kBool || m == at::kLong || m == acc_scalar_type(logp_old.scalar_type()), kRolloutOp,
              ": mask must be bool, int64 or of the accumulation dtype, got ", m);
  TORCH_CHECK(mask.device() == logp_old.device(), kRolloutOp, ": mask and logp_old must be on the same device");
  for (const at::Tensor* t : {&logp_old, &logp_rollout, &mask}) {
    TORCH_CHECK(t->size(1) <= 1 || t->stride(1) == 1, kRolloutOp, ": the inputs' rows must be contiguous");
  }
  TORCH_CHECK(level >= kNoLevel && level <= kSequenceLevel, kRolloutOp, ": level must be 0, 1 or 2, got ", level);
}

// The finishing's options in double (host code): RolloutFinish<double>::to<A>() for a kernel.
inline RolloutFinish<double> rollout_finish(int64_t level, bool mask_mode, double clamp, double clip_min,
                                            double clip_max, double low_bound, const Rejection& rej, double rej_low,
                                            double rej_high, bool batch_normalize, double log_upper,
                                            double log_low) {
  RolloutFinish<double> f;
  f.b = rollout_bounds(clamp, clip_min, clip_max, low_bound, rej_low, rej_high);
  f.log_upper = log_upper;
  f.log_low = log_low;
  f.level = int(level);
  f.agg = rej.agg;
  f.mask_mode = mask_mode;
  f.seq_mean = rej.seq_mean;
  f.batch_normalize = batch_normalize;
  return f;
}

// The op's outputs, uninitialized: weights [B, T] (token level), [B, 1] (sequence level) or [0]; the rejected
// mask [B, T] in the mask's dtype (with a rejection) or [0]; the metrics [kNumMetrics]; ok [] bool.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> rollout_outputs(const at::Tensor& logp_old,
                                                                                  const at::Tensor& mask,
                                                                                  int64_t level, int agg) {
  const int64_t B = logp_old.size(0), T = logp_old.size(1);
  const auto opts = logp_old.options().dtype(acc_scalar_type(logp_old.scalar_type()));
  const std::vector<int64_t> tokens{B, T}, rows{B, 1}, none{0};
  return {at::empty(level == kTokenLevel ? tokens : (level == kSequenceLevel ? rows : none), opts),
          at::empty(agg != kNoRejection ? tokens : none, mask.options()), at::empty({kNumMetrics}, opts),
          at::empty({}, opts.dtype(at::kBool))};
}

}  // namespace rlk
