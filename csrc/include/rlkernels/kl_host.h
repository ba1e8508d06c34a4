// Host-side argument parsing for kl_penalty, shared by the CPU kernels and the CUDA bindings.
#pragma once

#include "rlkernels/kl.h"
#include "rlkernels/torch_utils.h"

namespace rlk {

inline KLKind checked_kl_kind(c10::string_view kind) {
  const int code = parse_kl_kind(as_std(kind));
  TORCH_CHECK(code >= 0, "rlkernels: unknown KL kind '", kind, "' (expected k1, abs, k2, k3, k1+ or k3+)");
  return KLKind(code);
}

}  // namespace rlk
