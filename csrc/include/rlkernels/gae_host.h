// Host-side argument checks for gae / discounted_returns, shared by the CPU kernels and the CUDA bindings.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "rlkernels/gae.h"
#include "rlkernels/torch_utils.h"

namespace rlk {

// The layout of a scan op's inputs: `rows` sequences, row i covering [offsets[i], offsets[i+1]) of the
// flattened inputs (packed: offsets = cu_seqlens), or [i*T, (i+1)*T) (padded [B, T]: no offsets).
struct ScanLayout {
  int64_t rows = 0;
  int64_t row_len = 0;  // T for the padded layout, 0 for packed
  bool packed = false;
};

// The mask dtypes the scans read: bool, float weights of rewards' accumulation dtype (which the scans compute
// in: fp32 for 16-bit rewards), or int64 (0 / 1, a Hugging Face attention_mask: its values are checked by the
// kernels).
inline bool scan_mask_dtype_ok(const at::Tensor& mask, const at::Tensor& rewards) {
  const at::ScalarType t = mask.scalar_type();
  return t == at::kBool || t == at::kLong || t == acc_scalar_type(rewards.scalar_type());
}

// Shapes and dtypes of (rewards, values?, mask, cu_seqlens?, baseline?); the values (of cu_seqlens too, which
// would need a device sync on CUDA) are checked by the kernels, which return a validity flag.
inline ScanLayout check_scan_inputs(const char* op, const at::Tensor& rewards, const at::Tensor* values,
                                    const at::Tensor& mask, const std::optional<at::Tensor>& cu_seqlens,
                                    const std::optional<at::Tensor>& baseline = std::nullopt) {
  if (values != nullptr) check_same_layout(op, rewards, "rewards", *values, "values");
  TORCH_CHECK(mask.sizes() == rewards.sizes(), op, ": mask ", mask.sizes(), " and rewards ", rewards.sizes(),
              " must have the same shape");
  TORCH_CHECK(scan_mask_dtype_ok(mask, rewards), op,
              ": mask must be bool, int64 or float weights of rewards' accumulation dtype (",
              acc_scalar_type(rewards.scalar_type()), "), got ", mask.scalar_type());
  TORCH_CHECK(mask.device() == rewards.device(), op, ": mask and rewards must be on the same device");
  to_dtype(rewards);  // a supported float dtype
  ScanLayout layout;
  if (cu_seqlens.has_value()) {
    const at::Tensor& cu = *cu_seqlens;
    TORCH_CHECK(rewards.dim() == 1, op, ": packed inputs (with cu_seqlens) must be 1-D, got ", rewards.sizes());
    TORCH_CHECK(cu.dim() == 1 && cu.numel() >= 1, op, ": cu_seqlens must be 1-D with at least one entry, got ",
                cu.sizes());
    TORCH_CHECK(cu.scalar_type() == at::kInt || cu.scalar_type() == at::kLong, op,
                ": cu_seqlens must be int32 or int64, got ", cu.scalar_type());
    TORCH_CHECK(cu.device() == rewards.device(), op, ": cu_seqlens and rewards must be on the same device");
    layout.rows = cu.numel() - 1;
    layout.packed = true;
  } else {
    TORCH_CHECK(rewards.dim() == 2, op, ": padded inputs must be 2-D [B, T], got ", rewards.sizes());
    layout.rows = rewards.size(0);
    layout.row_len = rewards.size(1);
  }
  if (baseline.has_value()) {
    TORCH_CHECK(baseline->dim() == 1 && baseline->size(0) == layout.rows, op, ": baseline must be [", layout.rows,
                "] (one per row), got ", baseline->sizes());
    TORCH_CHECK(baseline->scalar_type() == rewards.scalar_type(), op, ": baseline must have rewards' dtype");
    TORCH_CHECK(baseline->device() == rewards.device(), op, ": baseline and rewards must be on the same device");
  }
  return layout;
}

}  // namespace rlk
