// kl_penalty on CPU: one elementwise pass, parallel over chunks of tokens.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "rlkernels/kl_host.h"

namespace rlk {
namespace {

// Tokens per parallel task: 64 KiB of fp32 per input, enough to amortize the thread-pool hand-off.
constexpr int64_t kGrain = 16384;

at::Tensor kl_penalty_cpu(const at::Tensor& logp, const at::Tensor& ref_logp, c10::string_view kind,
                          std::optional<double> clamp) {
  check_same_layout("rlkernels::kl_penalty", logp, "logp", ref_logp, "ref_logp");
  const KLKind k = checked_kl_kind(kind);
  const at::Tensor lp = logp.contiguous(), ref = ref_logp.contiguous();
  at::Tensor out = at::empty_like(lp);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, lp.scalar_type(), "kl_penalty_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* a = lp.const_data_ptr<scalar_t>();
    const scalar_t* b = ref.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    const acc_t c = value_or_inf<acc_t>(clamp);
    at::parallel_for(0, lp.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        o[i] = scalar_t(kl_value<acc_t>(k, acc_t(a[i]), acc_t(b[i]), c));
      }
    });
  });
  return out;
}

at::Tensor kl_penalty_backward_cpu(const at::Tensor& grad, const at::Tensor& logp, const at::Tensor& ref_logp,
                                   c10::string_view kind, std::optional<double> clamp) {
  check_same_layout("rlkernels::kl_penalty_backward", logp, "logp", ref_logp, "ref_logp");
  check_same_layout("rlkernels::kl_penalty_backward", grad, "grad", logp, "logp");
  const KLKind k = checked_kl_kind(kind);
  const at::Tensor g = grad.contiguous(), lp = logp.contiguous(), ref = ref_logp.contiguous();
  at::Tensor out = at::empty_like(lp);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, lp.scalar_type(), "kl_penalty_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* gp = g.const_data_ptr<scalar_t>();
    const scalar_t* a = lp.const_data_ptr<scalar_t>();
    const scalar_t* b = ref.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    const acc_t c = value_or_inf<acc_t>(clamp);
    at::parallel_for(0, lp.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        o[i] = scalar_t(acc_t(gp[i]) * kl_grad<acc_t>(k, acc_t(a[i]), acc_t(b[i]), c));
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CPU, m) {
  m.impl("kl_penalty", &kl_penalty_cpu);
  m.impl("kl_penalty_backward", &kl_penalty_backward_cpu);
}

}  // namespace rlk
