// KL-penalty estimators (verl `kl_penalty`), per token, as functions of logp and ref_logp.
#pragma once

#include <string_view>

#include "rlkernels/common.h"

namespace rlk {

// A kind is a base estimator (k1, abs, k2, k3) plus, for verl's "<kind>+" names, the straight-through flag
// kKLStraightThrough: the base value with k2's gradient. Codes shared with rlkernels/reference/kl.py
// (KL_BASE_CODES, KL_STRAIGHT_THROUGH, KL_KIND_CODES) and the Triton kernels. k2 with the flag is k2 wherever
// the log-ratio is finite (verl's k2 - k2.detach() + k2.detach() is NaN where it is not).
constexpr int kKLStraightThrough = 4;
enum class KLKind : int {
  K1 = 0,
  Abs = 1,
  K2 = 2,
  K3 = 3,
  K1Plus = K1 | kKLStraightThrough,
  AbsPlus = Abs | kKLStraightThrough,
  K2Plus = K2 | kKLStraightThrough,
  K3Plus = K3 | kKLStraightThrough,
};

RLK_HOST_DEVICE constexpr KLKind kl_base(KLKind kind) { return KLKind(int(kind) & ~kKLStraightThrough); }
RLK_HOST_DEVICE constexpr bool kl_straight_through(KLKind kind) { return (int(kind) & kKLStraightThrough) != 0; }

// Kind name -> kind, or -1 when unknown: a base name ("k1", "abs", "k2", "k3"; the Python API maps aliases
// to these), optionally followed by "+" (as verl 0.9.1 reads any name ending in "+").
inline int parse_kl_kind(std::string_view name) {
  const bool plus = !name.empty() && name.back() == '+';
  if (plus) name.remove_suffix(1);
  int base = -1;
  if (name == "k1") base = int(KLKind::K1);
  if (name == "abs") base = int(KLKind::Abs);
  if (name == "k2") base = int(KLKind::K2);
  if (name == "k3") base = int(KLKind::K3);
  if (base < 0 || !plus) return base;
  return base | kKLStraightThrough;
}

// k3's inner clamp of d = ref - logp keeps exp(d) finite (verl).
template <typename T>
RLK_HOST_DEVICE T k3_log_ratio_bound() {
  return T(20);
}

// Value of the estimator: the base kind's. The straight-through flag changes the gradient, and gives NaN where
// the log-ratio is not finite, as verl's k2 - k2.detach() + value.detach() does. `clamp` bounds k3's output
// (+inf disables it).
template <typename T>
RLK_HOST_DEVICE T kl_value(KLKind kind, T logp, T ref, T clamp) {
  const T diff = logp - ref;
  if (kl_straight_through(kind)) {
    const T zero = diff - diff;  // 0, or NaN for an infinite or NaN log-ratio (no -ffast-math: never folded)
    if (!(zero == T(0))) return zero;
  }
  switch (kl_base(kind)) {
    case KLKind::K1:
      return diff;
    case KLKind::Abs:
      return abs_(diff);
    case KLKind::K2:
      return T(0.5) * diff * diff;
    default: {  // K3
      const T bound = k3_log_ratio_bound<T>();
      const T d = clamp_value(ref - logp, -bound, bound);
      return clamp_value(exp_(d) - d - T(1), -clamp, clamp);
    }
  }
}

// d value / d logp (d / d ref_logp is its negative). With the straight-through flag: the gradient of k2.
template <typename T>
RLK_HOST_DEVICE T kl_grad(KLKind kind, T logp, T ref, T clamp) {
  const T diff = logp - ref;
  if (kl_straight_through(kind)) return diff;
  switch (kl_base(kind)) {
    case KLKind::K1:
      return T(1);
    case KLKind::Abs:
      return sign_(diff);
    case KLKind::K3: {
      const T bound = k3_log_ratio_bound<T>();
      const T raw = ref - logp;
      const T d = clamp_value(raw, -bound, bound);
      const T e = exp_(d);
      const bool passes = clamp_passes(raw, -bound, bound) && clamp_passes(e - d - T(1), -clamp, clamp);
      return passes ? T(1) - e : T(0);
    }
    default:  // K2
      return diff;
  }
}

}  // namespace rlk
