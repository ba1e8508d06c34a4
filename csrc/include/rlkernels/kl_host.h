// Host-side argument parsing for kl_penalty, shared by the CPU kernels and the CUDA bindings.
#pragma once

#include <type_traits>

#include "rlkernels/kl.h"
#include "rlkernels/torch_utils.h"

namespace rlk {

inline KLKind checked_kl_kind(c10::string_view kind) {
  const int code = parse_kl_kind(as_std(kind));
  TORCH_CHECK(code >= 0, "rlkernels: unknown KL kind '", kind,
              "' (expected k1, abs, k2 or k3, each optionally followed by +)");
  return KLKind(code);
}

}  // namespace rlk

namespace rlk {

// Calls f(std::integral_constant<KLKind, kind>{}) so that loops are compiled once per kind (the CPU
// loops then carry no switch and vectorize).
template <typename F>
void dispatch_kl_kind(KLKind kind, F&& f) {
  switch (kind) {
    case KLKind::K1:
      return f(std::integral_constant<KLKind, KLKind::K1>{});
    case KLKind::Abs:
      return f(std::integral_constant<KLKind, KLKind::Abs>{});
    case KLKind::K2:
      return f(std::integral_constant<KLKind, KLKind::K2>{});
    case KLKind::K3:
      return f(std::integral_constant<KLKind, KLKind::K3>{});
    case KLKind::K1Plus:
      return f(std::integral_constant<KLKind, KLKind::K1Plus>{});
    case KLKind::AbsPlus:
      return f(std::integral_constant<KLKind, KLKind::AbsPlus>{});
    case KLKind::K3Plus:
      return f(std::integral_constant<KLKind, KLKind::K3Plus>{});
  }
}

}  // namespace rlk
