// rollout_correction's fused pass on CUDA tensors: checks, the outputs, then the torch-free launcher in
// rollout_correction.cu.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "rlkernels/rollout_correction_host.h"
#include "rollout_correction.h"

namespace rlk {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> rollout_correction_rows_cuda(
    const at::Tensor& logp_old, const at::Tensor& logp_rollout, const at::Tensor& valid, bool token_weights,
    bool mask_mode, double clamp, double clip_min, double clip_max, double low_bound,
    std::optional<c10::string_view> rejection, double rej_low, double rej_high) {
  check_rollout_inputs(logp_old, logp_rollout, valid);
  const auto [kind, agg] = parse_rejection(rejection);
  const c10::cuda::CUDAGuard guard(logp_old.device());
  const int64_t B = logp_old.size(0), T = logp_old.size(1);
  const at::Tensor old = logp_old.contiguous(), roll = logp_rollout.contiguous(), v = valid.contiguous();
  at::Tensor w, keep, stats;
  std::tie(w, keep, stats) = rollout_outputs(logp_old, token_weights, agg);
  if (B == 0) return {w, keep, stats};
  const RolloutBounds<double> bounds = rollout_bounds(clamp, clip_min, clip_max, low_bound, rej_low, rej_high);
  const cudaError_t err = cuda::rollout_correction_rows(
      to_dtype(old), old.const_data_ptr(), roll.const_data_ptr(), v.const_data_ptr<bool>(),
      token_weights ? w.mutable_data_ptr() : nullptr, agg == kTokenAgg ? keep.mutable_data_ptr<bool>() : nullptr,
      stats.mutable_data_ptr(), B, T, token_weights, mask_mode, bounds, kind, agg,
      c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, kRolloutOp, ": CUDA launch failed: ", cudaGetErrorString(err));
  return {w, keep, stats};
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CUDA, m) { m.impl("rollout_correction_rows", &rollout_correction_rows_cuda); }

}  // namespace rlk
