// logprobs_from_logits on CPU: rows in parallel; each row is read once in blocks that stay in L1 (transform
// into an fp32 scratch + block max, then the exp sums), merged online. No [N, V] temporary: the forward
// keeps 4 numbers per row (lse in float64, entropy, logp, Σ softmax²), the backward writes the gradient row once.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <algorithm>

#include "logprobs_rows.h"
#include "rlkernels/logprobs_host.h"

namespace rlk {
namespace {

using namespace cpu;

constexpr const char* kOp = "rlkernels::logprobs_from_logits";
// Elements per parallel task: ~256 KiB of fp32 logits, enough to amortize the thread-pool hand-off.
constexpr int64_t kGrainElems = 65536;

int64_t row_grain(int64_t vocab) { return std::max<int64_t>(1, kGrainElems / std::max<int64_t>(vocab, 1)); }

template <typename A, typename In, bool kSoftcap, bool kEntropy, bool kSumSq>
void forward_rows(const at::Tensor& x, const int64_t* labels, int64_t ignore_index, LogitTransform<A> t,
                  A* logp, A* entropy, double* lse, A* sum_sq) {
  const int64_t n = x.size(0), vocab = x.size(1), stride = x.stride(0);
  const In* base = x.const_data_ptr<In>();
  at::parallel_for(0, n, row_grain(vocab), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t y = labels[i];
      if (y == ignore_index) {
        logp[i] = A(0);
        lse[i] = 0.0;
        if (kEntropy) entropy[i] = A(0);
        if (kSumSq) sum_sq[i] = A(0);
        continue;
      }
      A z_y = A(0);
      const SoftmaxStats<A> st =
          row_stats<A, In, kSoftcap, false, kEntropy, kSumSq>(base + i * stride, nullptr, vocab, t, y, &z_y);
      lse[i] = softmax_lse(st);
      logp[i] = logprob_value(z_y, split_lse<A>(lse[i]));
      if (kEntropy) entropy[i] = softmax_entropy(st);
      if (kSumSq) sum_sq[i] = softmax_sum_sq(st);
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> logprobs_from_logits_cpu(
    const at::Tensor& logits, const at::Tensor& labels, double temperature, std::optional<double> softcap,
    int64_t ignore_index, bool return_entropy, bool return_sum_pi_squared) {
  TORCH_CHECK(logits.dim() == 2, kOp, ": logits must be 2-D [N, V], got ", logits.sizes());
  const int64_t n = logits.size(0), vocab = logits.size(1);
  TORCH_CHECK(vocab >= 1, kOp, ": logits must have at least one column");
  check_logprob_labels(kOp, labels, n, vocab, ignore_index);
  check_temperature_softcap(kOp, temperature, softcap);
  const at::ScalarType acc = acc_scalar_type(logits.scalar_type());
  const auto opts = logits.options().dtype(acc);
  at::Tensor logp = at::empty({n}, opts), lse = at::empty({n}, opts.dtype(at::kDouble));
  at::Tensor entropy = at::empty({return_entropy ? n : 0}, opts);
  at::Tensor sum_sq = at::empty({return_sum_pi_squared ? n : 0}, opts);
  if (n == 0) return {logp, entropy, lse, sum_sq};
  const at::Tensor x = logits.stride(1) == 1 ? logits : logits.contiguous();
  const at::Tensor y = labels.to(at::kLong).contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "logprobs_from_logits_cpu", [&] {
    using A = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    const LogitTransform<A> t(temperature, softcap.value_or(0.0));
    dispatch_bool(softcap.has_value(), [&](auto kSoftcap) {
      dispatch_bool(return_entropy, [&](auto kEntropy) {
        dispatch_bool(return_sum_pi_squared, [&](auto kSumSq) {
          forward_rows<A, scalar_t, kSoftcap.value, kEntropy.value, kSumSq.value>(
              x, y.const_data_ptr<int64_t>(), ignore_index, t, logp.mutable_data_ptr<A>(),
              return_entropy ? entropy.mutable_data_ptr<A>() : nullptr, lse.mutable_data_ptr<double>(),
              return_sum_pi_squared ? sum_sq.mutable_data_ptr<A>() : nullptr);
        });
      });
    });
  });
  return {logp, entropy, lse, sum_sq};
}

// grad may be x itself (the in-place form): each row's target logit is read before its row is written.
template <typename A, typename In, bool kSoftcap, bool kEntropy>
void backward_rows(const at::Tensor& x, at::Tensor& grad, const int64_t* labels, int64_t ignore_index,
                   LogitTransform<A> t, const A* g_logp, const A* g_ent, const double* lse, const A* entropy) {
  const int64_t n = x.size(0), vocab = x.size(1), stride = x.stride(0);
  const In* base = x.const_data_ptr<In>();
  In* out = grad.mutable_data_ptr<In>();
  const bool in_place = static_cast<const void*>(base) == static_cast<const void*>(out);
  at::parallel_for(0, n, row_grain(vocab), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      In* grow = out + i * vocab;
      const int64_t y = labels[i];
      if (y == ignore_index) {
        std::fill(grow, grow + vocab, In(0));
        continue;
      }
      const In* row = base + i * stride;
      const A h = kEntropy ? entropy[i] : A(0), ge = kEntropy ? g_ent[i] : A(0);
      const A x_target = A(row[y]);
      const RowLse<A> l = split_lse<A>(lse[i]);
      if (in_place) {
        logit_grad_inplace<A, In, kSoftcap, false, kEntropy>(grow, nullptr, vocab, t, l, h, g_logp[i], ge);
      } else {
        logit_grad_row<A, In, kSoftcap, kEntropy>(row, grow, vocab, t, l, h, g_logp[i], ge);
      }
      grow[y] = In(target_logit_grad<A, kSoftcap>(x_target, t, l, h, g_logp[i], ge));
    }
  });
}

// Checks the backward's arguments and writes d loss / d logits into grad ([N, V] contiguous; logits itself
// for the in-place op).
void logits_backward_into(const char* op, const at::Tensor& grad_logp, const std::optional<at::Tensor>& grad_entropy,
                          const at::Tensor& logits, at::Tensor& grad, const at::Tensor& labels, const at::Tensor& lse,
                          const at::Tensor& entropy, double temperature, std::optional<double> softcap,
                          int64_t ignore_index) {
  const int64_t n = logits.size(0), vocab = logits.size(1);
  check_logprob_labels(op, labels, n, vocab, ignore_index);
  check_temperature_softcap(op, temperature, softcap);
  check_row_vector(op, grad_logp, "grad_logp", n);
  check_row_vector(op, lse, "lse", n);
  const bool with_entropy = grad_entropy.has_value();
  if (with_entropy) {
    check_row_vector(op, *grad_entropy, "grad_entropy", n);
    check_row_vector(op, entropy, "entropy", n);
  }
  if (n == 0) return;
  const at::ScalarType acc = acc_scalar_type(logits.scalar_type());
  const at::Tensor y = labels.to(at::kLong).contiguous();
  const at::Tensor gl = grad_logp.to(acc).contiguous(), l = lse.to(at::kDouble).contiguous();
  const at::Tensor ge = with_entropy ? grad_entropy->to(acc).contiguous() : at::Tensor();
  const at::Tensor h = with_entropy ? entropy.to(acc).contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logits.scalar_type(), "logprobs_from_logits_backward_cpu", [&] {
    using A = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    const LogitTransform<A> t(temperature, softcap.value_or(0.0));
    dispatch_bool(softcap.has_value(), [&](auto kSoftcap) {
      dispatch_bool(with_entropy, [&](auto kEntropy) {
        backward_rows<A, scalar_t, kSoftcap.value, kEntropy.value>(
            logits, grad, y.const_data_ptr<int64_t>(), ignore_index, t, gl.const_data_ptr<A>(),
            with_entropy ? ge.const_data_ptr<A>() : nullptr, l.const_data_ptr<double>(),
            with_entropy ? h.const_data_ptr<A>() : nullptr);
      });
    });
  });
}

