// Host-only helpers for the op implementations (CPU kernels and CUDA bindings): torch checks and types.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>
#include <string_view>

#include "rlkernels/common.h"  // value_or_inf
#include "rlkernels/dtype.h"

namespace rlk {

// The accumulation dtype of a float dtype: double for double, float for the others (rlkernels/_dtypes.py). The
// kernels compute in it, and read a float mask's weights in it.
inline at::ScalarType acc_scalar_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

inline DType to_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DType::Float32;
    case at::kDouble:
      return DType::Float64;
    case at::kHalf:
      return DType::Float16;
    case at::kBFloat16:
      return DType::BFloat16;
    default:
      TORCH_CHECK(false, "rlkernels: unsupported dtype ", t.scalar_type(),
                  " (expected float32, float64, float16 or bfloat16)");
  }
}

// The op-level contract the Python API already enforces; repeated here for direct torch.ops callers.
inline void check_same_layout(const char* op, const at::Tensor& a, const char* a_name, const at::Tensor& b,
                              const char* b_name) {
  TORCH_CHECK(a.sizes() == b.sizes(), op, ": ", a_name, " ", a.sizes(), " and ", b_name, " ", b.sizes(),
              " must have the same shape");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), op, ": ", a_name, " (", a.scalar_type(), ") and ", b_name,
              " (", b.scalar_type(), ") must have the same dtype");
  TORCH_CHECK(a.device() == b.device(), op, ": ", a_name, " and ", b_name, " must be on the same device");
}

}  // namespace rlk

namespace rlk {

// A [B, T] response mask as the token kernels read it (rlkernels/ops/advantages.py kernel_mask): bool, int64
// (0 / 1) or float weights of `like`'s dtype, with B = like.size(0), on like's device (like: the op's `name`).
inline void check_kernel_mask(const char* op, const at::Tensor& like, const char* name, const at::Tensor& mask) {
  TORCH_CHECK(mask.dim() == 2 && mask.size(0) == like.size(0), op, ": mask must be [B, T] with B = ", like.size(0),
              ", got ", mask.sizes());
  const auto dt = mask.scalar_type();
  TORCH_CHECK(dt == at::kBool || dt == at::kLong || dt == acc_scalar_type(like.scalar_type()), op,
              ": mask must be bool, int64 or float weights of ", name, "'s accumulation dtype (",
              acc_scalar_type(like.scalar_type()), "), got ", dt);
  TORCH_CHECK(mask.device() == like.device(), op, ": mask and ", name, " must be on the same device");
}

// Such a mask's kind, as the kernels take it: bool 0, int64 1, float weights 2.
inline int kernel_mask_kind(const at::Tensor& mask) {
  return mask.scalar_type() == at::kBool ? 0 : (mask.scalar_type() == at::kLong ? 1 : 2);
}

inline std::string_view as_std(c10::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace rlk
