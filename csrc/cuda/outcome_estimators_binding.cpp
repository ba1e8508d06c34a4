// grpo_passk and opo on CUDA tensors: checks, the group representatives (group_representatives.h), the
// statistics buffers, then the torch-free launchers in outcome_estimators.cu.
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <limits>

#include "group_representatives.h"
#include "outcome_estimators.h"
#include "rlkernels/outcome_estimators_host.h"

namespace rlk {
namespace {

at::Tensor grpo_passk_cuda(const at::Tensor& scores, const at::Tensor& group_ids, double eps, bool norm_by_std) {
  constexpr const char* op = "rlkernels::grpo_passk";
  check_outcome_inputs(op, scores, group_ids);
  TORCH_CHECK(eps >= 0, op, ": eps must be >= 0, got ", eps);
  const c10::cuda::CUDAGuard guard(scores.device());
  const at::Tensor s = scores.contiguous();
  const int64_t b = s.numel();
  at::Tensor out = at::empty(s.sizes(), s.options());
  if (b == 0) return out;
  const at::Tensor rep = group_representatives(group_ids.contiguous());
  at::Tensor stats = at::zeros({4, b}, s.options().dtype(at::kDouble));  // outcome_estimators.h: doubles
  at::Tensor keys = at::full({2, b}, std::numeric_limits<int64_t>::min(), s.options().dtype(at::kLong));
  const cudaError_t err = cuda::grpo_passk_by_rep(
      to_dtype(s), s.const_data_ptr(), rep.const_data_ptr<int64_t>(), stats.mutable_data_ptr(),
      keys.mutable_data_ptr<int64_t>(), out.mutable_data_ptr(), b, eps, norm_by_std,
      c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
  return out;
}

at::Tensor opo_cuda(const at::Tensor& scores, const at::Tensor& lengths, const at::Tensor& group_ids) {
  constexpr const char* op = "rlkernels::opo";
  check_outcome_inputs(op, scores, group_ids);
  check_same_layout(op, scores, "scores", lengths, "lengths");
  const c10::cuda::CUDAGuard guard(scores.device());
  const at::Tensor s = scores.contiguous();
  const at::Tensor len = lengths.contiguous();
  const int64_t b = s.numel();
  at::Tensor out = at::empty(s.sizes(), s.options());
  if (b == 0) return out;
  const at::Tensor rep = group_representatives(group_ids.contiguous());
  at::Tensor stats = at::zeros({3, b}, s.options().dtype(at::kDouble));
  const cudaError_t err =
      cuda::opo_by_rep(to_dtype(s), s.const_data_ptr(), len.const_data_ptr(), rep.const_data_ptr<int64_t>(),
                       stats.mutable_data_ptr(), out.mutable_data_ptr(), b, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CUDA, m) {
  m.impl("grpo_passk", &grpo_passk_cuda);
  m.impl("opo", &opo_cuda);
}

}  // namespace rlk