at::Tensor logprobs_from_logits_backward_cpu(const at::Tensor& grad_logp, const std::optional<at::Tensor>& grad_entropy,
                                             const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& lse,
                                             const at::Tensor& entropy, double temperature,
                                             std::optional<double> softcap, int64_t ignore_index) {
  constexpr const char* op = "rlkernels::logprobs_from_logits_backward";
  TORCH_CHECK(logits.dim() == 2, op, ": logits must be 2-D [N, V], got ", logits.sizes());
  const at::Tensor x = logits.stride(1) == 1 ? logits : logits.contiguous();
  at::Tensor grad = at::empty(logits.sizes(), logits.options());
  logits_backward_into(op, grad_logp, grad_entropy, x, grad, labels, lse, entropy, temperature, softcap,
                       ignore_index);
  return grad;
}

// logprobs_from_logits_checked (rlkernels/ops/logprobs_checked.py): the labels checked into the fifth output
// instead of raising (bad labels: zero outputs, ok false; the Python API then raises naming the label).
// Its logits: [N, V], or [B, T, V] (the GPU kernels read such a slice in place; here its rows are copied
// together unless they already are, as the CPU kernels take one row stride).
at::Tensor checked_rows(const char* op, const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 || logits.dim() == 3, op, ": logits must be [N, V] or [B, T, V], got ",
              logits.sizes());
  return logits.dim() == 2 ? logits : logits.reshape({-1, logits.size(2)});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> logprobs_from_logits_checked_cpu(
    const at::Tensor& logits_in, const at::Tensor& labels, double temperature, std::optional<double> softcap,
    int64_t ignore_index, bool return_entropy, bool return_sum_pi_squared) {
  const at::Tensor logits = checked_rows(kOp, logits_in);
  const int64_t n = logits.size(0), vocab = logits.size(1);
  check_logprob_label_shape(kOp, labels, n);
  const bool ok = labels_in_range(labels, vocab, ignore_index);
  const at::Tensor flag = at::scalar_tensor(ok, logits.options().dtype(at::kBool));
  if (!ok) {
    const auto opts = logits.options().dtype(acc_scalar_type(logits.scalar_type()));
    return {at::zeros({n}, opts), at::zeros({return_entropy ? n : 0}, opts),
            at::zeros({n}, opts.dtype(at::kDouble)), at::zeros({return_sum_pi_squared ? n : 0}, opts), flag};
  }
  auto [logp, entropy, lse, sum_sq] = logprobs_from_logits_cpu(logits, labels, temperature, softcap, ignore_index,
                                                              return_entropy, return_sum_pi_squared);
  return {logp, entropy, lse, sum_sq, flag};
}

