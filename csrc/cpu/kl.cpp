// kl_penalty on CPU: one elementwise pass, parallel over chunks of tokens, vectorized per kind.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <type_traits>

#include "rlkernels/kl_host.h"

namespace rlk {
namespace {

// Tokens per parallel task: below it a second thread costs more than it saves once 1 parallel region in 100
// waits out a busy neighbor's scheduler tick (benchmarks/parallel_grain.py, results/parallel_grain.md).
constexpr int64_t kGrain = 131072;

template <typename T, KLKind K>
RLK_CPU_MULTIVERSION void kl_forward_span(const T* __restrict__ logp, const T* __restrict__ ref,
                                          T* __restrict__ out, int64_t n, at::opmath_type<T> clamp) {
  using A = at::opmath_type<T>;
  for (int64_t i = 0; i < n; ++i) out[i] = T(kl_value<A>(K, A(logp[i]), A(ref[i]), clamp));
}

// d logp (kLogp) and its negative, d ref_logp (kRef), of n tokens; grad is read at g_stride (0: one broadcast
// element). The outputs are template flags so that each loop has no branch and vectorizes.
template <typename T, KLKind K, bool kLogp, bool kRef>
RLK_CPU_MULTIVERSION void kl_backward_span(const T* __restrict__ grad, int64_t g_stride, const T* __restrict__ logp,
                                           const T* __restrict__ ref, T* __restrict__ grad_logp,
                                           T* __restrict__ grad_ref, int64_t n, at::opmath_type<T> clamp) {
  using A = at::opmath_type<T>;
  for (int64_t i = 0; i < n; ++i) {
    const A g = A(grad[i * g_stride]) * kl_grad<A>(K, A(logp[i]), A(ref[i]), clamp);
    if constexpr (kLogp) grad_logp[i] = T(g);
    if constexpr (kRef) grad_ref[i] = T(-g);
  }
}

at::Tensor kl_penalty_cpu(const at::Tensor& logp, const at::Tensor& ref_logp, c10::string_view kind,
                          std::optional<double> clamp) {
  check_same_layout("rlkernels::kl_penalty", logp, "logp", ref_logp, "ref_logp");
  const KLKind k = checked_kl_kind(kind);
  const at::Tensor lp = logp.contiguous(), ref = ref_logp.contiguous();
  at::Tensor out = at::empty_like(lp, at::MemoryFormat::Contiguous);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, lp.scalar_type(), "kl_penalty_cpu", [&] {
    const scalar_t* a = lp.const_data_ptr<scalar_t>();
    const scalar_t* b = ref.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    const auto c = value_or_inf<at::opmath_type<scalar_t>>(clamp);
    dispatch_kl_kind(k, [&](auto K) {
      at::parallel_for(0, lp.numel(), kGrain, [&](int64_t begin, int64_t end) {
        kl_forward_span<scalar_t, K.value>(a + begin, b + begin, o + begin, end - begin, c);
      });
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> kl_penalty_backward_cpu(const at::Tensor& grad, const at::Tensor& logp,
                                                           const at::Tensor& ref_logp, c10::string_view kind,
                                                           std::optional<double> clamp, bool logp_grad,
                                                           bool ref_grad) {
  check_same_layout("rlkernels::kl_penalty_backward", logp, "logp", ref_logp, "ref_logp");
  check_same_layout("rlkernels::kl_penalty_backward", grad, "grad", logp, "logp");
  const KLKind k = checked_kl_kind(kind);
  const bool scalar = is_expanded_scalar(grad);
  const at::Tensor g = scalar ? grad : grad.contiguous(), lp = logp.contiguous(), ref = ref_logp.contiguous();
  at::Tensor d_logp = kl_grad_output(lp, logp_grad), d_ref = kl_grad_output(lp, ref_grad);
  if (!logp_grad && !ref_grad) return {d_logp, d_ref};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, lp.scalar_type(), "kl_penalty_backward_cpu", [&] {
    const scalar_t* gp = g.const_data_ptr<scalar_t>();
    const scalar_t* a = lp.const_data_ptr<scalar_t>();
    const scalar_t* b = ref.const_data_ptr<scalar_t>();
    scalar_t* o = logp_grad ? d_logp.mutable_data_ptr<scalar_t>() : nullptr;
    scalar_t* o_ref = ref_grad ? d_ref.mutable_data_ptr<scalar_t>() : nullptr;
    const int64_t gs = scalar ? 0 : 1;
    const auto c = value_or_inf<at::opmath_type<scalar_t>>(clamp);
    dispatch_kl_kind(k, [&](auto K) {
      const auto run = [&](auto kLogp, auto kRef) {
        at::parallel_for(0, lp.numel(), kGrain, [&](int64_t begin, int64_t end) {
          kl_backward_span<scalar_t, K.value, kLogp.value, kRef.value>(
              gp + begin * gs, gs, a + begin, b + begin, kLogp.value ? o + begin : nullptr,
              kRef.value ? o_ref + begin : nullptr, end - begin, c);
        });
      };
      using Yes = std::true_type;
      using No = std::false_type;
      if (logp_grad && ref_grad) {
        run(Yes{}, Yes{});
      } else if (logp_grad) {
        run(Yes{}, No{});
      } else {
        run(No{}, Yes{});
      }
    });
  });
  return {d_logp, d_ref};
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CPU, m) {
  m.impl("kl_penalty", &kl_penalty_cpu);
  m.impl("kl_penalty_backward", &kl_penalty_backward_cpu);
}

}  // namespace rlk
