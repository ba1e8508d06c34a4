// gae / discounted_returns on CUDA tensors: checks, stream and device guard, then the torch-free
// launchers in gae.cu. The values of cu_seqlens are not checked here (that would sync with the host): the
// Python API asserts them asynchronously and the kernel clamps every row to the tensor.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "gae.h"
#include "rlkernels/gae_host.h"

namespace rlk {
namespace {

at::ScalarType acc_type(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

cuda::ScanRows scan_rows(const ScanLayout& layout, const at::Tensor& cu, int64_t numel) {
  return {cu.defined() ? cu.const_data_ptr() : nullptr, cu.defined() && cu.scalar_type() == at::kLong, layout.rows,
          layout.row_len, numel};
}

void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

std::tuple<at::Tensor, at::Tensor> gae_cuda(const at::Tensor& rewards, const at::Tensor& values,
                                            const at::Tensor& mask, const std::optional<at::Tensor>& cu_seqlens,
                                            double gamma, double lam, bool whiten) {
  constexpr const char* op = "rlkernels::gae";
  const ScanLayout layout = check_scan_inputs(op, rewards, &values, mask, cu_seqlens);
  const c10::cuda::CUDAGuard guard(rewards.device());
  const at::Tensor r = rewards.contiguous(), v = values.contiguous(), m = mask.contiguous();
  const at::Tensor cu = cu_seqlens.has_value() ? cu_seqlens->contiguous() : at::Tensor();
  at::Tensor adv = at::empty(r.sizes(), r.options()), ret = at::empty(r.sizes(), r.options());
  at::Tensor moments = whiten ? at::empty({layout.rows, 3}, r.options().dtype(acc_type(r))) : at::Tensor();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  check_launch(op, cuda::scan_forward(to_dtype(r), m.scalar_type() == at::kBool, int(ScanKind::GAE),
                                      scan_rows(layout, cu, r.numel()), r.const_data_ptr(), v.const_data_ptr(),
                                      m.const_data_ptr(), adv.mutable_data_ptr(), ret.mutable_data_ptr(),
                                      whiten ? moments.mutable_data_ptr() : nullptr, gamma, gamma * lam, stream));
  if (whiten) {
    const at::Tensor coef = whiten_coefficients(moments);
    check_launch(op, cuda::whiten_apply(to_dtype(adv), adv.mutable_data_ptr(), coef.const_data_ptr(), adv.numel(),
                                        stream));
  }
  return {adv, ret};
}

at::Tensor discounted_returns_cuda(const at::Tensor& rewards, const at::Tensor& mask,
                                   const std::optional<at::Tensor>& cu_seqlens, double gamma) {
  constexpr const char* op = "rlkernels::discounted_returns";
  const ScanLayout layout = check_scan_inputs(op, rewards, nullptr, mask, cu_seqlens);
  const c10::cuda::CUDAGuard guard(rewards.device());
  const at::Tensor r = rewards.contiguous(), m = mask.contiguous();
  const at::Tensor cu = cu_seqlens.has_value() ? cu_seqlens->contiguous() : at::Tensor();
  at::Tensor out = at::empty(r.sizes(), r.options());
  // Returns read no values and write no second output: rewards / out stand in for them.
  check_launch(op, cuda::scan_forward(to_dtype(r), m.scalar_type() == at::kBool, int(ScanKind::Returns),
                                      scan_rows(layout, cu, r.numel()), r.const_data_ptr(), r.const_data_ptr(),
                                      m.const_data_ptr(), out.mutable_data_ptr(), out.mutable_data_ptr(), nullptr,
                                      gamma, 0.0, c10::cuda::getCurrentCUDAStream()));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CUDA, m) {
  m.impl("gae", &gae_cuda);
  m.impl("discounted_returns", &discounted_returns_cuda);
}

}  // namespace rlk
