// grpo_passk and opo on CUDA tensors: checks, a stable sort of the group ids, the scratch buffers, then the
// torch-free launchers in outcome_estimators.cu (one launch after the sort).
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sort.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "launch_counter.h"
#include "outcome_estimators.h"
#include "rlkernels/outcome_estimators_host.h"

namespace rlk {
namespace {

// A stable sort of the ids: (sorted ids, their original indices int64), equal ids in index order.
std::tuple<at::Tensor, at::Tensor> sort_ids(const at::Tensor& group_ids) {
  return at::sort(group_ids.contiguous(), /*stable=*/true, /*dim=*/0, /*descending=*/false);
}

std::tuple<at::Tensor, at::Tensor> grpo_passk_cuda(const at::Tensor& scores, const at::Tensor& group_ids, double eps,
                                                   bool norm_by_std) {
  constexpr const char* op = "rlkernels::grpo_passk";
  check_outcome_inputs(op, scores, group_ids);
  TORCH_CHECK(eps >= 0, op, ": eps must be >= 0, got ", eps);
  const c10::cuda::CUDAGuard guard(scores.device());
  const at::Tensor s = scores.contiguous();
  const int64_t b = s.numel();
  at::Tensor out = at::empty(s.sizes(), s.options());
  if (b == 0) return {out, at::ones({}, s.options().dtype(at::kBool))};
  const auto [ids, perm] = sort_ids(group_ids);
  at::Tensor head = at::empty({b}, s.options().dtype(at::kLong));
  at::Tensor stats = at::empty({4 * b + 1}, s.options().dtype(at::kDouble));  // outcome_estimators.h
  at::Tensor keys = at::empty({2, b}, s.options().dtype(at::kLong));
  at::Tensor ok = at::empty({}, s.options().dtype(at::kBool));
  const cudaError_t err = cuda::grpo_passk_sorted(
      to_dtype(s), s.const_data_ptr(), ids.const_data_ptr(), ids.scalar_type() == at::kLong,
      perm.const_data_ptr<int64_t>(), head.mutable_data_ptr<int64_t>(), stats.mutable_data_ptr(),
      keys.mutable_data_ptr<int64_t>(), out.mutable_data_ptr(), ok.mutable_data_ptr<bool>(), b, eps, norm_by_std,
      c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
  return {out, ok};
}

std::tuple<at::Tensor, at::Tensor> opo_cuda(const at::Tensor& scores, const at::Tensor& mask,
                                            const at::Tensor& group_ids) {
  constexpr const char* op = "rlkernels::opo";
  check_outcome_inputs(op, scores, group_ids);
  check_kernel_mask(op, scores, "scores", mask);
  const c10::cuda::CUDAGuard guard(scores.device());
  const at::Tensor s = scores.contiguous();
  const at::Tensor m = mask.contiguous();
  const int64_t b = s.numel();
  at::Tensor out = at::empty(s.sizes(), s.options());
  if (b == 0) return {out, at::ones({}, s.options().dtype(at::kBool))};
  const auto [ids, perm] = sort_ids(group_ids);
  at::Tensor head = at::empty({b}, s.options().dtype(at::kLong));
  at::Tensor lengths = at::empty({b}, s.options().dtype(at::kDouble));
  at::Tensor stats = at::empty({3 * b + 1}, s.options().dtype(at::kDouble));  // outcome_estimators.h
  at::Tensor ok = at::empty({}, s.options().dtype(at::kBool));
  const cuda::OpoInputs in{s.const_data_ptr(), m.const_data_ptr(), kernel_mask_kind(m), m.size(1), ids.const_data_ptr(),
                           ids.scalar_type() == at::kLong, perm.const_data_ptr<int64_t>(),
                           head.mutable_data_ptr<int64_t>(), lengths.mutable_data_ptr(), stats.mutable_data_ptr(),
                           out.mutable_data_ptr(), ok.mutable_data_ptr<bool>(), launch_counter(s), b};
  const cudaError_t err = cuda::opo_sorted(to_dtype(s), in, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
  return {out, ok};
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CUDA, m) {
  m.impl("grpo_passk", &grpo_passk_cuda);
  m.impl("opo", &opo_cuda);
}

}  // namespace rlk
