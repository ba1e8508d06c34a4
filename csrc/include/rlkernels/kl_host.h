// Host-side argument parsing for kl_penalty, shared by the CPU kernels and the CUDA bindings.
#pragma once

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

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

// An upstream gradient expanded from one element (every stride 0, e.g. the gradient of `.sum()`): the kernels
// read that element instead of materializing [n] copies of it.
inline bool is_expanded_scalar(const at::Tensor& grad) {
  if (grad.numel() == 0) return false;
  for (const int64_t s : grad.strides()) {
    if (s != 0) return false;
  }
  return true;
}

// The kl_penalty_backward outputs asked for: [n] like logp, or an empty [0] tensor.
inline at::Tensor kl_grad_output(const at::Tensor& logp, bool wanted) {
  return wanted ? at::empty_like(logp, at::MemoryFormat::Contiguous) : at::empty({0}, logp.options());
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
    case KLKind::K2Plus:
      return f(std::integral_constant<KLKind, KLKind::K2Plus>{});
    case KLKind::K3Plus:
      return f(std::integral_constant<KLKind, KLKind::K3Plus>{});
  }
}

}  // namespace rlk
