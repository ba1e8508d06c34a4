// KL-penalty estimators (verl `kl_penalty`), per token, as functions of logp and ref_logp.
#pragma once

#include <string_view>

#include "rlkernels/common.h"

namespace rlk {

// Codes shared with rlkernels/reference/kl.py (KL_KIND_CODES) and the Triton kernels.
enum class KLKind : int { K1 = 0, Abs = 1, K2 = 2, K3 = 3, K1Plus = 4, K3Plus = 5 };

// Canonical kind name -> kind, or -1 when unknown (the Python API maps aliases to these names).
inline int parse_kl_kind(std::string_view name) {
  if (name == "k1") return int(KLKind::K1);
  if (name == "abs") return int(KLKind::Abs);
  if (name == "k2") return int(KLKind::K2);
  if (name == "k3") return int(KLKind::K3);
  if (name == "k1+") return int(KLKind::K1Plus);
  if (name == "k3+") return int(KLKind::K3Plus);
  return -1;
}

// k3's inner clamp of d = ref - logp keeps exp(d) finite (verl).
template <typename T>
RLK_HOST_DEVICE T k3_log_ratio_bound() {
  return T(20);
}

// Value of the estimator. `clamp` bounds k3's output (+inf disables it). "+" kinds: the base value.
template <typename T>
RLK_HOST_DEVICE T kl_value(KLKind kind, T logp, T ref, T clamp) {
  const T diff = logp - ref;
  switch (kind) {
    case KLKind::K1:
    case KLKind::K1Plus:
      return diff;
    case KLKind::Abs:
      return abs_(diff);
    case KLKind::K2:
      return T(0.5) * diff * diff;
    default: {  // K3, K3Plus
      const T bound = k3_log_ratio_bound<T>();
      const T d = clamp_value(ref - logp, -bound, bound);
      return clamp_value(exp_(d) - d - T(1), -clamp, clamp);
    }
  }
}

// d value / d logp (d / d ref_logp is its negative). "+" kinds: the gradient of k2 (straight-through).
template <typename T>
RLK_HOST_DEVICE T kl_grad(KLKind kind, T logp, T ref, T clamp) {
  const T diff = logp - ref;
  switch (kind) {
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
    default:  // K2, K1Plus, K3Plus
      return diff;
  }
}

}  // namespace rlk
