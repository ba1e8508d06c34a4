// rlkernels::optimal_token_baseline on CUDA tensors: checks, a stable sort of the group ids, the scratch, then
// the torch-free launcher in optimal_token_baseline.cu (two launches after the sort).
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sort.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "optimal_token_baseline.h"
#include "rlkernels/optimal_token_baseline_host.h"

namespace rlk {
namespace {

constexpr const char* kOp = "rlkernels::optimal_token_baseline";

std::tuple<at::Tensor, at::Tensor, at::Tensor> optimal_token_baseline_cuda(
    const at::Tensor& rewards, const at::Tensor& mask, const at::Tensor& group_ids, const at::Tensor& old_logp,
    const at::Tensor& sum_pi_squared, const std::optional<at::Tensor>& rollout_is_weights, bool handle_zero_tail,
    double eps) {
  check_otb_inputs(kOp, rewards, mask, group_ids, old_logp, sum_pi_squared, rollout_is_weights, eps);
  const c10::cuda::CUDAGuard guard(rewards.device());
  const at::Tensor r = rewards.contiguous(), m = mask.contiguous();
  const at::Tensor lp = old_logp.contiguous(), sp = sum_pi_squared.contiguous();
  const at::Tensor rho = rollout_is_weights.has_value() ? rollout_is_weights->contiguous() : at::Tensor();
  at::Tensor adv = at::empty_like(r), returns = at::empty_like(r);
  const int64_t b = r.size(0), t = r.size(1);
  if (b == 0 || t == 0) return {adv, returns, at::ones({}, r.options().dtype(at::kBool))};
  const auto [ids, perm] = at::sort(group_ids.contiguous(), /*stable=*/true, /*dim=*/0, /*descending=*/false);
  at::Tensor row_stats = at::empty({b, cuda::kOtbRowStats}, r.options());
  at::Tensor ok = at::empty({}, r.options().dtype(at::kBool));
  cuda::OtbArgs args{};
  args.dtype = to_dtype(r);
  args.rewards = r.const_data_ptr();
  args.mask = m.const_data_ptr();
  args.mask_kind = m.scalar_type() == at::kBool   ? cuda::OtbMask::Bool
                   : m.scalar_type() == at::kLong ? cuda::OtbMask::Int64
                                                  : cuda::OtbMask::Float;
  args.old_logp = lp.const_data_ptr();
  args.sum_pi_squared = sp.const_data_ptr();
  args.is_weights = rho.defined() ? rho.const_data_ptr() : nullptr;
  args.sorted_ids = ids.const_data_ptr();
  args.ids_int64 = ids.scalar_type() == at::kLong;
  args.perm = perm.const_data_ptr<int64_t>();
  args.row_stats = row_stats.mutable_data_ptr();
  args.advantages = adv.mutable_data_ptr();
  args.returns = returns.mutable_data_ptr();
  args.ok = ok.mutable_data_ptr<bool>();
  args.b = b;
  args.t = t;
  args.zero_tail = handle_zero_tail;
  args.eps = eps;
  const cudaError_t err = cuda::optimal_token_baseline_sorted(args, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, kOp, ": CUDA launch failed: ", cudaGetErrorString(err));
  return {adv, returns, ok};
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CUDA, m) { m.impl("optimal_token_baseline", &optimal_token_baseline_cuda); }

}  // namespace rlk
