// value_loss on CUDA tensors: checks, stream and device guard, workspace, then the torch-free launchers in
// value_loss.cu.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "rlkernels/policy_loss_host.h"
#include "rlkernels/value_loss.h"
#include "value_loss.h"

namespace rlk {
namespace {

struct Prepared {
  at::Tensor v, old, ret, mask;
  cuda::ValueLossTensors view;
};

Prepared prepare(const char* op, const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                 const at::Tensor& mask) {
  TORCH_CHECK(values.dim() == 2, op, ": values must be [B, T], got ", values.sizes());
  check_same_layout(op, values, "values", old_values, "old_values");
  check_same_layout(op, values, "values", returns, "returns");
  check_token_mask(op, mask, values);
  Prepared p{values.contiguous(), old_values.contiguous(), returns.contiguous(), mask.contiguous(), {}};
  p.view = cuda::ValueLossTensors{p.v.const_data_ptr(),   p.old.const_data_ptr(),
                                  p.ret.const_data_ptr(), p.mask.const_data_ptr(),
                                  p.mask.scalar_type() == at::kBool, values.size(0),
                                  values.size(1)};
  return p;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> value_loss_cuda(
    const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns, const at::Tensor& mask,
    std::optional<double> clip, RLK_AGG_CONFIG_PARAMS) {
  const char* op = "rlkernels::value_loss";
  const AggArgs agg_args = make_agg_args(op, RLK_AGG_CONFIG_ARGS);
  TORCH_CHECK(!clip || *clip > 0, op, ": clip must be > 0");
  const c10::cuda::CUDAGuard guard(values.device());
  const Prepared p = prepare(op, values, old_values, returns, mask);
  const int64_t B = values.size(0), T = values.size(1);
  const auto acc = values.options().dtype(at::toOpMathType(values.scalar_type()));
  // The kernels write every row; an empty batch (no kernel) has zero sums.
  const bool empty_batch = B == 0 || T == 0;
  at::Tensor row_loss = empty_batch ? at::zeros({B}, acc) : at::empty({B}, acc);
  at::Tensor row_stats =
      empty_batch ? at::zeros({B, kValueRowStats}, acc) : at::empty({B, kValueRowStats}, acc);
  if (!empty_batch) {
    at::Tensor workspace = at::empty({cuda::value_loss_workspace(B, T)}, acc);
    const cudaError_t err = cuda::value_loss_forward(to_dtype(p.v), p.view, value_or_inf(clip),
                                                     row_loss.mutable_data_ptr(), row_stats.mutable_data_ptr(),
                                                     workspace.mutable_data_ptr(), c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
  }
  return finish_rows(row_loss, row_stats, kValueCount, kValueClipped, agg_args);
}

at::Tensor value_loss_backward_cuda(const at::Tensor& grad_loss, const at::Tensor& row_weights,
                                    const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                                    const at::Tensor& mask, std::optional<double> clip) {
  const char* op = "rlkernels::value_loss_backward";
  const c10::cuda::CUDAGuard guard(values.device());
  const Prepared p = prepare(op, values, old_values, returns, mask);
  const int64_t B = values.size(0), T = values.size(1);
  check_loss_grad(op, grad_loss, row_weights, B, at::toOpMathType(values.scalar_type()), values.device());
  const at::Tensor g = row_grads(grad_loss, row_weights);
  at::Tensor grad = at::empty({B, T}, values.options());
  const cudaError_t err = cuda::value_loss_backward(to_dtype(p.v), p.view, value_or_inf(clip), g.const_data_ptr(),
                                                    grad.mutable_data_ptr(), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
  return grad;
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CUDA, m) {
  m.impl("value_loss", &value_loss_cuda);
  m.impl("value_loss_backward", &value_loss_backward_cuda);
}

}  // namespace rlk
