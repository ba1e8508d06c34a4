// value_loss on CUDA tensors: checks, stream and device guard, output allocations, then the torch-free
// launchers in value_loss.cu. No ATen op on the hot path (at::empty launches nothing): one forward launch
// finishes the loss, clipfrac, the row weights and the validity flag; one backward launch.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "rlkernels/policy_loss_host.h"
#include "rlkernels/value_loss.h"
#include "launch_counter.h"
#include "rows_host.h"
#include "value_loss.h"

namespace rlk {
namespace {

// The inputs as the kernels read them (unit_columns: rows at any stride as they are; kept alive while the
// launch uses their pointers) and their view for the launchers.
struct Prepared {
  at::Tensor v, old, ret, mask;
  cuda::ValueLossTensors view;
};

Prepared prepare(const char* op, const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                 const at::Tensor& mask) {
  TORCH_CHECK(values.dim() == 2, op, ": values must be [B, T], got ", values.sizes());
  check_same_layout(op, values, "values", old_values, "old_values");
  check_same_layout(op, values, "values", returns, "returns");
  const MaskType mask_type = check_token_mask(op, mask, values);
  Prepared p{unit_columns(values), unit_columns(old_values), unit_columns(returns), unit_columns(mask), {}};
  p.view = cuda::ValueLossTensors{rows_arg(p.v), rows_arg(p.old), rows_arg(p.ret), rows_arg(p.mask),
                                  mask_type,     values.size(0),  values.size(1)};
  return p;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> value_loss_cuda(
    const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns, const at::Tensor& mask,
    std::optional<double> clip, RLK_AGG_CONFIG_PARAMS) {
  const char* op = "rlkernels::value_loss";
  const AggParams agg_params = make_agg_args(op, values.device(), RLK_AGG_CONFIG_ARGS);
  TORCH_CHECK(!clip || *clip > 0, op, ": clip must be > 0");
  const c10::cuda::CUDAGuard guard(values.device());
  const Prepared p = prepare(op, values, old_values, returns, mask);
  const int64_t B = values.size(0), T = values.size(1);
  const auto acc = values.options().dtype(acc_scalar_type(values.scalar_type()));
  at::Tensor loss = at::empty({}, acc);
  at::Tensor clipfrac = at::empty({1}, acc);
  at::Tensor row_weights = at::empty({B}, acc);
  at::Tensor ok = at::empty({}, values.options().dtype(at::kBool));
  at::Tensor workspace = at::empty({cuda::value_loss_workspace(B, T)}, acc);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const cuda::ValueLossOutputs out{loss.mutable_data_ptr(), clipfrac.mutable_data_ptr(),
                                   row_weights.mutable_data_ptr(), ok.mutable_data_ptr<bool>()};
  const cudaError_t err =
      cuda::value_loss_forward(to_dtype(p.v), p.view, value_or_inf(clip), agg_params, out,
                               workspace.mutable_data_ptr(), launch_counter(values),
                               stream);
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
  return {loss, clipfrac, row_weights, ok};
}

at::Tensor value_loss_backward_cuda(const at::Tensor& grad_loss, const at::Tensor& row_weights,
                                    const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                                    const at::Tensor& mask, std::optional<double> clip) {
  const char* op = "rlkernels::value_loss_backward";
  const c10::cuda::CUDAGuard guard(values.device());
  const Prepared p = prepare(op, values, old_values, returns, mask);
  const int64_t B = values.size(0), T = values.size(1);
  check_loss_grad(op, grad_loss, row_weights, B, acc_scalar_type(values.scalar_type()), values.device());
  const at::Tensor w = row_weights.contiguous();  // the forward's output: no copy
  at::Tensor grad = at::empty({B, T}, values.options());
  const cudaError_t err =
      cuda::value_loss_backward(to_dtype(p.v), p.view, value_or_inf(clip), grad_loss.const_data_ptr(),
                                w.const_data_ptr(), grad.mutable_data_ptr(), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
  return grad;
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CUDA, m) {
  m.impl("value_loss", &value_loss_cuda);
  m.impl("value_loss_backward", &value_loss_backward_cuda);
}

}  // namespace rlk
