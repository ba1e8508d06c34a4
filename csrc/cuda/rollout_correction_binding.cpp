// rollout_correction on CUDA tensors: checks, the outputs, then the torch-free launcher in rollout_correction.cu
// (one launch, +1 where the tokens need the batch's answer; the mask's values checked into a flag: no host sync).
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "launch_counter.h"
#include "rlkernels/rollout_correction_host.h"
#include "rollout_correction.h"

namespace rlk {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> rollout_correction_cuda(
    const at::Tensor& logp_old, const at::Tensor& logp_rollout, const at::Tensor& mask, int64_t level,
    bool mask_mode, double clamp, double clip_min, double clip_max, double low_bound,
    std::optional<c10::string_view> rejection, double rej_low, double rej_high, bool batch_normalize,
    double log_upper, double log_low) {
  check_rollout_inputs(logp_old, logp_rollout, mask, level);
  const Rejection rej = parse_rejection(rejection);
  const c10::cuda::CUDAGuard guard(logp_old.device());
  const int64_t B = logp_old.size(0), T = logp_old.size(1);
  auto [w, out_mask, metrics, ok] = rollout_outputs(logp_old, mask, level, rej.agg);
  const auto acc = logp_old.options().dtype(acc_scalar_type(logp_old.scalar_type()));
  const at::Tensor parts = at::empty({B > 0 ? B : 1, kNumStats + 1}, acc);
  const bool seq_rejection = rej.agg == kSumAgg || rej.agg == kMaxAgg;
  const at::Tensor keep_row = at::empty({seq_rejection ? B : 0}, logp_old.options().dtype(at::kByte));
  const int mask_kind = kernel_mask_kind(mask);
  const cuda::RolloutArgs args{logp_old.const_data_ptr(),
                               logp_old.stride(0),
                               logp_rollout.const_data_ptr(),
                               logp_rollout.stride(0),
                               mask.const_data_ptr(),
                               mask.stride(0),
                               w.numel() > 0 ? w.mutable_data_ptr() : nullptr,
                               out_mask.numel() > 0 ? out_mask.mutable_data_ptr() : nullptr,
                               seq_rejection ? keep_row.mutable_data_ptr<uint8_t>() : nullptr,
                               parts.mutable_data_ptr(),
                               launch_counter(logp_old),
                               metrics.mutable_data_ptr(),
                               ok.mutable_data_ptr<bool>(),
                               B,
                               T,
                               rollout_finish(level, mask_mode, clamp, clip_min, clip_max, low_bound, rej, rej_low,
                                              rej_high, batch_normalize, log_upper, log_low),
                               rej.kind};
  const cudaError_t err =
      cuda::rollout_correction(to_dtype(logp_old), mask_kind, args, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, kRolloutOp, ": CUDA launch failed: ", cudaGetErrorString(err));
  return {w, out_mask, metrics, ok};
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CUDA, m) { m.impl("rollout_correction", &rollout_correction_cuda); }

}  // namespace rlk
