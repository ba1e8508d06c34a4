// Group advantages of outcome rewards (GRPO, Dr.GRPO, RLOO, batch-scaled), per element from its
// group's statistics; shared by the CPU and CUDA kernels. Semantics: rlkernels/reference/advantages.py.
#pragma once

#include <string_view>

#include "rlkernels/common.h"
#include "rlkernels/gae.h"  // sqrt_acc

namespace rlk {

// Codes shared with rlkernels/reference/advantages.py (GROUP_MODE_CODES) and the Triton kernels.
// GPG (gpg_advantages only): Dr.GRPO's centered rewards times α / f_norm, α = B / max(#{r != 0}, 1), a batch
// count; the op's eps carries B / f_norm.
enum class GroupMode : int { GRPO = 0, DrGRPO = 1, RLOO = 2, Batch = 3, GPG = 4 };
// A flag on a mode's code: TRL's rule for a group of one, advantage 0 (verl's keeps the reward, centered on
// 0), for trl_grpo_advantages; its mode names take the suffix "_trl" (ZERO_SINGLES in
// rlkernels/reference/advantages.py).
constexpr int kZeroSingles = 8;

// A mode's code (with the flag), or -1.
inline int parse_group_mode(std::string_view name) {
  int flag = 0;
  constexpr std::string_view kSuffix = "_trl";
  if (name.size() > kSuffix.size() && name.substr(name.size() - kSuffix.size()) == kSuffix) {
    flag = kZeroSingles;
    name.remove_suffix(kSuffix.size());
  }
  if (name == "grpo") return int(GroupMode::GRPO) | flag;
  if (name == "dr_grpo") return int(GroupMode::DrGRPO) | flag;
  if (name == "rloo") return int(GroupMode::RLOO) | flag;
  if (name == "batch") return int(GroupMode::Batch) | flag;
  if (name == "gpg") return int(GroupMode::GPG) | flag;
  return -1;
}

// The mode of a code without its flag, and the flag.
RLK_HOST_DEVICE GroupMode base_mode(GroupMode mode) { return GroupMode(int(mode) & ~kZeroSingles); }
RLK_HOST_DEVICE bool zero_singles(GroupMode mode) { return (int(mode) & kZeroSingles) != 0; }
RLK_HOST_DEVICE bool is_batch_mode(GroupMode mode) { return base_mode(mode) == GroupMode::Batch; }
RLK_HOST_DEVICE bool is_gpg_mode(GroupMode mode) { return base_mode(mode) == GroupMode::GPG; }

// Unbiased std from a count and a centered sum of squares; `one` for a set of one (or none).
template <typename T>
RLK_HOST_DEVICE T unbiased_std(T n, T m2, T one) {
  return n > T(1) ? sqrt_acc(m2 / (n - T(1))) : one;
}

// The batch statistic a mode reads (group_affine's batch_stat): Batch the rewards' unbiased std (from their
// count and centered sum of squares), GPG its scale (B / f_norm, the op's eps) / max(#{r != 0}, 1); 1 else.
template <typename T>
RLK_HOST_DEVICE T batch_statistic(GroupMode mode, double n, double m2, double nonzero, double eps) {
  if (is_batch_mode(mode)) return T(unbiased_std(n, m2, 1.0));
  if (is_gpg_mode(mode)) return T(eps / (nonzero > 1.0 ? nonzero : 1.0));
  return T(1);
}

// x / d, and 0 where d == 0 (a zero std with eps = 0: every centered reward is then 0 too).
template <typename T>
RLK_HOST_DEVICE T scaled(T x, T d) {
  return d > T(0) ? x / d : T(0);
}

// A group's advantages as one affine form of its rewards: adv = scaled(factor * (r - shift), denom).
template <typename T>
struct GroupAffine {
  T shift, factor, denom;
};

// The form of a group of n rewards with mean `mean` and centered sum of squares m2. A group of one has
// mean 0 and std 1 (verl), or advantage 0 with the kZeroSingles flag (TRL); batch_stat (batch_statistic) is
// read by Batch and GPG only. Computed once per group, so the per-reward work is a subtract, a multiply and a
// divide (vectorizable).
template <typename T>
RLK_HOST_DEVICE GroupAffine<T> group_affine(GroupMode mode, T n, T mean, T m2, T eps, T batch_stat) {
  const bool multi = n > T(1);
  const T shift = multi ? mean : T(0);
  if (!multi && zero_singles(mode)) return {T(0), T(0), T(1)};
  switch (base_mode(mode)) {
    case GroupMode::GRPO:
      return {shift, T(1), unbiased_std(n, m2, T(1)) + eps};
    case GroupMode::DrGRPO:
      return {shift, T(1), T(1)};
    case GroupMode::RLOO:
      return {shift, multi ? n / (n - T(1)) : T(1), T(1)};
    case GroupMode::GPG:
      return {shift, batch_stat, T(1)};
    default:  // Batch
      return {shift, T(1), batch_stat + eps};
  }
}

template <typename T>
RLK_HOST_DEVICE T group_apply(const GroupAffine<T>& g, T r) {
  return scaled(g.factor * (r - g.shift), g.denom);
}

// The advantage of reward r in its group (see group_affine).
template <typename T>
RLK_HOST_DEVICE T group_advantage(GroupMode mode, T r, T n, T mean, T m2, T eps, T batch_stat) {
  return group_apply(group_affine(mode, n, mean, m2, eps, batch_stat), r);
}

}  // namespace rlk
