// Host-side argument checks for gae / discounted_returns, shared by the CPU kernels and the CUDA bindings.
#pragma once

#include <ATen/TensorOperators.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>

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

// Shapes and dtypes of (rewards, values?, mask, cu_seqlens?); the value checks of cu_seqlens (which
// would need a device sync on CUDA) are the caller's.
inline ScanLayout check_scan_inputs(const char* op, const at::Tensor& rewards, const at::Tensor* values,
                                    const at::Tensor& mask, const std::optional<at::Tensor>& cu_seqlens) {
  if (values != nullptr) check_same_layout(op, rewards, "rewards", *values, "values");
  TORCH_CHECK(mask.sizes() == rewards.sizes(), op, ": mask ", mask.sizes(), " and rewards ", rewards.sizes(),
              " must have the same shape");
  TORCH_CHECK(mask.scalar_type() == at::kBool || mask.scalar_type() == rewards.scalar_type(), op,
              ": mask must be bool or of rewards' dtype (", rewards.scalar_type(), "), got ", mask.scalar_type());
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
  return layout;
}

// Whitening coefficients (mean, 1 / sqrt(var + 1e-8)) [2] of all rows together from each row's moments
// [rows, 3] = (weight, mean, centered sum of squares): Chan's merge, verl's unbiased variance, var = 0 when
// the total weight is <= 1. Tensor ops on the moments' device: no host sync on CUDA.
inline at::Tensor whiten_coefficients(const at::Tensor& moments) {
  const at::Tensor w = moments.select(1, 0), mu = moments.select(1, 1), m2 = moments.select(1, 2);
  const at::Tensor wt = w.sum();
  const at::Tensor one = at::ones_like(wt), zero = at::zeros_like(wt);
  const at::Tensor any = wt > 0, many = wt > 1;
  const at::Tensor mean = at::where(any, (w * mu).sum() / at::where(any, wt, one), zero);
  const at::Tensor m2t = m2.sum() + (w * (mu - mean).square()).sum();
  const at::Tensor var = at::where(many, m2t / at::where(many, wt - 1, one), zero);
  return at::stack({mean, at::rsqrt(var + kWhitenEps)});
}

}  // namespace rlk
