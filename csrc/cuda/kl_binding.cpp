// kl_penalty on CUDA tensors: checks, stream and device guard, then the torch-free launchers in kl.cu.
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "kl.h"
#include "rlkernels/kl_host.h"

namespace rlk {
namespace {

at::Tensor kl_penalty_cuda(const at::Tensor& logp, const at::Tensor& ref_logp, c10::string_view kind,
                           std::optional<double> clamp) {
  check_same_layout("rlkernels::kl_penalty", logp, "logp", ref_logp, "ref_logp");
  const int k = int(checked_kl_kind(kind));
  const c10::cuda::CUDAGuard guard(logp.device());
  const at::Tensor lp = logp.contiguous(), ref = ref_logp.contiguous();
  at::Tensor out = at::empty_like(lp);
  const cudaError_t err = cuda::kl_penalty_forward(to_dtype(lp), lp.const_data_ptr(), ref.const_data_ptr(),
                                                   out.mutable_data_ptr(), lp.numel(), k, value_or_inf(clamp),
                                                   c10::cuda::getCurrentCUDAStream());
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
  const at::Tensor g = scalar ? grad : grad.contiguous(), lp = logp.contiguous(), ref = ref_logp.contiguous();
  at::Tensor d_logp = kl_grad_output(lp, logp_grad), d_ref = kl_grad_output(lp, ref_grad);
  if (!logp_grad && !ref_grad) return {d_logp, d_ref};
  const cudaError_t err = cuda::kl_penalty_backward(
      to_dtype(lp), g.const_data_ptr(), scalar ? 0 : 1, lp.const_data_ptr(), ref.const_data_ptr(),
      logp_grad ? d_logp.mutable_data_ptr() : nullptr, ref_grad ? d_ref.mutable_data_ptr() : nullptr, lp.numel(), k,
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
