// policy_loss on CUDA tensors: checks, stream and device guard, output allocations, then the torch-free
// launchers in policy_loss.cu. No ATen op on the hot path (at::empty launches nothing): the forward's one
// launch finishes the loss, its stats, the row weights and the inputs' validity flag, reading a normalizer
// tensor on the device; the backward's one launch scales each row by grad_loss · row_weights[b] itself.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "launch_counter.h"
#include "policy_loss.h"
#include "rlkernels/policy_loss_host.h"
#include "rows_host.h"

namespace rlk {
namespace {

// The inputs as the kernels read them (unit_columns: rows at any stride as they are; kept alive while the
// launch uses their pointers) and their view for the launchers.
struct Prepared {
  at::Tensor logp, old, adv, mask, ref, ent, isw;
  cuda::PolicyLossTensors view;
};

Prepared prepare(const char* op, const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                 const at::Tensor& mask, const std::optional<at::Tensor>& ref_logp,
                 const std::optional<at::Tensor>& entropy, const std::optional<at::Tensor>& is_weights) {
  const MaskType mask_type = check_policy_inputs(op, logp, old_logp, mask, ref_logp, entropy);
  const bool adv_per_token = check_row_or_token(op, advantages, "advantages", logp);
  const bool isw_per_token = is_weights && check_row_or_token(op, *is_weights, "is_weights", logp);
  Prepared p;
  p.logp = unit_columns(logp);
  p.old = unit_columns(old_logp);
  p.adv = unit_columns(advantages);
  p.mask = unit_columns(mask);
  if (ref_logp) p.ref = unit_columns(*ref_logp);
  if (entropy) p.ent = unit_columns(*entropy);
  if (is_weights) p.isw = unit_columns(*is_weights);
  p.view = cuda::PolicyLossTensors{rows_arg(p.logp), rows_arg(p.old), rows_arg(p.adv), rows_arg(p.mask),
                                   rows_arg(p.ref),  rows_arg(p.ent), rows_arg(p.isw), mask_type,
                                   adv_per_token,    isw_per_token,   logp.size(0),    logp.size(1)};
  return p;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> policy_loss_cuda(
    const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages, const at::Tensor& mask,
    const std::optional<at::Tensor>& ref_logp, const std::optional<at::Tensor>& entropy,
    const std::optional<at::Tensor>& is_weights, RLK_POLICY_CONFIG_PARAMS, RLK_AGG_CONFIG_PARAMS, bool save_grad) {
  const char* op = "rlkernels::policy_loss";
  const AggParams agg_params = make_agg_args(op, logp.device(), RLK_AGG_CONFIG_ARGS);
  const PolicyLossConfig cfg = make_policy_config(RLK_POLICY_CONFIG_ARGS);
  const c10::cuda::CUDAGuard guard(logp.device());
  const Prepared p = prepare(op, logp, old_logp, advantages, mask, ref_logp, entropy, is_weights);
  const int64_t B = logp.size(0), T = logp.size(1);
  const auto acc = logp.options().dtype(acc_scalar_type(logp.scalar_type()));
  at::Tensor loss = at::empty({}, acc);
  at::Tensor stats = at::empty({kRowStats - kFirstStat}, acc);
  at::Tensor row_weights = at::empty({B}, acc);
  at::Tensor row_stats = at::empty({B, kRowStats}, acc);
  at::Tensor saved = at::empty({save_grad ? B : 0, save_grad ? T : 0}, acc);
  at::Tensor ok = at::empty({}, logp.options().dtype(at::kBool));
  at::Tensor workspace = at::empty({cuda::policy_loss_workspace(B, T)}, acc);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const cuda::PolicyLossOutputs out{loss.mutable_data_ptr(),      stats.mutable_data_ptr(),
                                    row_weights.mutable_data_ptr(), row_stats.mutable_data_ptr(),
                                    save_grad ? saved.mutable_data_ptr() : nullptr, ok.mutable_data_ptr<bool>()};
  const cudaError_t err =
      cuda::policy_loss_forward(to_dtype(p.logp), p.view, cfg, agg_params, out, workspace.mutable_data_ptr(),
                                launch_counter(logp), stream);
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
  return {loss, stats, row_weights, row_stats, saved, ok};
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
  // The forward's outputs are contiguous (no copy); grad_loss is one element, read at its address.
  const at::Tensor w = row_weights.contiguous(), rs = row_stats.contiguous(), sv = saved_grad.contiguous();
  at::Tensor grad_logp = at::empty({logp_grad ? B : 0, logp_grad ? T : 0}, logp.options());
  at::Tensor grad_ent = at::empty({entropy_grad ? B : 0, entropy_grad ? T : 0}, logp.options());
  const cudaError_t err = cuda::policy_loss_backward(
      to_dtype(p.logp), p.view, cfg, grad_loss.const_data_ptr(), w.const_data_ptr(), rs.const_data_ptr(),
      use_saved ? sv.const_data_ptr() : nullptr, logp_grad ? grad_logp.mutable_data_ptr() : nullptr,
      entropy_grad ? grad_ent.mutable_data_ptr() : nullptr, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
  return {grad_logp, grad_ent};
}

// The eager backward's last read of the forward's saved d S_b / d logp: scales it in place into d output /
// d logp and writes d output / d entropy in the same launch (ops/policy_loss.py _consume_saved).
at::Tensor policy_loss_backward_into_saved_cuda(at::Tensor& saved_grad, const at::Tensor& grad_loss,
                                                const at::Tensor& row_weights, const at::Tensor& mask,
                                                double entropy_coef, bool entropy_grad) {
  const char* op = "rlkernels::policy_loss_backward_into_saved";
  const auto dtype = saved_grad.scalar_type();
  TORCH_CHECK(saved_grad.dim() == 2 && saved_grad.is_contiguous() && (dtype == at::kFloat || dtype == at::kDouble),
              op, ": saved_grad must be a contiguous [B, T] float32 or float64 tensor, got ", saved_grad.sizes(),
              " of ", dtype);
  const c10::cuda::CUDAGuard guard(saved_grad.device());
  const int64_t B = saved_grad.size(0), T = saved_grad.size(1);
  check_loss_grad(op, grad_loss, row_weights, B, dtype, saved_grad.device());
  const MaskType mask_type = check_token_mask(op, mask, saved_grad);
  const at::Tensor w = row_weights.contiguous(), m = unit_columns(mask);
  at::Tensor grad_ent = at::empty({entropy_grad ? B : 0, entropy_grad ? T : 0}, saved_grad.options());
  const cudaError_t err = cuda::policy_loss_backward_into_saved(
      to_dtype(saved_grad), mask_type, B, T, saved_grad.mutable_data_ptr(), rows_arg(m),
      grad_loss.const_data_ptr(), w.const_data_ptr(), entropy_coef,
      entropy_grad ? grad_ent.mutable_data_ptr() : nullptr, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
  return grad_ent;
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CUDA, m) {
  m.impl("policy_loss", &policy_loss_cuda);
  m.impl("policy_loss_backward", &policy_loss_backward_cuda);
  m.impl("policy_loss_backward_into_saved", &policy_loss_backward_into_saved_cuda);
}

}  // namespace rlk
