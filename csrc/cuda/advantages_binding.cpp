// group_advantages and advantage_tokens on CUDA tensors: checks, the stable sort of arbitrary ids (ATen), then
// the torch-free launchers in advantages.cu: one launch each, which checks the values it reads into a flag
// (no host sync; the Python API asserts it asynchronously).
#include <ATen/ops/empty.h>
#include <ATen/ops/sort.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "advantages.h"
#include "launch_counter.h"
#include "rlkernels/advantages_host.h"

namespace rlk {
namespace {

void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

// The sorted kernels on args (sorted ids, or contiguous groups in index order): past one chunk the chunk path (a
// block per chunk, advantages.cu) with its scratch, else the one-block walk. like: a tensor on the launch's
// device.
void launch_sorted(const char* op, DType dtype, const cuda::SortedArgs& args, const at::Tensor& like,
                   cudaStream_t stream) {
  const int64_t chunks = cuda::sorted_chunks(args.b);
  if (chunks == 0) {
    check_launch(op, cuda::group_advantages_sorted(dtype, args, stream));
    return;
  }
  const at::Tensor scratch = at::empty({cuda::chunked_scratch(chunks)}, like.options().dtype(at::kDouble));
  check_launch(op, cuda::group_advantages_chunked(dtype, args, launch_counter(like), scratch.data_ptr(), stream));
}

std::tuple<at::Tensor, at::Tensor> group_advantages_cuda(const at::Tensor& rewards,
                                                         const std::optional<at::Tensor>& group_ids,
                                                         int64_t group_size, c10::string_view mode, double eps) {
  constexpr const char* op = "rlkernels::group_advantages";
  check_group_inputs(rewards, group_ids, group_size, eps);
  const int md = int(checked_group_mode(mode, group_ids.has_value()));
  const c10::cuda::CUDAGuard guard(rewards.device());
  const at::Tensor r = rewards.contiguous();
  const int64_t b = r.numel();
  at::Tensor out = at::empty(r.sizes(), r.options());
  at::Tensor ok = at::empty({}, r.options().dtype(at::kBool));
  if (b == 0) return {out, ok.fill_(true)};
  const auto f64 = r.options().dtype(at::kDouble);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (!group_ids.has_value()) {
    const int64_t groups = b / group_size;
    const int64_t blocks = (groups + 7) / 8;  // advantages.cu: 8 groups (warps) per block
    const at::Tensor means = at::empty({is_batch_mode(GroupMode(md)) ? groups : 1}, f64);
    const at::Tensor parts = at::empty({blocks > 0 ? blocks : 1, 4}, f64);
    check_launch(op, cuda::group_advantages_contiguous(to_dtype(r), r.const_data_ptr(), out.mutable_data_ptr(),
                                                       means.data_ptr(), parts.data_ptr(), launch_counter(r),
                                                       ok.mutable_data_ptr<bool>(), groups, group_size, md, eps,
                                                       stream));
  } else {
    const auto sorted = at::sort(group_ids->contiguous(), /*stable=*/true, /*dim=*/0, /*descending=*/false);
    const at::Tensor& ids = std::get<0>(sorted);
    const at::Tensor& perm = std::get<1>(sorted);
    const at::Tensor stats = at::empty({4, b}, f64);  // advantages.h: doubles (the last row: heads)
    const cuda::SortedArgs args{r.const_data_ptr(), nullptr, ids.const_data_ptr(), ids.scalar_type() == at::kLong,
                                perm.const_data_ptr<int64_t>(), stats.data_ptr(), out.mutable_data_ptr(),
                                ok.mutable_data_ptr<bool>(), b, 1, 1, md, eps, false};
    launch_sorted(op, to_dtype(r), args, r, stream);
  }
  return {out, ok};
}

// Every column through the sorted kernels (the ids' stable sort first; contiguous groups in index order).
std::tuple<at::Tensor, at::Tensor> group_advantages_sum_cuda(const at::Tensor& scores,
                                                             const std::optional<at::Tensor>& group_ids,
                                                             int64_t group_size,
                                                             const std::optional<at::Tensor>& weights,
                                                             c10::string_view mode, double eps, bool renormalize) {
  constexpr const char* op = "rlkernels::group_advantages_sum";
  const int md = int(check_group_sum_inputs(scores, group_ids, group_size, weights, mode, eps));
  const c10::cuda::CUDAGuard guard(scores.device());
  const at::Tensor s = scores.contiguous();
  const int64_t b = s.size(0);
  at::Tensor out = at::empty({b}, s.options());
  at::Tensor ok = at::empty({}, s.options().dtype(at::kBool));
  if (b == 0) return {out, ok.fill_(true)};
  at::Tensor ids, perm;
  if (group_ids.has_value()) std::tie(ids, perm) = at::sort(group_ids->contiguous(), /*stable=*/true, 0, false);
  const at::Tensor w = weights.has_value() ? weights->contiguous() : at::Tensor();
  const at::Tensor stats = at::empty({4, b}, s.options().dtype(at::kDouble));
  const cuda::SortedArgs args{s.const_data_ptr(),
                              w.defined() ? w.const_data_ptr() : nullptr,
                              ids.defined() ? ids.const_data_ptr() : nullptr,
                              ids.defined() && ids.scalar_type() == at::kLong,
                              perm.defined() ? perm.const_data_ptr<int64_t>() : nullptr,
                              stats.data_ptr(),
                              out.mutable_data_ptr(),
                              ok.mutable_data_ptr<bool>(),
                              b,
                              s.size(1),
                              group_ids.has_value() ? 1 : group_size,
                              md,
                              eps,
                              renormalize};
  launch_sorted(op, to_dtype(s), args, s, c10::cuda::getCurrentCUDAStream());
  return {out, ok};
}

std::tuple<at::Tensor, at::Tensor> advantage_tokens_cuda(const at::Tensor& adv, const at::Tensor& mask,
                                                         const at::Tensor& ok) {
  constexpr const char* op = "rlkernels::advantage_tokens";
  check_token_inputs(adv, mask, ok);
  const c10::cuda::CUDAGuard guard(adv.device());
  const at::Tensor a = adv.contiguous(), m = mask.contiguous();
  at::Tensor tokens = at::empty(m.sizes(), a.options());
  at::Tensor ok_out = at::empty({}, ok.options());
  const int64_t n = m.numel();
  if (n == 0) return {tokens, ok};
  const auto acc = a.options().dtype(acc_scalar_type(a.scalar_type()));
  const at::Tensor parts = at::empty({cuda::advantage_token_blocks(n)}, acc);
  const int kind = kernel_mask_kind(m);
  const cuda::TokenArgs args{a.const_data_ptr(), m.const_data_ptr(), tokens.mutable_data_ptr(), parts.data_ptr(),
                             nullptr, launch_counter(a), ok.const_data_ptr<bool>(), ok_out.mutable_data_ptr<bool>(),
                             n, m.size(1), false};
  check_launch(op, cuda::advantage_tokens(to_dtype(a), kind, args, c10::cuda::getCurrentCUDAStream()));
  return {tokens, ok_out};
}

// The ids' sort, then up to one chunk of responses the walk with the mask rows' moments and the whitening
// statistics in one launch (past it the chunk path: its first scan launch takes the rows, its last writing
// launch the statistics), and the tokens with those statistics.
std::tuple<at::Tensor, at::Tensor> whitened_group_tokens_cuda(const at::Tensor& scores, const at::Tensor& group_ids,
                                                              const std::optional<at::Tensor>& weights,
                                                              c10::string_view mode, double eps,
                                                              const at::Tensor& mask) {
  constexpr const char* op = "rlkernels::whitened_group_tokens";
  const int md = int(check_group_sum_inputs(scores, group_ids, 0, weights, mode, eps));
  check_kernel_mask(op, scores, "scores", mask);
  const c10::cuda::CUDAGuard guard(scores.device());
  const at::Tensor s = scores.contiguous(), m = mask.contiguous();
  const int64_t b = s.size(0), n = m.numel();
  at::Tensor tokens = at::empty(m.sizes(), s.options());
  at::Tensor ok = at::empty({}, s.options().dtype(at::kBool));
  if (b == 0) return {tokens, ok.fill_(true)};
  const auto [ids, perm] = at::sort(group_ids.contiguous(), /*stable=*/true, 0, false);
  const at::Tensor w = weights.has_value() ? weights->contiguous() : at::Tensor();
  const at::Tensor stats = at::empty({4, b}, s.options().dtype(at::kDouble));
  at::Tensor adv = at::empty({b}, s.options());
  const cuda::SortedArgs args{s.const_data_ptr(), w.defined() ? w.const_data_ptr() : nullptr, ids.const_data_ptr(),
                              ids.scalar_type() == at::kLong, perm.const_data_ptr<int64_t>(), stats.data_ptr(),
                              adv.mutable_data_ptr(), ok.mutable_data_ptr<bool>(), b, s.size(1), 1, md, eps, false};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t chunks = cuda::sorted_chunks(b);
  // The accumulation type is the scores' (float32 / float64): the rows' and chunks' moments, the coefficients.
  const at::Tensor rows = at::empty({b, 4}, s.options()), coef = at::empty({2}, s.options());
  const at::Tensor chunk_parts = at::empty({chunks > 0 ? chunks : 1, 4}, s.options());
  const cuda::WhitenRows whiten{m.const_data_ptr(), kernel_mask_kind(m), m.size(1), rows.data_ptr(), coef.data_ptr(),
                                launch_counter(s), chunk_parts.data_ptr()};
  if (chunks == 0) {
    check_launch(op, cuda::group_advantages_whitened(to_dtype(s), args, whiten, stream));
  } else {
    const at::Tensor scratch = at::empty({cuda::chunked_scratch(chunks)}, s.options().dtype(at::kDouble));
    check_launch(op, cuda::group_advantages_chunked(to_dtype(s), args, launch_counter(s), scratch.data_ptr(), stream,
                                                    &whiten));
  }
  if (n == 0) return {tokens, ok};
  const cuda::TokenArgs targs{adv.const_data_ptr(), m.const_data_ptr(), tokens.mutable_data_ptr(), nullptr,
                              coef.data_ptr(), launch_counter(s), ok.const_data_ptr<bool>(),
                              ok.mutable_data_ptr<bool>(), n, m.size(1), true};
  check_launch(op, cuda::advantage_tokens(to_dtype(s), kernel_mask_kind(m), targs, stream));
  return {tokens, ok};
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CUDA, m) {
  m.impl("group_advantages", &group_advantages_cuda);
  m.impl("group_advantages_sum", &group_advantages_sum_cuda);
  m.impl("advantage_tokens", &advantage_tokens_cuda);
  m.impl("whitened_group_tokens", &whitened_group_tokens_cuda);
}

}  // namespace rlk
