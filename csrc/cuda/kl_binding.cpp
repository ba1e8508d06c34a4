// kl_penalty on CUDA tensors: checks, stream and device guard, then the torch-free launchers in kl.cu.
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "kl.h"
#include "rlkernels/kl_host.h"
#include "rows_host.h"

namespace rlk {
namespace {

// logp and ref_logp as the kernels read them: [B, T] whose rows lie at any stride (verl's log-probs sliced out of
// the padded sequence: unit_columns) as B rows at their row strides; a contiguous pair, or any other layout
// made contiguous, as one flat row of all its elements.
struct KlRows {
  at::Tensor lp, ref;
  int64_t rows, n;
  cuda::RowsArg lp_rows() const { return rows_arg(lp); }
  cuda::RowsArg ref_rows() const { return rows_arg(ref); }
};

KlRows kl_rows(const at::Tensor& logp, const at::Tensor& ref_logp) {
  if (logp.dim() == 2 && !(logp.is_contiguous() && ref_logp.is_contiguous())) {
    return KlRows{unit_columns(logp), unit_columns(ref_logp), logp.size(0), logp.size(1)};
  }
  return KlRows{logp.contiguous(), ref_logp.contiguous(), 1, logp.numel()};  // a flat row: its stride unread
}

at::Tensor kl_penalty_cuda(const at::Tensor& logp, const at::Tensor& ref_logp, c10::string_view kind,
                           std::optional<double> clamp) {
  check_same_layout("rlkernels::kl_penalty", logp, "logp", ref_logp, "ref_logp");
  const int k = int(checked_kl_kind(kind));
  const c10::cuda::CUDAGuard guard(logp.device());
  const KlRows x = kl_rows(logp, ref_logp);
  at::Tensor out = at::empty_like(logp, at::MemoryFormat::Contiguous);
  const cudaError_t err =
      cuda::kl_penalty_forward(to_dtype(logp), x.lp_rows(), x.ref_rows(), out.mutable_data_ptr(), x.rows, x.n, k,
                               value_or_inf(clamp), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "rlkernels::kl_penalty: CUDA launch failed: ", cudaGetErrorString(err));
  return out;
}

std::tuple<at::Tensor, at::Tensor> kl_penalty_backward_cuda(const at::Tensor& grad, const at::Tensor& logp,
                                                            const at::Tensor& ref_logp, c10::string_view kind,
                                                            std::optional<double> clamp, bool logp_grad,
                                                            bool ref_grad) {
  check_same_layout("rlkernels::kl_penalty_backward", logp, "logp", ref_logp, "ref_logp");
  check_same_layout("rlkernels::kl_penalty_backward", grad, "grad", logp, "logp");
  const int k = int(checked_kl_kind(kind));
  const c10::cuda::CUDAGuard guard(logp.device());
  const bool scalar = is_expanded_scalar(grad);  // the gradient of .sum(): read one element, no copy
  const at::Tensor g = scalar ? grad : grad.contiguous();
  at::Tensor d_logp = kl_grad_output(logp, logp_grad), d_ref = kl_grad_output(logp, ref_grad);
  if (!logp_grad && !ref_grad) return {d_logp, d_ref};
  const KlRows x = kl_rows(logp, ref_logp);
  const cudaError_t err = cuda::kl_penalty_backward(
      to_dtype(logp), g.const_data_ptr(), scalar ? 0 : 1, x.lp_rows(), x.ref_rows(),
      logp_grad ? d_logp.mutable_data_ptr() : nullptr, ref_grad ? d_ref.mutable_data_ptr() : nullptr, x.rows, x.n, k,
      value_or_inf(clamp), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "rlkernels::kl_penalty_backward: CUDA launch failed: ",
              cudaGetErrorString(err));
  return {d_logp, d_ref};
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CUDA, m) {
  m.impl("kl_penalty", &kl_penalty_cuda);
  m.impl("kl_penalty_backward", &kl_penalty_backward_cuda);
}

}  // namespace rlk