// Its backward: grad_logp None when only the entropy reaches the loss.
at::Tensor logprobs_from_logits_checked_backward_cpu(const std::optional<at::Tensor>& grad_logp,
                                                     const std::optional<at::Tensor>& grad_entropy,
                                                     const at::Tensor& logits, const at::Tensor& labels,
                                                     const at::Tensor& lse, const at::Tensor& entropy,
                                                     double temperature, std::optional<double> softcap,
                                                     int64_t ignore_index) {
  const at::Tensor g = grad_logp.has_value() ? *grad_logp : at::zeros_like(lse, lse.options().dtype(entropy.dtype()));
  const at::Tensor rows = checked_rows("rlkernels::logprobs_from_logits_checked_backward", logits);
  return logprobs_from_logits_backward_cpu(g, grad_entropy, rows, labels, lse, entropy, temperature, softcap,
                                           ignore_index)
      .view(logits.sizes());
}

// The row sweep's form (rlkernels/ops/linear_sweep.py, docs/row_sweep.md): the gradient overwrites the logits
// block, so the sweep holds one [R, V] buffer instead of two.
void logprobs_from_logits_backward_into_logits_cpu(const at::Tensor& grad_logp,
                                                   const std::optional<at::Tensor>& grad_entropy, at::Tensor& logits,
                                                   const at::Tensor& labels, const at::Tensor& lse,
                                                   const at::Tensor& entropy, double temperature,
                                                   std::optional<double> softcap, int64_t ignore_index) {
  constexpr const char* op = "rlkernels::logprobs_from_logits_backward_into_logits";
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous(), op, ": logits must be a contiguous [N, V], got ",
              logits.sizes(), " with strides ", logits.strides());
  logits_backward_into(op, grad_logp, grad_entropy, logits, logits, labels, lse, entropy, temperature, softcap,
                       ignore_index);
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CPU, m) {
  m.impl("logprobs_from_logits", &logprobs_from_logits_cpu);
  m.impl("logprobs_from_logits_backward", &logprobs_from_logits_backward_cpu);
  m.impl("logprobs_from_logits_backward_into_logits", &logprobs_from_logits_backward_into_logits_cpu);
  m.impl("logprobs_from_logits_checked", &logprobs_from_logits_checked_cpu);
  m.impl("logprobs_from_logits_checked_backward", &logprobs_from_logits_checked_backward_cpu);
}

}  // namespace rlk
