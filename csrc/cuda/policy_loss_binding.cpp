// policy_loss on CUDA tensors: checks, stream and device guard, workspace, then the torch-free launchers in
// policy_loss.cu.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "policy_loss.h"
#include "rlkernels/policy_loss_host.h"

namespace rlk {
namespace {

// Contiguous copies of the inputs (kept alive while the launch uses their pointers) and their view for the
// launchers.
struct Prepared {
  at::Tensor logp, old, adv, mask, ref, ent, isw;
  cuda::PolicyLossTensors view;
};

Prepared prepare(const char* op, const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                 const at::Tensor& mask, const std::optional<at::Tensor>& ref_logp,
                 const std::optional<at::Tensor>& entropy, const std::optional<at::Tensor>& is_weights) {
  check_policy_inputs(op, logp, old_logp, mask, ref_logp, entropy);
  const bool adv_per_token = check_row_or_token(op, advantages, "advantages", logp);
  const bool isw_per_token = is_weights && check_row_or_token(op, *is_weights, "is_weights", logp);
  Prepared p;
  p.logp = logp.contiguous();
  p.old = old_logp.contiguous();
  p.adv = advantages.contiguous();
  p.mask = mask.contiguous();
  if (ref_logp) p.ref = ref_logp->contiguous();
  if (entropy) p.ent = entropy->contiguous();
  if (is_weights) p.isw = is_weights->contiguous();
  auto ptr = [](const at::Tensor& t) -> const void* { return t.defined() ? t.const_data_ptr() : nullptr; };
  p.view = cuda::PolicyLossTensors{ptr(p.logp),
                                   ptr(p.old),
                                   ptr(p.adv),
                                   ptr(p.mask),
                                   ptr(p.ref),
                                   ptr(p.ent),
                                   ptr(p.isw),
                                   p.mask.scalar_type() == at::kBool,
                                   adv_per_token,
                                   isw_per_token,
                                   logp.size(0),
                                   logp.size(1)};
  return p;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> policy_loss_cuda(
    const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages, const at::Tensor& mask,
    const std::optional<at::Tensor>& ref_logp, const std::optional<at::Tensor>& entropy,
    const std::optional<at::Tensor>& is_weights, RLK_POLICY_CONFIG_PARAMS, RLK_AGG_CONFIG_PARAMS, bool save_grad) {
  const char* op = "rlkernels::policy_loss";
  const AggArgs agg_args = make_agg_args(op, RLK_AGG_CONFIG_ARGS);
  const PolicyLossConfig cfg = make_policy_config(RLK_POLICY_CONFIG_ARGS);
  const c10::cuda::CUDAGuard guard(logp.device());
  const Prepared p = prepare(op, logp, old_logp, advantages, mask, ref_logp, entropy, is_weights);
  const int64_t B = logp.size(0), T = logp.size(1);
  const auto acc = logp.options().dtype(at::toOpMathType(logp.scalar_type()));
  at::Tensor saved = at::empty({save_grad ? B : 0, save_grad ? T : 0}, acc);
  // The kernels write every row; an empty batch (no kernel) has zero sums.
  const bool empty_batch = B == 0 || T == 0;
  at::Tensor row_loss = empty_batch ? at::zeros({B}, acc) : at::empty({B}, acc);
  at::Tensor row_stats = empty_batch ? at::zeros({B, kRowStats}, acc) : at::empty({B, kRowStats}, acc);
  if (!empty_batch) {
    at::Tensor workspace = at::empty({cuda::policy_loss_workspace(B, T)}, acc);
    const cudaError_t err = cuda::policy_loss_forward(
        to_dtype(p.logp), p.view, cfg, row_loss.mutable_data_ptr(), row_stats.mutable_data_ptr(),
        save_grad ? saved.mutable_data_ptr() : nullptr, workspace.mutable_data_ptr(),
        c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
  }
  auto [loss, stats, row_weights] = finish_rows(row_loss, row_stats, kCount, kFirstStat, agg_args);
  // ok: the input values were checked before the op (rlkernels/ops/policy_loss.py check_values).
  return {loss, stats, row_weights, row_stats, saved, at::ones({}, logp.options().dtype(at::kBool))};
}

std::tuple<at::Tensor, at::Tensor> policy_loss_backward_cuda(
    const at::Tensor& grad_loss, const at::Tensor& row_weights, const at::Tensor& row_stats,
    const at::Tensor& saved_grad, const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
    const at::Tensor& mask,
    const std::optional<at::Tensor>& ref_logp, const std::optional<at::Tensor>& entropy,
    const std::optional<at::Tensor>& is_weights, RLK_POLICY_CONFIG_PARAMS, bool logp_grad, bool entropy_grad) {
  const char* op = "rlkernels::policy_loss_backward";
  const PolicyLossConfig cfg = make_policy_config(RLK_POLICY_CONFIG_ARGS);
  const c10::cuda::CUDAGuard guard(logp.device());
  const Prepared p = prepare(op, logp, old_logp, advantages, mask, ref_logp, entropy, is_weights);
  const int64_t B = logp.size(0), T = logp.size(1);
  const bool use_saved = check_policy_backward_state(op, grad_loss, row_weights, row_stats, saved_grad, logp);
  const at::Tensor g = row_grads(grad_loss, row_weights);
  const at::Tensor rs = row_stats.contiguous(), sv = saved_grad.contiguous();
  at::Tensor grad_logp = at::empty({logp_grad ? B : 0, logp_grad ? T : 0}, logp.options());
  at::Tensor grad_ent = at::empty({entropy_grad ? B : 0, entropy_grad ? T : 0}, logp.options());
  const cudaError_t err = cuda::policy_loss_backward(
      to_dtype(p.logp), p.view, cfg, g.const_data_ptr(), rs.const_data_ptr(),
      use_saved ? sv.const_data_ptr() : nullptr, logp_grad ? grad_logp.mutable_data_ptr() : nullptr,
      entropy_grad ? grad_ent.mutable_data_ptr() : nullptr, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
  return {grad_logp, grad_ent};
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CUDA, m) {
  m.impl("policy_loss", &policy_loss_cuda);
  m.impl("policy_loss_backward", &policy_loss_backward_cuda);
}

}  // namespace rlk
