// group_advantages on CUDA tensors: checks, the group representatives of arbitrary ids
// (group_representatives.h), the batch std, then the torch-free launchers in advantages.cu.
#include <ATen/ops/empty.h>
#include <ATen/ops/std.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "advantages.h"
#include "group_representatives.h"
#include "rlkernels/advantages_host.h"

namespace rlk {
namespace {

at::Tensor group_advantages_cuda(const at::Tensor& rewards, const std::optional<at::Tensor>& group_ids,
                                 int64_t group_size, c10::string_view mode, double eps) {
  constexpr const char* op = "rlkernels::group_advantages";
  check_group_inputs(rewards, group_ids, group_size, eps);
  const int md = int(checked_group_mode(mode));
  const c10::cuda::CUDAGuard guard(rewards.device());
  const at::Tensor r = rewards.contiguous();
  const int64_t b = r.numel();
  at::Tensor out = at::empty(r.sizes(), r.options());
  if (b == 0) return out;
  const at::ScalarType acc = r.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // Batch std (unbiased) as a device scalar; a batch of one uses 1 (the kernels' default for nullptr).
  at::Tensor bstd;
  if (GroupMode(md) == GroupMode::Batch && b > 1) bstd = r.to(acc).std().reshape({1});
  const void* bstd_ptr = bstd.defined() ? bstd.const_data_ptr() : nullptr;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  cudaError_t err;
  if (!group_ids.has_value()) {
    err = cuda::group_advantages_contiguous(to_dtype(r), r.const_data_ptr(), out.mutable_data_ptr(), bstd_ptr,
                                            b / group_size, group_size, md, eps, stream);
  } else {
    const at::Tensor rep = group_representatives(group_ids->contiguous());
    at::Tensor stats = at::zeros({3, b}, r.options().dtype(at::kDouble));  // advantages.h: doubles
    err = cuda::group_advantages_by_rep(to_dtype(r), r.const_data_ptr(), rep.const_data_ptr<int64_t>(),
                                        stats.mutable_data_ptr(), out.mutable_data_ptr(), bstd_ptr, b, md, eps,
                                        stream);
  }
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CUDA, m) { m.impl("group_advantages", &group_advantages_cuda); }

}  // namespace rlk
