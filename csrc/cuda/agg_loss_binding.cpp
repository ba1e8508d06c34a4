// agg_loss on CUDA tensors: checks, stream and device guard, output allocations, then the torch-free launchers
// in agg_loss.cu. No ATen op on the hot path (at::empty launches nothing): one forward launch finishes the loss,
// the row weights and the validity flag; one backward launch.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "rlkernels/policy_loss_host.h"
#include "agg_loss.h"
#include "launch_counter.h"
#include "rows_host.h"

namespace rlk {
namespace {

// The inputs as the kernels read them (unit_columns: rows at any stride as they are; kept alive while the
// launch uses their pointers) and their view for the launchers.
struct Prepared {
  at::Tensor loss, mask;
  cuda::AggLossTensors view;
};

Prepared prepare(const char* op, const at::Tensor& loss_mat, const at::Tensor& mask) {
  TORCH_CHECK(loss_mat.dim() == 2, op, ": loss_mat must be [B, T], got ", loss_mat.sizes());
  const MaskType mask_type = check_token_mask(op, mask, loss_mat);
  Prepared p{unit_columns(loss_mat), unit_columns(mask), {}};
  p.view = cuda::AggLossTensors{rows_arg(p.loss), rows_arg(p.mask), mask_type, loss_mat.size(0), loss_mat.size(1)};
  return p;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> agg_loss_cuda(const at::Tensor& loss_mat, const at::Tensor& mask,
                                                             RLK_AGG_CONFIG_PARAMS) {
  const char* op = "rlkernels::agg_loss";
  const AggParams agg_params = make_agg_args(op, loss_mat.device(), RLK_AGG_CONFIG_ARGS);
  const c10::cuda::CUDAGuard guard(loss_mat.device());
  const Prepared p = prepare(op, loss_mat, mask);
  const int64_t B = loss_mat.size(0), T = loss_mat.size(1);
  const auto acc = loss_mat.options().dtype(acc_scalar_type(loss_mat.scalar_type()));
  at::Tensor loss = at::empty({}, acc);
  at::Tensor row_weights = at::empty({B}, acc);
  at::Tensor ok = at::empty({}, loss_mat.options().dtype(at::kBool));
  at::Tensor workspace = at::empty({cuda::agg_loss_workspace(B, T)}, acc);
  const cuda::AggLossOutputs out{loss.mutable_data_ptr(), row_weights.mutable_data_ptr(), ok.mutable_data_ptr<bool>()};
  const cudaError_t err =
      cuda::agg_loss_forward(to_dtype(p.loss), p.view, agg_params, out, workspace.mutable_data_ptr(),
                             launch_counter(loss_mat), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
  return {loss, row_weights, ok};
}

at::Tensor agg_loss_backward_cuda(const at::Tensor& grad_loss, const at::Tensor& row_weights,
                                  const at::Tensor& loss_mat, const at::Tensor& mask) {
  const char* op = "rlkernels::agg_loss_backward";
  const c10::cuda::CUDAGuard guard(loss_mat.device());
  const Prepared p = prepare(op, loss_mat, mask);
  const int64_t B = loss_mat.size(0), T = loss_mat.size(1);
  check_loss_grad(op, grad_loss, row_weights, B, acc_scalar_type(loss_mat.scalar_type()), loss_mat.device());
  const at::Tensor w = row_weights.contiguous();  // the forward's output: no copy
  at::Tensor grad = at::empty({B, T}, loss_mat.options());
  const cudaError_t err = cuda::agg_loss_backward(to_dtype(p.loss), p.view, grad_loss.const_data_ptr(),
                                                  w.const_data_ptr(), grad.mutable_data_ptr(),
                                                  c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
  return grad;
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CUDA, m) {
  m.impl("agg_loss", &agg_loss_cuda);
  m.impl("agg_loss_backward", &agg_loss_backward_cuda);
}

}  // namespace rlk
